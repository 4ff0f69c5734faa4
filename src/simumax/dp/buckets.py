"""Megatron's DDP gradient buckets of one model chunk and what each costs on its group.

Dense gradients reduce over DP x CP, expert gradients over the expert-data-parallel group:
an all-reduce without ZeRO; a reduce-scatter, and after the step a parameter all-gather,
with the distributed optimizer (ZeRO-1); ZeRO-2/3 reduce in every backward (their
collectives are ops, graph/sharding.py), so here only HSDP's all-reduce across replicas
and ZeRO-2's one gather per iteration remain.
"""

from __future__ import annotations

from typing import NamedTuple

from simumax.config.strategy import StrategyConfig
from simumax.cost.network import NetworkModel
from simumax.graph.kernels import Collective

MEGATRON_MIN_BUCKET = 40_000_000  # elements (Megatron DDP default bucket)
MAX_MODELLED_BUCKETS = 1024  # per chunk and group; beyond, full buckets are merged (grad_buckets)


class GradBucket(NamedTuple):
    """One bucket (a named tuple: a chunk has up to MAX_MODELLED_BUCKETS, built per estimate)."""

    group: str  # dp or edp
    ready_fraction: float  # share of the chunk's last weight-gradient pass done when it fills
    reduce: float  # seconds: reduce-scatter (ZeRO-1) or all-reduce
    gather: float  # seconds: ZeRO-1 parameter all-gather after the optimizer step


def bucket_key(st: StrategyConfig, network: NetworkModel, params: int, group: str) -> tuple[object, ...]:
    """Everything grad_buckets depends on (a search shares buckets across layouts by it)."""
    groups = network.groups
    return (params, group, st.ddp_bucket_size, st.zero_state, st.fsdp_replicate_size, st.dp_shard_size,
            st.main_grad_bytes, st.dtype_bytes, groups[group], groups["dp_shard"], groups["dp_rep"])


def grad_buckets(st: StrategyConfig, network: NetworkModel, params: int, group: str) -> list[GradBucket]:
    """The buckets of ``params`` gradients reduced over ``group``, in the order they fill."""
    size = network.groups[group].size
    if size <= 1 or params <= 0:
        return []
    bucket = st.ddp_bucket_size or max(MEGATRON_MIN_BUCKET, 1_000_000 * size)
    n_full, rest = divmod(params, bucket)

    hsdp = group == "dp" and st.fsdp_replicate_size > 1
    shard = "dp_shard" if hsdp else group  # HSDP: states shard inside one replica

    def across_replicas(elems: int) -> float:
        """HSDP: each replica's gradient shard all-reduced with the other replicas'."""
        if not hsdp:
            return 0.0
        return network.time(Collective("all_reduce", elems / st.dp_shard_size * st.main_grad_bytes, "dp_rep"))

    def times(elems: int) -> tuple[float, float]:
        if st.zero_state >= 2:  # gradients reduce-scattered in every backward (graph/sharding.py)
            # ZeRO-2 gathers the updated parameters once per iteration; ZeRO-3 per layer, per pass
            gather = network.time(Collective("all_gather", elems * st.dtype_bytes, shard)) if st.zero_state == 2 else 0.0
            return across_replicas(elems), gather
        if st.zero_state >= 1:
            return (network.time(Collective("reduce_scatter", elems * st.main_grad_bytes, shard)) + across_replicas(elems),
                    network.time(Collective("all_gather", elems * st.dtype_bytes, shard)))
        return network.time(Collective("all_reduce", elems * st.main_grad_bytes, group)), 0.0

    full = times(bucket) if n_full else (0.0, 0.0)  # every full bucket costs the same
    # past MAX_MODELLED_BUCKETS, consecutive full buckets are modelled k at a time (k
    # times the cost of one, latencies included): the totals stay exact, the overlap
    # granularity is still under 0.1 % of the chunk, and a model of any size costs the same
    k = -(-n_full // MAX_MODELLED_BUCKETS) if n_full > MAX_MODELLED_BUCKETS else 1
    out = []
    done = 0
    new = tuple.__new__  # a chunk of a large model has hundreds of buckets: the named tuple's __new__ is a Python call
    red, gat = full[0] * k, full[1] * k
    for _ in range(n_full // k):
        done += bucket * k
        out.append(new(GradBucket, (group, done / params, red, gat)))
    if n_full % k:
        done += bucket * (n_full % k)
        out.append(new(GradBucket, (group, done / params, full[0] * (n_full % k), full[1] * (n_full % k))))
    if rest:
        done += rest
        out.append(new(GradBucket, (group, done / params, *times(rest))))
    return out
