"""1F1B (PipeDream-flush, Megatron's default): task order and closed-form timing.

Rank r of p runs min(p - r - 1, m) warm-up forwards, then one-forward-one-backward,
then cool-down backwards. With per-micro-batch stage times F_r + B_r the last backward on
rank 0 ends at  sum_r (F_r + B_r) + (m - 1) * max_r (F_r + B_r); for uniform stages that
is (m + p - 1)(F + B), a bubble fraction of (p - 1) / (m + p - 1). Interleaving over v
virtual chunks divides the fill/drain part by v (Narayanan et al. 2021).
"""

from __future__ import annotations

from dataclasses import dataclass

from simumax.schedule.tasks import BACKWARD, FORWARD, RankOrders, Task

_new = tuple.__new__  # skips the named tuple's Python-level constructor (millions of tasks)


def order(pp: int, mbc: int, extra_warmup: int = 0) -> RankOrders:
    """``extra_warmup``: forwards run ahead so each steady forward can pair with an
    independent backward (Megatron's combined 1F1B for EP overlap without pipelining)."""
    out = []
    for r in range(pp):
        warm = min(pp - r - 1 + extra_warmup, mbc)
        tasks = [_new(Task, (FORWARD, r, i, False)) for i in range(warm)]
        paired = warm > 0  # steady state: a forward and a backward of different micro-batches (pairable)
        for i in range(mbc - warm):
            tasks.append(_new(Task, (FORWARD, r, warm + i, paired)))
            tasks.append(_new(Task, (BACKWARD, r, i, False)))
        tasks += [_new(Task, (BACKWARD, r, i, False)) for i in range(mbc - warm, mbc)]
        out.append(tasks)
    return out


@dataclass(frozen=True, slots=True)
class PipelineTiming:
    total: float  # first forward on rank 0 to last backward on rank 0
    busy_max: float  # m * max_r (F_r + B_r)
    end_per_rank: tuple[float, ...]  # when each rank finishes its last backward

    @property
    def bubble(self) -> float:
        return self.total - self.busy_max


def pipeline_time(per_stage: list[tuple[float, float]], mbc: int, interleaving: int = 1) -> PipelineTiming:
    """per_stage: (F_r, B_r) per micro-batch (all chunks of the rank), p2p included."""
    totals = [f + b for f, b in per_stage]
    worst = max(totals)
    fill = sum(totals) - worst
    total = mbc * worst + fill / interleaving
    ends = []
    done_before = 0.0
    for f, b in per_stage:
        ends.append(total - done_before)
        done_before += b / interleaving
    return PipelineTiming(total, mbc * worst, tuple(ends))
