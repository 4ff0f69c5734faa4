"""ZB-H1 zero-bubble 1F1B (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

The backward splits into B (input gradient, on the critical path between ranks) and W
(weight gradient, free to move). The order is made by list scheduling with unit pass
times, under 1F1B's memory bound: rank r holds at most p - r micro-batches between F
and B and defers at most p - r - 1 W passes, so the last rank runs F B W and earlier
ranks fill what 1F1B leaves idle with deferred W passes. Priority: a W that is over
the deferral bound, then B, then F (within the bound), then any deferred W.
"""

from __future__ import annotations

from collections import deque

from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT, RankOrders, Task


def order(pp: int, mbc: int) -> RankOrders:
    out: RankOrders = [[] for _ in range(pp)]
    done: dict[tuple[str, int, int], int] = {}  # (kind, rank, mb) -> finish step
    next_f, next_b = [0] * pp, [0] * pp
    deferred: list[deque[int]] = [deque() for _ in range(pp)]
    free_at = [0] * pp
    remaining = 3 * pp * mbc
    t = 0
    while remaining:
        for r in range(pp):
            if free_at[r] > t:
                continue
            i_b, i_f = next_b[r], next_f[r]
            b_src = (FORWARD, r, i_b) if r == pp - 1 else (BACKWARD, r + 1, i_b)
            b_ready = i_b < i_f and done.get(b_src, t + 1) <= t
            f_ready = (
                i_f < mbc and i_f - i_b < pp - r and (r == 0 or done.get((FORWARD, r - 1, i_f), t + 1) <= t)
            )
            if deferred[r] and len(deferred[r]) > pp - r - 1:
                task = Task(WEIGHT, r, deferred[r].popleft())
            elif b_ready:
                task = Task(BACKWARD, r, i_b)
                next_b[r] += 1
                deferred[r].append(i_b)
            elif f_ready:
                task = Task(FORWARD, r, i_f)
                next_f[r] += 1
            elif deferred[r]:
                task = Task(WEIGHT, r, deferred[r].popleft())
            else:
                continue
            out[r].append(task)
            done[(task.kind, r, task.mb)] = t + 1
            free_at[r] = t + 1
            remaining -= 1
        t += 1
    return out
