"""Run the event simulation of one estimate and write what a person looks at:
``tracing_logs.json`` (Chrome trace), ``memory_timeline_rank<r>.json``,
``memory_snapshot_rank<r>.pickle`` (PyTorch memory_viz, the peak-memory rank),
``pipeline.png`` (Gantt chart), and SimuMax's ``simu_memory_result.json``,
``simu_memory_snapshot.json`` and ``simu_memory_viz_snapshot.pickle``."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simumax.atomic import write_bytes_atomic, write_json_atomic
from simumax.memory.model_states import model_states
from simumax.memory.result import stage_peak
from simumax.report.gantt import plot_gantt
from simumax.report.memory_trace import memory_snapshot, memory_timeline
from simumax.report.results import SimRank, SimResult
from simumax.report.trace import trace_events, write_chrome_trace

if TYPE_CHECKING:
    from simumax.estimate import Estimate

log = logging.getLogger(__name__)
MAX_OP_EVENTS = 150_000  # above this the trace keeps pass-level events only (file size, speed)


def simulate_to(
    est: "Estimate", out: Path | None, ops: bool | None = None, gantt: bool = True, merge_lanes: bool = False
) -> SimResult:
    """Simulate; with ``out`` write the trace, memory files and Gantt chart there.
    ``ops``: nest per-op events in the trace (default: when they number at most
    MAX_OP_EVENTS)."""
    st = est.strategy
    run = est.simulate()
    acts = est.activation_walks(run)
    states = [model_states(st, s, est.system.sys_name) for s in est.stages]
    state_parts = [
        {"weights": s.weights, "grads": s.grads, "optimizer": s.optimizer, "te_buffers": s.te_buffers} for s in states
    ]
    base = [s.total for s in states]
    ranks = [
        SimRank(
            rank=r, end_of_backward=run.end_of_backward[r], end=run.end[r], busy=run.busy[r],
            bubble_fraction=max(0.0, 1.0 - run.busy[r] / run.end_of_backward[r]) if run.end_of_backward[r] else 0.0,
            peak_mem=stage_peak(states[r], acts[r], est.stages[r], est.chunk_walks)[0],
        )
        for r in range(len(run.end))
    ]
    files: dict[str, str] = {}
    if out is not None:
        if ops is None:
            n_ops = sum(len(t.op_times) for t in est.chunk_times) * 2 * st.micro_batch_num
            ops = n_ops <= MAX_OP_EVENTS
            if not ops:
                log.info("trace: %d op events; writing pass-level events only", n_ops)
        path = out / "tracing_logs.json"
        write_chrome_trace(path, trace_events(est, run, acts, base, ops, merge_lanes))
        files["trace"] = str(path)
        for r in range(len(run.end)):
            p = out / f"memory_timeline_rank{r}.json"
            # the step's fp32 gradient copies (ModelStates.optimizer_step) as a point after the backward
            step = (run.end_of_backward[r], states[r].optimizer_step) if states[r].optimizer_step else None
            write_json_atomic(p, memory_timeline(r, state_parts[r], acts[r], ranks[r].peak_mem, step), compact=True)
            files[f"memory_timeline_rank{r}"] = str(p)
        top = max(range(len(ranks)), key=lambda r: ranks[r].peak_mem)
        snap = memory_snapshot(est, run, top, state_parts[top])
        p = out / f"memory_snapshot_rank{top}.pickle"
        write_bytes_atomic(p, lambda f: pickle.dump(snap, f))
        files["memory_snapshot"] = str(p)
        # SimuMax's names for the same results, which its memory tooling opens
        files.update(_simumax_memory_files(out, ranks, state_parts, acts, top, p, out / f"memory_timeline_rank{top}.json"))
        if gantt:
            p = out / "pipeline.png"
            bubble = max(x.bubble_fraction for x in ranks)
            title = (
                f"{st.schedule}  pp={st.pp_size}  micro-batches={st.micro_batch_num}  "
                f"iteration {run.total * 1e3:.1f} ms  max bubble {bubble:.1%}"
            )
            plot_gantt(run, p, title)
            files["gantt"] = str(p)
    return SimResult(
        schedule=st.schedule, duration_time_per_iter=run.total,
        closed_form_time_per_iter=est.cost().duration_time_per_iter, ranks=ranks, files=files,
    )


def _link(src: Path, dst: Path) -> None:
    """``dst`` the same file as ``src`` (a hard link; a copy where links are refused)."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # no hard links on this filesystem
        shutil.copyfile(src, dst)


def _simumax_memory_files(out: Path, ranks: list[SimRank], parts: list[dict[str, float]], acts: list[Any], top: int,
                          snapshot: Path, top_timeline: Path) -> dict[str, str]:
    """simu_memory_result.json (per-rank peaks and model states, bytes),
    simu_memory_snapshot.json (the peak rank's allocation timeline) and
    simu_memory_viz_snapshot.pickle (the memory_viz snapshot), both linked to our files."""
    result = out / "simu_memory_result.json"
    write_json_atomic(result, {
        "peak_mem": max(r.peak_mem for r in ranks), "peak_rank": top,
        "ranks": [{"rank": r.rank, "peak_mem": r.peak_mem, "peak_activation_mem": acts[r.rank].peak, **parts[r.rank]}
                  for r in ranks],
    })
    timeline = out / "simu_memory_snapshot.json"
    _link(top_timeline, timeline)
    viz = out / "simu_memory_viz_snapshot.pickle"
    _link(snapshot, viz)
    return {"simu_memory_result": str(result), "simu_memory_snapshot": str(timeline), "simu_memory_viz_snapshot": str(viz)}
