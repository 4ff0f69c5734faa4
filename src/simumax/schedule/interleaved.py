"""Megatron's interleaved (virtual pipeline) 1F1B, as forward_backward_pipelining_with_interleaving.

Rank r holds chunks c = 0..v-1 (virtual stage c*p + r). Forward passes follow a table
that walks ``group`` consecutive micro-batches through chunk 0, then the same ones
through chunk 1, ... (``microbatch_group_size_per_vp_stage``, default p); backward
passes follow the same table with chunks reversed. Warm-up is
(p - r - 1) * 2 + (v - 1) * group forwards, then one forward one backward, then cool-down.
"""

from __future__ import annotations

from simumax.schedule.tasks import BACKWARD, FORWARD, RankOrders, Task

_new = tuple.__new__


def schedule_table(mbc: int, v: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) for each virtual micro-batch id, as Megatron's get_schedule_table."""
    table = []
    for lo in range(0, mbc, group):
        hi = mbc if lo + group >= mbc else lo + group
        table += [(mb, c) for c in range(v) for mb in range(lo, hi)]
    return table


def warmup_forwards(pp: int, rank: int, v: int, group: int, extra_warmup: int = 0) -> int:
    """Megatron's num_warmup_microbatches of a rank (before capping at its v x mbc forwards)."""
    return (pp - rank - 1) * 2 + (v - 1) * group + extra_warmup


def order(pp: int, mbc: int, v: int, group: int | None = None, extra_warmup: int = 0) -> RankOrders:
    """``extra_warmup``: one more warm-up forward with EP all-to-all overlap (Megatron
    does so to make each steady forward independent of the backward it pairs with)."""
    group = group or pp
    table = schedule_table(mbc, v, group)
    total = mbc * v
    out = []
    for r in range(pp):
        warm = min(warmup_forwards(pp, r, v, group, extra_warmup), total)
        # each task made once, by tuple.__new__ (skipping the named tuple's Python-level
        # constructor): a long schedule builds millions of tasks
        tasks: list[Task] = []
        add = tasks.append
        for mb, c in table[:warm]:
            add(_new(Task, (FORWARD, c * pp + r, mb, False)))
        for k in range(total - warm):
            mb, c = table[warm + k]
            bmb, bc = table[k]
            # a forward followed by a backward of another micro-batch may pair with it
            add(_new(Task, (FORWARD, c * pp + r, mb, mb != bmb)))
            add(_new(Task, (BACKWARD, (v - 1 - bc) * pp + r, bmb, False)))
        for bmb, bc in table[max(total - warm, 0):]:
            add(_new(Task, (BACKWARD, (v - 1 - bc) * pp + r, bmb, False)))
        out.append(tasks)
    return out


def cut(longer: RankOrders, pp: int, mbc: int, v: int, group: int | None = None, extra_warmup: int = 0) -> RankOrders | None:
    """``order(pp, mbc, ...)`` cut from the order of the same schedule for more
    micro-batches (the steady-state runs ask for three counts one group apart), or None
    where that does not hold. With whole groups the shorter schedule table is a prefix of
    the longer one, so each rank's warm-up and steady pairs are the longer order's first
    tasks; only its cool-down (the last warm-up's worth of backwards) is made."""
    group = group or pp
    total = mbc * v
    if mbc % group:
        return None
    table = schedule_table(mbc, v, group)
    out = []
    for r, lo in enumerate(longer):
        warm = warmup_forwards(pp, r, v, group, extra_warmup)
        if warm >= total or len(lo) <= 2 * total:
            return None  # no steady part (or no longer order): made whole
        head = lo[: warm + 2 * (total - warm)]
        out.append(head + [_new(Task, (BACKWARD, (v - 1 - bc) * pp + r, bmb, False)) for bmb, bc in table[total - warm:]])
    return out
