"""An estimate's memory result: per pipeline stage, model states plus the worst moment of
its activation walk along the schedule, and where that moment is."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simumax.memory.chunk_walk import op_name_at
from simumax.memory.model_states import model_states
from simumax.report.results import MemResult, StageMemory
from simumax.uncertainty import MEMORY_BAND

if TYPE_CHECKING:
    from simumax.estimate import Estimate

PHASE_NAMES = {"F": "fwd", "B": "bwd", "W": "wgrad"}


def memory_result(est: "Estimate") -> MemResult:
    st = est.strategy
    v = st.chunks_per_rank
    acts = est.activation_walks()
    out = []
    for s, act in zip(est.stages, acts):
        states = model_states(st, s)
        stored = sum(est.chunk_walks[c.vstage].stored for c in est.chunks if c.index == s.index) / v
        t = act.peak_task
        n = act.in_flight_at_peak / v
        op = ""
        if t is not None:
            w = est.chunk_walks[t.vstage]
            op = op_name_at(next(c for c in est.chunks if c.vstage == t.vstage),
                            w.fwd_peak_at if t.kind == "F" else w.bwd_peak_at)
        peak = states.total + act.peak
        out.append(
            StageMemory(
                stage=s.index, layers=len(s.layers), params=s.params, weights=states.weights, grads=states.grads,
                optimizer=states.optimizer, te_buffers=states.te_buffers, model_mem=states.total,
                fwd_activation_cache_per_micro_batch=stored, in_flight_micro_batches=n,
                activation_mem=act.peak, stored_activation_mem=act.stored_peak, peak_mem=peak, peak_mem_with_reserved=peak / st.mem_factor,
                peak_path={
                    "phase": PHASE_NAMES.get(t.kind, "") if t else "",
                    "op": op, "in_flight": float(n), "micro_batch": t.mb if t else None,
                    "vstage": t.vstage if t else None,
                },
            )
        )
    top = max(out, key=lambda x: x.peak_mem)
    cap = float(est.system.mem_bytes)
    return MemResult(
        stages=out, peak_mem=top.peak_mem, peak_mem_with_reserved=top.peak_mem_with_reserved,
        peak_stage=top.stage, capacity=cap, fits=top.peak_mem_with_reserved <= cap and math.isfinite(top.peak_mem),
        peak_mem_interval=MEMORY_BAND.interval(top.peak_mem),
    )
