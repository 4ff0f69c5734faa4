"""DualPipeV (DeepSeek, the "cut-in-half" DualPipe): a V-shaped bidirectional pipeline.

Rank r holds chunk 0 = virtual stage r (down the ranks) and chunk 1 = virtual stage
2p - 1 - r (back up), so rank 0 holds the embedding and the loss. The per-rank step
sequence follows deepseek-ai/DualPipe ``dualpipev.py``: warm-up forwards of chunk 0,
forward pairs, zero-bubble B/W on chunk 1, the main loop of overlapped
forward+backward pairs of different micro-batches, then backward-only and W-only
drains. Requires m >= 2p micro-batches.
"""

from __future__ import annotations

from collections import deque

from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT, RankOrders, Task


class _Rank:
    def __init__(self, pp: int, rank: int) -> None:
        self.vstage = (rank, 2 * pp - 1 - rank)  # chunk -> virtual stage
        self.next = {(FORWARD, 0): 0, (FORWARD, 1): 0, (BACKWARD, 0): 0, (BACKWARD, 1): 0}
        self.deferred: deque[tuple[int, int]] = deque()  # (vstage, mb) waiting for W
        self.tasks: list[Task] = []

    def _take(self, kind: str, chunk: int) -> tuple[int, int]:
        mb = self.next[(kind, chunk)]
        self.next[(kind, chunk)] += 1
        return self.vstage[chunk], mb

    def forward(self, chunk: int, paired: bool = False) -> None:
        self.tasks.append(Task(FORWARD, *self._take(FORWARD, chunk), paired=paired))

    def backward(self, chunk: int, zb: bool = False) -> None:
        k, mb = self._take(BACKWARD, chunk)
        self.tasks.append(Task(BACKWARD, k, mb))
        if zb:
            self.deferred.append((k, mb))
        else:
            self.tasks.append(Task(WEIGHT, k, mb))  # weight gradients right behind

    def weight(self) -> None:
        k, mb = self.deferred.popleft()
        self.tasks.append(Task(WEIGHT, k, mb))

    def forward_backward(self, f_chunk: int, b_chunk: int) -> None:
        self.forward(f_chunk, paired=True)
        self.backward(b_chunk)


def order(pp: int, mbc: int) -> RankOrders:
    out = []
    for r in range(pp):
        s = _Rank(pp, r)
        last = r == pp - 1
        for _ in range((pp - r - 1) * 2):  # 1: nF0
            s.forward(0)
        for _ in range(r + 1):  # 2: nF0F1
            s.forward(0)
            s.forward(1)
        for _ in range(pp - r - 1):  # 3: nB1W1F1 (zero bubble)
            s.backward(1, zb=True)
            s.weight()
            s.forward(1)
        for i in range(mbc - 2 * pp + r + 1):  # 4: main, nF0B1F1B0
            if i == 0 and last:
                s.forward(0)  # not overlapped, to shrink the bubble
                s.backward(1)
            else:
                s.forward_backward(0, 1)
            s.forward_backward(1, 0)
        for _ in range(pp - r - 1):  # 5: nB1F1B0
            s.backward(1)
            s.forward_backward(1, 0)
        zb = False
        for i in range(r + 1):  # 6: nB1B0, the second half with zero bubble
            if i == (r + 1) // 2 and r % 2 == 1:
                zb = True
            s.backward(1, zb=zb)
            if i == (r + 1) // 2 and r % 2 == 0:
                zb = True
            s.backward(0, zb=zb)
        for _ in range(pp - r - 1):  # 7: nWB0
            s.weight()
            s.backward(0, zb=True)
        while s.deferred:  # 8: nW
            s.weight()
        out.append(s.tasks)
    return out
