"""An estimate's memory result: per pipeline stage, model states plus the worst moment of
its activation walk along the schedule, and where that moment is."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simumax.graph.ops import Stage
from simumax.memory.activation_walk import WalkResult
from simumax.memory.chunk_walk import op_name_at, params_after
from simumax.memory.model_states import ModelStates, model_states
from simumax.memory.schedule_walk import RankActivations
from simumax.report.results import MemResult, StageMemory
from simumax.schedule.tasks import BACKWARD
from simumax.uncertainty import MEMORY_BAND

if TYPE_CHECKING:
    from simumax.estimate import Estimate

PHASE_NAMES = {"F": "fwd", "B": "bwd", "W": "wgrad"}
STEP_MOMENT = "fp32 copies of the gradients"  # peak_path op of phase "step" (ModelStates.optimizer_step)
# the walk's worst backward / forward pass, where the states differ between them (ModelStates.backward_*)
BACKWARD_MOMENT, FORWARD_MOMENT = "backward pass", "forward pass"


def backward_states(states: ModelStates, act: RankActivations, stage: Stage, walks: dict[int, WalkResult]) -> float:
    """Bytes the states hold at the walk's worst backward moment beyond the forward's:
    ``backward_extra``, and ``reduce_buffer`` once the weight gradients made before that
    op's backward (its position in its chunk's walk, ``walks`` by virtual stage) exceed
    ``reduce_after`` elements (one chunk per rank: DeepSpeed ZeRO-2)."""
    extra = states.backward_extra
    task = act.bwd_peak_task
    if states.reduce_buffer and task is not None:
        at = walks[task.vstage].bwd_peak_at if task.kind == BACKWARD else -1
        if at < 0 or params_after(stage, at) > states.reduce_after:  # (W: its weight gradients are being made)
            extra += states.reduce_buffer
    return extra


def stage_peak(states: ModelStates, act: RankActivations, stage: Stage,
               walks: dict[int, WalkResult]) -> tuple[float, str]:
    """A rank's peak bytes: its model states plus its activation walk's worst moment, or its
    worst backward pass with the buffers a backward adds to the states (``backward_extra``:
    DeepSpeed's), or, where a sharded implementation's backward buffers outweigh the forward's transients
    (memory/model_states.py ``fsdp2_states``, ``megatron_fsdp_states``), that moment,
    named. By then the output layer's and the loss's saved tensors are gone (the ops after
    the stage's last layers), and ``reduce_frees`` of the rest. Megatron's optimizer step over
    bf16 / fp16 gradients can outweigh both (``optimizer_step``: all bytes held then)."""
    peak, moment = states.total + act.peak, ""
    if states.backward_extra or states.reduce_buffer:
        fwd = states.total + act.fwd_peak
        bwd = states.total + backward_states(states, act, stage, walks) + act.bwd_peak
        peak, moment = (bwd, BACKWARD_MOMENT) if bwd > fwd else (fwd, FORWARD_MOMENT)
    if not (states.reduce_extra or states.end_of_backward or states.optimizer_step):
        return peak, moment
    held = act.stored_peak - sum(o.saved_bytes for o in stage.parts[-1].ops) if stage.parts else act.stored_peak
    for extra, at, what in ((states.reduce_extra,
                             states.total + states.reduce_extra + max(held, 0.0) * (1.0 - states.reduce_frees),
                             "gradient reduce-scatters in flight"),
                            (states.end_of_backward, states.end_of_backward,
                             "end of backward: the last gradients reduced"),
                            (states.optimizer_step, states.optimizer_step, STEP_MOMENT)):
        if extra and at > peak:
            peak, moment = at, what
    return peak, moment


def memory_result(est: "Estimate") -> MemResult:
    st = est.strategy
    v = st.chunks_per_rank
    acts = est.activation_walks()
    out = []
    for s, act in zip(est.stages, acts):
        states = model_states(st, s, est.system.sys_name)
        stored = sum(est.chunk_walks[c.vstage].stored for c in est.chunks if c.index == s.index) / v
        peak, sharded_moment = stage_peak(states, act, s, est.chunk_walks)
        t, n, activations = act.peak_task, act.in_flight_at_peak / v, act.peak
        if sharded_moment in (FORWARD_MOMENT, BACKWARD_MOMENT):  # the pass the states' phase picked
            fwd = sharded_moment == FORWARD_MOMENT
            t = act.fwd_peak_task if fwd else act.bwd_peak_task
            n = (act.fwd_in_flight if fwd else act.bwd_in_flight) / v
            activations = act.fwd_peak if fwd else act.bwd_peak
        weights, grads = states.weights, states.grads
        if sharded_moment == BACKWARD_MOMENT:  # the backward's states
            weights = weights + states.backward_weights
            grads = grads + backward_states(states, act, s, est.chunk_walks) - states.backward_weights
        op = ""
        if t is not None:
            w = est.chunk_walks[t.vstage]
            op = op_name_at(next(c for c in est.chunks if c.vstage == t.vstage),
                            w.fwd_peak_at if t.kind == "F" else w.bwd_peak_at)
        path = {
            "phase": PHASE_NAMES.get(t.kind, "") if t else "",
            "op": op, "in_flight": float(n), "micro_batch": t.mb if t else None,
            "vstage": t.vstage if t else None,
        }
        if sharded_moment == STEP_MOMENT:  # the optimizer step, after the backward: no activations
            path = {"phase": "step", "op": sharded_moment, "in_flight": 0.0, "micro_batch": None, "vstage": None}
        elif sharded_moment not in ("", FORWARD_MOMENT, BACKWARD_MOMENT):
            path = {"phase": "bwd", "op": sharded_moment, "in_flight": float(n),
                    "micro_batch": st.micro_batch_num - 1, "vstage": 0}
        out.append(
            StageMemory(
                stage=s.index, layers=len(s.layers), params=s.params, weights=weights, grads=grads,
                optimizer=states.optimizer, te_buffers=states.te_buffers,
                model_mem=weights + grads + states.optimizer + states.te_buffers,
                fwd_activation_cache_per_micro_batch=stored, in_flight_micro_batches=n,
                activation_mem=activations, stored_activation_mem=act.stored_peak, peak_mem=peak, peak_mem_with_reserved=peak / st.mem_factor,
                peak_path=path,
            )
        )
    top = max(out, key=lambda x: x.peak_mem)
    cap = float(est.system.mem_bytes)
    return MemResult(
        stages=out, peak_mem=top.peak_mem, peak_mem_with_reserved=top.peak_mem_with_reserved,
        peak_stage=top.stage, capacity=cap, fits=top.peak_mem_with_reserved <= cap and math.isfinite(top.peak_mem),
        peak_mem_interval=MEMORY_BAND.interval(top.peak_mem),
    )
