"""Chrome trace-event JSON of a simulated iteration (opens in Perfetto and chrome://tracing).

One process per pipeline rank; thread 0 is the compute stream (passes, with their ops
nested inside when ``ops`` is on), thread 1 the communication stream (P2P, gradient
reduce, parameter gather); ``merge_lanes`` puts both on one lane. A counter track shows
allocated bytes. Times are in microseconds, as the format requires; args carry SI numbers
(FLOPs, bytes, seconds). Events carry SimuMax's fields too, so its trace tooling reads
them: ``cat`` compute / comm, and args ``stream_type``, ``base_name`` (the op or pass
without its phase), ``direction`` (fwd / bwd / wgrad) and ``call_stack`` (rank / model
chunk / op).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from simumax.cost.stage_time import PhaseTime, StageTime
from simumax.schedule import SPLIT_BACKWARD
from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT

if TYPE_CHECKING:
    from simumax.estimate import Estimate
    from simumax.memory.schedule_walk import RankActivations
    from simumax.simulate.iteration import IterationRun

THREADS = {"compute": 0, "comm": 1}
PASS_NAMES = {FORWARD: "forward", BACKWARD: "backward", WEIGHT: "weight-grad"}
DIRECTIONS = {FORWARD: "fwd", BACKWARD: "bwd", WEIGHT: "wgrad"}


def op_slices(t: StageTime, kind: str, split: bool) -> list[tuple[str, PhaseTime]]:
    """(name, cost) of each op's part of one pass, in execution order: forward in op order;
    backward re-runs checkpointed forwards, then goes through the ops in reverse."""
    out: list[tuple[str, PhaseTime]] = []
    if kind == FORWARD:
        return [(f"{o.name} fwd", ph["fwd"]) for o, ph in t.op_times]
    if kind == BACKWARD:
        out += [(f"{o.name} recompute", ph["recompute"]) for o, ph in t.op_times if o.recompute_group]
        for o, ph in reversed(t.op_times):
            cost = PhaseTime()
            cost.add(ph["bwd_input"])
            if not split:
                cost.add(ph["bwd_weight"])
            out.append((f"{o.name} bwd", cost))
        return out
    return [(f"{o.name} wgrad", ph["bwd_weight"]) for o, ph in reversed(t.op_times) if o.bwd_weight]


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def chrome_trace(
    est: "Estimate", run: "IterationRun", acts: list["RankActivations"], model_states: list[float], ops: bool,
    merge_lanes: bool = False,
) -> dict[str, Any]:
    split = est.strategy.schedule in SPLIT_BACKWARD
    slices = {
        (kind, k): op_slices(t, kind, split)
        for k, t in enumerate(est.chunk_times) for kind in (FORWARD, BACKWARD, WEIGHT)
    } if ops else {}
    ev: list[dict[str, Any]] = []
    for r, events in enumerate(run.events):
        ev.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"pp rank {r}"}})
        ev.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}})
        lanes = {"compute": 0} if merge_lanes else THREADS
        for name, tid in lanes.items():
            ev.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": "streams" if merge_lanes else name}})
        for e in events:
            args: dict[str, Any] = {"seconds": e.end - e.start}
            if e.vstage >= 0:
                args["vstage"] = e.vstage
            if e.mb >= 0:
                args["micro_batch"] = e.mb
            base = PASS_NAMES.get(e.kind, e.name)
            label = f"{base} vstage {e.vstage} mb {e.mb}" if e.kind in PASS_NAMES else e.name
            stream = "compute" if e.stream == "compute" else "comm"
            args.update(kind=e.kind, stream_type=stream, base_name=base, direction=DIRECTIONS.get(e.kind, e.kind),
                        call_stack=f"rank {r}/vstage {e.vstage}/{base}")
            ev.append({
                "name": label, "cat": stream, "ph": "X", "pid": r, "tid": 0 if merge_lanes else THREADS[e.stream],
                "ts": _us(e.start), "dur": _us(e.end - e.start), "args": args,
            })
            parts = slices.get((e.kind, e.vstage)) if e.stream == "compute" else None
            if parts:
                whole = sum(p.total for _, p in parts) or 1.0
                scale = (e.end - e.start) / whole  # paired passes run compressed
                t = e.start
                for name, p in parts:
                    if p.total <= 0:
                        continue
                    d = p.total * scale
                    comm = {f"{g}_comm_s": x for g, x in p.comm.items() if x}
                    op_name, _, phase = name.rpartition(" ")
                    ev.append({
                        "name": name, "cat": "compute", "ph": "X", "pid": r, "tid": 0, "ts": _us(t), "dur": _us(d),
                        "args": {"flops": p.flops, "bytes": p.bytes, "seconds": d, "micro_batch": e.mb, **comm,
                                 "kind": "op", "stream_type": "compute", "base_name": op_name, "direction": phase,
                                 "call_stack": f"rank {r}/vstage {e.vstage}/{op_name}"},
                    })
                    t += d
        for t, b in acts[r].timeline:
            ev.append({"name": "allocated bytes", "ph": "C", "pid": r, "ts": _us(t), "args": {"bytes": model_states[r] + b}})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"generator": "simumax"}}
