"""How many rows each expert and EP rank of a MoE layer gets (``MoeDims``), and how far the
busiest EP rank's rows lie above the mean when tokens are routed at random.

Each rank routes its own sequence-sharded tokens; with a capacity factor and
``moe_pad_expert_input_to_capacity`` every expert receives exactly ``capacity`` rows from
every source rank; otherwise (dropless) the balanced mean, scaled on the busiest rank by
random routing's spread over the EP ranks and ``moe_load_imbalance`` (the routing's own
skew), capped at capacity when a capacity factor drops tokens.

Even routing that favours no expert (Megatron's ``--moe-router-force-load-balancing``, whose
random logits make each token's top-k a uniformly random set of k distinct experts) gives
the EP ranks unequal rows: each layer's dispatch waits for the rank that received the most,
and its expert GEMMs run the most rows, so a dropless layer runs at the busiest rank's
count, the largest of ``ep`` sums over the routed tokens. For T tokens, each choosing k of E
experts, a rank holding L of them receives per token a hypergeometric count (mean kL/E,
variance k·(L/E)(1 − L/E)(E − k)/(E − 1)); summed over independent tokens the rank's rows are
close to normal, and the largest of ep such ranks lies E[max of ep standard normals] standard
deviations above the mean (ranks taken as independent, though their rows add up to T·k, and
the counts as normal, though they are skewed right: against sampled routing the excess over
the mean comes out 5–10 % small, tests/test_moe_rows.py). With
group-limited routing (``moe_router_num_groups`` / ``moe_router_group_topk``: DeepSeek's
node-limited top-k) a rank inside one group is reached only by the tokens that choose its
group, which makes its count lumpier; a rank spanning several groups is taken as ungrouped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph.dims import Dims
from simumax.graph.kernels import Fanout

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


@dataclass(frozen=True, slots=True)
class MoeDims:
    tokens: int  # tokens this rank routes (sequence-sharded with SP)
    experts: int
    local_experts: int
    topk: int
    ep: int
    etp: int
    ffn: int  # expert hidden per ETP rank
    rows_sent: int  # rows this rank sends in dispatch (all its tokens' copies)
    rows_received: int  # rows arriving at the busiest rank from the EP all-to-all
    rows_per_expert: int  # grouped-GEMM M: rows per local expert after the ETP all-gather
    fanout: Fanout | None = None  # the flex dispatcher's routing (one send per destination: cost/moe_fanout.py)

    @classmethod
    def of(cls, model: ModelConfig, st: StrategyConfig, d: Dims) -> "MoeDims":
        E, k = model.expert_num, model.topk
        ep, etp = st.ep_size, st.etp_size
        t = d.local_tokens
        mean = t * k / E
        cap = math.ceil(mean * model.capacity) if model.capacity else None
        if cap is not None and model.moe_pad_expert_input_to_capacity:
            busiest = balanced = float(cap)
        else:
            # the busiest EP rank's rows: random routing's spread (busiest_rank_factor) times
            # the routing's own skew
            spread = busiest_rank_factor(t * ep * etp, E, E // ep, k, ep, model.moe_router_num_groups or 0,
                                         model.moe_router_group_topk or 0)
            busiest = mean * spread * model.moe_load_imbalance
            balanced = mean
            if cap is not None:
                busiest, balanced = min(busiest, cap), min(balanced, cap)
        return cls(
            tokens=t,
            experts=E,
            local_experts=E // ep,
            topk=k,
            ep=ep,
            etp=etp,
            ffn=model.moe_ffn // etp,
            rows_sent=math.ceil(balanced * E),
            rows_received=math.ceil(busiest * E),
            rows_per_expert=math.ceil(busiest * ep) * etp,
            fanout=(E, k, model.moe_router_num_groups or 0, model.moe_router_group_topk or 0)
            if st.moe_dispatcher_policy == "flex" else None,
        )

    @staticmethod
    def approximate(sends: bool, pad: bool, dispatcher: str, forced: bool = False) -> str:
        """What a routed op's sizes rest on that the configs do not fix (Op.approximate;
        ``sends``: the dispatch or combine op). Without padding to capacity (always so with
        the flex dispatcher) the rows each expert gets are the data's routing, taken as
        uniformly random routing's (busiest_rank_factor) x ``moe_load_imbalance``, and so
        are the all-to-all's volume and the flex dispatcher's fan-out; the all-gather
        dispatcher's collectives move every token, and random logits (``forced``:
        moe_router_force_load_balancing) route uniformly at random, as modelled."""
        if pad or forced or (sends and dispatcher == "all_gather"):
            return ""
        return "moe_routing"

    @property
    def expert_rows(self) -> int:
        """Rows all local experts process together on the busiest rank."""
        return self.rows_per_expert * self.local_experts
