"""Pipeline schedules: per rank, the ordered passes (tasks) it runs in one iteration.

Each schedule is a small module with an ``order`` function; this registry maps the
strategy's ``pp_schedule`` name to it. Schedules that split the backward into input
and weight gradients (zero bubble, DualPipeV) emit W tasks.
"""

from __future__ import annotations

from typing import Callable

from simumax.config.strategy import StrategyConfig
from simumax.schedule import dualpipev, interleaved, one_f_one_b, zero_bubble
from simumax.schedule.tasks import RankOrders


def _ep_overlap_warmup(st: StrategyConfig) -> int:
    return 1 if st.overlap_moe_expert_parallel_comm else 0


SCHEDULES: dict[str, Callable[[StrategyConfig], RankOrders]] = {
    "1f1b": lambda st: one_f_one_b.order(st.pp_size, st.micro_batch_num, _ep_overlap_warmup(st)),
    "interleaved": lambda st: interleaved.order(
        st.pp_size, st.micro_batch_num, st.interleaving_size, st.microbatch_group_size_per_vp_stage,
        _ep_overlap_warmup(st),
    ),
    "zb": lambda st: zero_bubble.order(st.pp_size, st.micro_batch_num),
    "dualpipev": lambda st: dualpipev.order(st.pp_size, st.micro_batch_num),
}
SPLIT_BACKWARD = frozenset({"zb", "dualpipev"})


def most_warmup_forwards(st: StrategyConfig) -> int:
    """The interleaved schedule's warm-up forwards on rank 0 (its longest warm-up)."""
    return interleaved.warmup_forwards(st.pp_size, 0, st.interleaving_size,
                                       st.microbatch_group_size_per_vp_stage or st.pp_size, _ep_overlap_warmup(st))


def rank_orders(st: StrategyConfig) -> RankOrders:
    return SCHEDULES[st.schedule](st)


def cut_orders(st: StrategyConfig, longer: RankOrders) -> RankOrders | None:
    """The strategy's task order cut from ``longer``, the same schedule's order for more
    micro-batches (interleaved.cut), or None where no cut is offered."""
    if st.schedule != "interleaved":
        return None
    return interleaved.cut(longer, st.pp_size, st.micro_batch_num, st.interleaving_size,
                           st.microbatch_group_size_per_vp_stage, _ep_overlap_warmup(st))


def order_shape(st: StrategyConfig) -> tuple[object, ...]:
    """Everything the task order depends on but the micro-batch count."""
    return st.schedule, st.pp_size, st.interleaving_size, st.microbatch_group_size_per_vp_stage, _ep_overlap_warmup(st)


def order_key(st: StrategyConfig) -> tuple[object, ...]:
    """Everything the task order depends on (strategies with equal keys share one)."""
    return order_shape(st), st.micro_batch_num
