"""Memory over time per rank (JSON) and a PyTorch memory_viz snapshot for one rank.

The snapshot follows ``torch.cuda.memory._snapshot()``: ``segments`` hold what is
allocated before the iteration starts (weights, gradients, optimizer states, TE
buffers: blocks ``active_allocated``), ``device_traces[0]`` the activation allocations
and frees of the iteration ('alloc' / 'free_completed' with addr, size, frames,
time_us). Drop the pickle on https://pytorch.org/memory_viz to see the timeline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simumax.schedule.tasks import BACKWARD, FORWARD

if TYPE_CHECKING:
    from simumax.estimate import Estimate
    from simumax.memory.schedule_walk import RankActivations
    from simumax.simulate.iteration import IterationRun


def memory_timeline(rank: int, states: dict[str, float], act: "RankActivations", peak: float,
                    step: tuple[float, float] | None = None) -> dict[str, Any]:
    """A rank's allocated bytes over the iteration: the model states plus its activation walk;
    ``peak`` the rank's peak as the estimate reports it (a sharded implementation's backward
    buffers or the optimizer step can set it: memory/result.py ``stage_peak``), ``step`` the
    optimizer step's (time, bytes) where it holds more than the states."""
    base = sum(states.values())
    points = [[t, base + b] for t, b in act.timeline]
    if step is not None:
        points.append([step[0], step[1]])
    return {
        "rank": rank,
        "units": {"time": "s", "memory": "bytes"},
        "model_states": states,
        "peak_allocated": peak,
        "points": points,
    }


def _frame(name: str) -> list[dict[str, Any]]:
    return [{"filename": "simumax", "line": 0, "name": name}]


def memory_snapshot(est: "Estimate", run: "IterationRun", rank: int, states: dict[str, float]) -> dict[str, Any]:
    segments = []
    addr = 0
    for name, size in states.items():
        n = int(size)
        if n <= 0:
            continue
        block = {"address": addr, "size": n, "requested_size": n, "state": "active_allocated", "frames": _frame(name)}
        segments.append({
            "device": 0, "address": addr, "total_size": n, "allocated_size": n, "active_size": n, "requested_size": n,
            "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0], "is_expandable": False,
            "frames": [], "blocks": [block],
        })
        addr += n
    walks, keep = est.chunk_walks, est.w_keep
    times = run.task_times(rank)
    trace: list[dict[str, Any]] = []
    live: dict[tuple[str, int, int], tuple[int, int]] = {}  # (what, vstage, mb) -> (addr, size)

    def alloc(key: tuple[str, int, int], size: float, at: float, label: str) -> None:
        nonlocal addr
        n = int(size)
        if n <= 0:
            return
        live[key] = (addr, n)
        trace.append({"action": "alloc", "addr": addr, "size": n, "stream": 0, "time_us": at * 1e6, "frames": _frame(label)})
        addr += n

    def free(key: tuple[str, int, int], at: float) -> None:
        if key in live:
            a, n = live.pop(key)
            trace.append({"action": "free_completed", "addr": a, "size": n, "stream": 0, "time_us": at * 1e6, "frames": []})

    for t in run.orders[rank]:
        start, end = times[(t.kind, t.vstage, t.mb)]
        w = walks[t.vstage]
        tag = f"vstage {t.vstage} mb {t.mb}"
        if t.kind == FORWARD:
            alloc(("transient", t.vstage, t.mb), w.fwd_peak - w.stored, start, f"forward transients {tag}")
            alloc(("stored", t.vstage, t.mb), w.stored, start, f"saved activations {tag}")
            free(("transient", t.vstage, t.mb), end)
        elif t.kind == BACKWARD:
            alloc(("transient", t.vstage, t.mb), w.bwd_peak - w.stored, start, f"backward transients {tag}")
            free(("transient", t.vstage, t.mb), end)
            free(("stored", t.vstage, t.mb), end)
            alloc(("wgrad", t.vstage, t.mb), keep.get(t.vstage, 0.0), end, f"kept for weight gradients {tag}")
        else:
            free(("wgrad", t.vstage, t.mb), end)
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}
