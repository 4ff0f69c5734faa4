"""ZB-H1 zero-bubble 1F1B (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

The backward splits into B (input gradient, on the critical path between ranks) and W
(weight gradient, free to move). ZB-H1 keeps 1F1B's order of F and B passes (warm-up
p - r - 1 forwards) and lets rank r run each W up to r backward passes late: the last
rank defers most, filling the drain that 1F1B leaves idle, and every rank holds at most
p micro-batches between F and W (the first rank's 1F1B count), so peak memory stays
1F1B's. With F = B = W the iteration takes 3m + p - 1 passes: a bubble of
(p - 1)(F + B - W) instead of 1F1B's (p - 1)(F + B + W).
"""

from __future__ import annotations

from collections import deque

from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT, RankOrders, Task


def order(pp: int, mbc: int) -> RankOrders:
    out = []
    for r in range(pp):
        warm = min(pp - r - 1, mbc)
        tasks = [Task(FORWARD, r, i) for i in range(warm)]
        deferred: deque[int] = deque()

        def backward(i: int) -> None:
            tasks.append(Task(BACKWARD, r, i))
            deferred.append(i)
            while len(deferred) > r:  # rank r runs W at most r backward passes late
                tasks.append(Task(WEIGHT, r, deferred.popleft()))

        for i in range(mbc - warm):
            tasks.append(Task(FORWARD, r, warm + i))
            backward(i)
        for i in range(mbc - warm, mbc):
            backward(i)
        tasks += [Task(WEIGHT, r, i) for i in deferred]
        out.append(tasks)
    return out
