"""How many ranks and nodes a routed token reaches: what a token dispatcher that sends each
token once per destination (DeepEP / HybridEP, Megatron's ``flex`` dispatcher) moves, where
the all-to-all dispatcher sends one copy per routed expert.

Experts sit on the EP ranks in order (``local_experts`` consecutive experts a rank, ranks
consecutive within a node), and routing is taken as balanced, the assumption the rest of
the MoE costs make: a token's top-k experts are k distinct experts drawn uniformly — with
group-limited routing (``moe_router_num_groups`` / ``moe_router_group_topk``, DeepSeek-V3's
node-limited routing) first ``group_topk`` of the groups, then k of their experts.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simumax.config.strategy import StrategyConfig
    from simumax.config.system import AcceleratorConfig

# SMs the flex dispatcher's kernels hold when moe_flex_dispatcher_num_sms is unset:
# megatron-core token_dispatcher.py, set_deepep_num_sms(... else 20)
FLEX_DEFAULT_SMS = 20


def expected_units_hit(units: int, experts: int, topk: int, groups: int = 0, group_topk: int = 0) -> float:
    """Expected number of the ``units`` equal blocks of consecutive experts (EP ranks,
    nodes) holding at least one of a token's ``topk`` experts: the sum over units of
    1 - P(none of its experts chosen), exact under the uniform routing above."""
    if units <= 1:
        return float(units)
    per_unit = experts // units
    if not (groups and group_topk and experts % groups == 0 and group_topk < groups):
        return units * (1.0 - comb(experts - per_unit, topk) / comb(experts, topk))
    per_group = experts // groups
    total = 0.0
    for u in range(units):
        lo, hi = u * per_unit, (u + 1) * per_unit
        overlaps = tuple(min(hi, (g + 1) * per_group) - max(lo, g * per_group)
                         for g in range(lo // per_group, (hi - 1) // per_group + 1))
        total += 1.0 - _miss(overlaps, groups, group_topk, per_group, topk)
    return total


@lru_cache(maxsize=256)
def _miss(overlaps: tuple[int, ...], groups: int, group_topk: int, per_group: int, topk: int) -> float:
    """P(a token picks none of a unit's experts), the unit sharing ``overlaps`` experts with
    each group it touches: over how many of those groups are chosen (i) and how many of the
    unit's experts they bring (s), the chance that k experts drawn from the chosen groups'
    pool miss those s."""
    # ways[i][s]: choices of i of the touched groups bringing s of the unit's experts
    ways = [[0] * (sum(overlaps) + 1) for _ in range(len(overlaps) + 1)]
    ways[0][0] = 1
    for ov in overlaps:
        for i in range(len(overlaps) - 1, -1, -1):
            for s, w in enumerate(ways[i]):
                if w and s + ov < len(ways[i + 1]):
                    ways[i + 1][s + ov] += w
    pool = group_topk * per_group
    others = groups - len(overlaps)
    out = 0.0
    for i, row in enumerate(ways):
        if i > group_topk:
            break
        rest = comb(others, group_topk - i) / comb(groups, group_topk)
        for s, w in enumerate(row):
            if w:
                out += w * rest * comb(pool - s, topk) / comb(pool, topk)
    return out


def ep_compute_usage(st: "StrategyConfig", acc: "AcceleratorConfig", tier_usage: float) -> float:
    """Slowdown of the compute that EP communication overlaps, per second of overlap: the EP
    tier's ``processor_usage`` (NCCL's all-to-all, as ``calibrate-comm`` measures it), or with
    the flex dispatcher what the GEMMs beside its DeepEP / HybridEP kernels lose to the SMs
    those hold for their whole run (``moe_flex_dispatcher_num_sms``, Megatron's 20 by
    default): ``AcceleratorConfig.slowdown_beside`` (measured on the H100: 0.27 at 20 SMs)."""
    if st.moe_dispatcher_policy != "flex" or not acc.sm_count:
        return tier_usage
    return acc.slowdown_beside(st.moe_flex_dispatcher_num_sms or FLEX_DEFAULT_SMS)
