"""Activation memory per rank from the schedule: walk its task list, holding each
(chunk, micro-batch)'s stored activations from its forward to its backward.

A pass's own peak (``WalkResult.fwd_peak`` / ``bwd_peak``: what one micro-batch has live
at the worst moment of that pass) sits on top of what the other in-flight micro-batches
hold. For 1F1B this gives min(p - r, m) micro-batches in flight; for interleaved,
zero-bubble and DualPipeV schedules it follows their real order. A split backward (B
then W) keeps what the weight gradients need (``w_keep``) until W runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simumax.memory.activation_walk import WalkResult
from simumax.schedule.tasks import BACKWARD, FORWARD, Task


@dataclass(slots=True)
class RankActivations:
    peak: float = 0.0  # bytes of activations at the worst moment
    peak_task: Task | None = None
    in_flight_at_peak: int = 0  # (chunk, micro-batch) activations held then, this pass included
    stored_peak: float = 0.0  # most bytes held between passes (stored activations only, no pass transients)
    # the worst moment of a forward pass and of a backward one (peak is the larger), for
    # states that differ between the two (ModelStates.backward_extra)
    fwd_peak: float = 0.0
    fwd_peak_task: Task | None = None
    fwd_in_flight: int = 0
    bwd_peak: float = 0.0
    bwd_peak_task: Task | None = None
    bwd_in_flight: int = 0
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (seconds, bytes), when times given


def walk_schedule(
    order: list[Task],
    walks: dict[int, WalkResult],
    w_keep: dict[int, float] | None = None,
    times: dict[tuple[str, int, int], tuple[float, float]] | None = None,
) -> RankActivations:
    """``walks`` and ``w_keep`` by virtual stage; ``times`` (start, end) by (kind, vstage, mb) adds a timeline."""
    keep = w_keep or {}
    # per virtual stage what a pass reads (locals and tuples: a long schedule has millions of tasks)
    per = {v: (w.fwd_peak, w.stored, w.bwd_peak, keep.get(v, 0.0)) for v, w in walks.items()}
    held = 0.0
    n_held = 0
    peak, peak_task, at_peak, stored_peak = 0.0, None, 0, 0.0
    fwd_peak_seen, fwd_task, fwd_at, bwd_peak_seen, bwd_task, bwd_at = 0.0, None, 0, 0.0, None, 0
    timeline: list[tuple[float, float]] = []
    for t in order:
        kind = t[0]
        fwd_peak, stored, bwd_peak, kept = per[t[1]]
        if kind == FORWARD:
            here, n = held + fwd_peak, n_held + 1
            after, n_after = held + stored, n_held + 1
        elif kind == BACKWARD:
            here, n = held - stored + bwd_peak, n_held
            after, n_after = held - stored + kept, n_held - 1
        else:  # W: the kept inputs and output gradients are read, then freed
            here, n = held, n_held
            after, n_after = held - kept, n_held
        if kind == FORWARD:
            if here > fwd_peak_seen:
                fwd_peak_seen, fwd_task, fwd_at = here, t, n
        elif here > bwd_peak_seen:  # (B and W: the backward's states)
            bwd_peak_seen, bwd_task, bwd_at = here, t, n
        if here > peak:
            peak, peak_task, at_peak = here, t, n
        if times is not None:
            start, end = times[(kind, t[1], t[2])]
            timeline += [(start, held), (start, here), (end, after)]
        held, n_held = after, n_after
        if held > stored_peak:
            stored_peak = held
    return RankActivations(peak, peak_task, at_peak, stored_peak, timeline=timeline, fwd_peak=fwd_peak_seen,
                           fwd_peak_task=fwd_task, fwd_in_flight=fwd_at, bwd_peak=bwd_peak_seen, bwd_peak_task=bwd_task,
                           bwd_in_flight=bwd_at)
