"""How far the busiest EP rank's rows lie above the mean when tokens are routed at random.

Even routing that favours no expert (Megatron's ``--moe-router-force-load-balancing``, whose
random logits make each token's top-k a uniformly random set of k distinct experts) gives
the EP ranks unequal rows: each layer's dispatch waits for the rank that received the most,
and its expert GEMMs run the most rows, so a dropless layer runs at the busiest rank's
count, the largest of ``ep`` sums over the routed tokens. For T tokens, each choosing k of E
experts, a rank holding L of them receives per token a hypergeometric count (mean kL/E,
variance k·(L/E)(1 − L/E)(E − k)/(E − 1)); summed over independent tokens the rank's rows are
close to normal, and the largest of ep such ranks lies E[max of ep standard normals] standard
deviations above the mean (ranks taken as independent: they are slightly negatively
correlated, as their rows add up to T·k, so this is a little high for ep = 2). With
group-limited routing (``moe_router_num_groups`` / ``moe_router_group_topk``: DeepSeek's
node-limited top-k) a rank inside one group is reached only by the tokens that choose its
group, which makes its count lumpier; a rank spanning several groups is taken as ungrouped.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

_STEPS = 1600  # Simpson panels over [-9, 9]: E[max] to ~1e-9 for any n up to 1e6
_NORMAL = NormalDist()


@lru_cache(maxsize=128)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] = ∫ x · n φ(x) Φ(x)^(n − 1) dx (0 for n = 1;
    0.5642 for 2, 1.4236 for 8, 2.3437 for 64)."""
    if n <= 1:
        return 0.0
    a, b = -9.0, 9.0
    h = (b - a) / _STEPS
    total = 0.0
    for i in range(_STEPS + 1):
        x = a + i * h
        w = 1 if i in (0, _STEPS) else (4 if i % 2 else 2)
        total += w * x * n * _NORMAL.pdf(x) * _NORMAL.cdf(x) ** (n - 1)
    return total * h / 3


def _per_token_moments(experts: int, local: int, topk: int, groups: int, group_topk: int) -> tuple[float, float]:
    """(mean, variance) of how many of a token's top-k experts lie on one rank of ``local``
    consecutive experts, under uniformly random (group-limited) routing."""

    def hyper(pool: int) -> tuple[float, float]:
        p = local / pool
        return topk * p, topk * p * (1 - p) * (pool - topk) / max(1, pool - 1)

    per_group = experts // groups if groups else 0
    if groups and group_topk and group_topk < groups and experts % groups == 0 and per_group % local == 0:
        q = group_topk / groups  # the rank's group is among the chosen ones
        m, v = hyper(group_topk * per_group)
        return q * m, q * (v + m * m) - (q * m) ** 2
    return hyper(experts)


def busiest_rank_factor(tokens: int, experts: int, local: int, topk: int, ep: int, groups: int = 0,
                        group_topk: int = 0) -> float:
    """Expected rows of the busiest of ``ep`` ranks over the mean, ``tokens`` tokens routed into
    the EP group (every source rank's), each rank holding ``local`` of ``experts``."""
    if ep <= 1 or local >= experts or tokens <= 0:
        return 1.0
    m, v = _per_token_moments(experts, local, topk, groups, group_topk)
    if m <= 0:
        return 1.0
    return 1.0 + math.sqrt(tokens * v) * expected_max_normal(ep) / (tokens * m)
