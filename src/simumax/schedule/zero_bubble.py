"""ZB-H1 zero-bubble 1F1B (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

The backward splits into B (input gradient, on the critical path between ranks) and W
(weight gradient, free to move). The order is made by list scheduling with unit pass
times: rank r holds at most p - r micro-batches between F and B (1F1B's activation
bound) and at most p micro-batches between F and W (the first rank's 1F1B count, as
ZB-H1 keeps peak memory at 1F1B's); W passes fill what would otherwise be idle.
Priority: B, then a W the bound forces, then F, then any deferred W. With F = B = W
this gives 3m + (p - 1) for small m (the paper's ZB-H1) and stays below 1F1B's
3(m + p - 1) beyond; an exact ZB-H1 (or ZB-H2) table can be added as its own module.
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
            if b_ready:
                task = Task(BACKWARD, r, i_b)
                next_b[r] += 1
                deferred[r].append(i_b)
            elif deferred[r] and len(deferred[r]) + (i_f - i_b) >= pp:
                task = Task(WEIGHT, r, deferred[r].popleft())
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
