"""What a schedule produces: per pipeline rank, the ordered compute tasks it runs.

A task is one pass of one micro-batch through one virtual stage (model chunk):
``F`` forward, ``B`` backward (input and weight gradients, unless the schedule splits
them), ``W`` weight gradients split off a zero-bubble backward. ``paired`` marks a forward
that may run together with the next task, a backward of another micro-batch (steady
1F1B, DualPipe's overlapped chunks); the engine overlaps such pairs only with
``overlap_moe_expert_parallel_comm``.
"""

from __future__ import annotations

from typing import NamedTuple

FORWARD, BACKWARD, WEIGHT = "F", "B", "W"


class Task(NamedTuple):
    """A tuple (cheap to build: a long schedule has millions)."""

    kind: str  # F, B or W
    vstage: int  # virtual stage, forward order of the model
    mb: int  # micro-batch
    paired: bool = False  # runs with the next task on this rank (overlapped F&B)


RankOrders = list[list[Task]]  # [rank][position]


def check_complete(orders: RankOrders, n_vstages: int, mbc: int, split_backward: bool) -> None:
    """Every (vstage, micro-batch) has exactly one F and one B (and one W if split)."""
    kinds = (FORWARD, BACKWARD, WEIGHT) if split_backward else (FORWARD, BACKWARD)
    seen = sorted((t.kind, t.vstage, t.mb) for o in orders for t in o)
    want = sorted((k, v, m) for k in kinds for v in range(n_vstages) for m in range(mbc))
    if seen != want:
        raise AssertionError("schedule does not run every pass exactly once")
