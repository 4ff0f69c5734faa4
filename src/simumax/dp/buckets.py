"""Megatron's DDP gradient buckets of one model chunk and what each costs on its group.

Dense gradients reduce over DP x CP, expert gradients over the expert-data-parallel group:
an all-reduce without ZeRO; a reduce-scatter, and after the step a parameter all-gather,
with the distributed optimizer (ZeRO-1); ZeRO-2/3 reduce in every backward (their
collectives are ops, graph/sharding.py), so here only HSDP's all-reduce across replicas
and ZeRO-2's one gather per iteration remain; FSDP2 under torch's pipelining gathers and
reduces once per step, here.

The layout follows Megatron-Core's ``_ParamAndGradBuffer``: parameters are taken in reverse
order (roughly the order backward makes their gradients: the LM head first, the layers from
the last, the embedding last), a bucket closes as soon as it holds ``bucket_size`` elements,
so a parameter larger than a bucket (a word embedding or LM head of a large vocabulary)
closes one with whatever was pending. A bucket reduces once its last gradient is ready;
``overlap_param_gather`` gathers the buckets in forward order (the embedding's first).
``DistributedDataParallel`` does not bucket (one bucket per buffer) without
``overlap_grad_reduce``, on pipeline ranks after the first and for model chunks after the
first (``disable_bucketing``): their reduces are off the critical path.
"""

from __future__ import annotations

from typing import NamedTuple

from simumax.config.strategy import StrategyConfig
from simumax.cost.network import NetworkModel
from simumax.dp.sharding_plan import ShardingPlan
from simumax.graph.kernels import Collective

MEGATRON_MIN_BUCKET = 40_000_000  # elements (Megatron DDP default bucket)
MAX_MODELLED_BUCKETS = 1024  # per chunk and group; beyond, full buckets are merged (grad_buckets)


class ParamOrder(NamedTuple):
    """A chunk's parameters of one group in the order backward makes their gradients: the
    ops after its layers (final norm, LM head, MTP), its layers, the ops before them
    (embedding). Elements."""

    head: int
    layers: int
    embedding: int

    @property
    def total(self) -> int:
        return self.head + self.layers + self.embedding

    def ready_all(self, positions: list[int], head_share: float, layer_share: float) -> list[float]:
        """The share of the chunk's last weight-gradient pass done when the gradient at each
        position (elements into the reverse order) is ready: the head's after the head's
        backward (``head_share`` of the pass), a layer's pro rata through the layers
        (``layer_share``), the embedding's at the end."""
        h, end = self.head, self.head + self.layers
        per = layer_share / self.layers if self.layers else 0.0
        return [1.0 if p > end else head_share if p <= h else head_share + per * (p - h) for p in positions]


class GradBucket(NamedTuple):
    """One bucket (a named tuple: a chunk has up to MAX_MODELLED_BUCKETS, built per estimate)."""

    group: str  # dp or edp
    position: int  # elements of the chunk's reverse parameter order up to the bucket's last
    reduce: float  # seconds: reduce-scatter (ZeRO-1) or all-reduce
    gather: float  # seconds: ZeRO-1 parameter all-gather after the optimizer step


def _pipelined(st: StrategyConfig) -> bool:
    """``ShardingPlan.pipelined`` (asked per chunk and group: the plan only where it can be)."""
    return st.fsdp_impl == "torch_fsdp2" and ShardingPlan.of(st).pipelined


def bucket_size(st: StrategyConfig, network: NetworkModel, group: str, pp_rank: int, chunk: int) -> int | None:
    """Elements per bucket, None for one bucket (Megatron ``DistributedDataParallel``:
    ``bucket_size`` None without ``overlap_grad_reduce`` and on pipeline ranks > 0,
    ``disable_bucketing`` for model chunks > 0). ZeRO-2/3 keep their buckets; DeepSpeed
    reduces in its ``reduce_bucket_size``."""
    if st.fsdp_impl == "deepspeed":
        return st.ds_reduce_bucket_size
    if _pipelined(st):  # reduced after the last backward (perform_reduce_grad): nothing to overlap
        return None
    if st.zero_state <= 1 and (not st.overlap_grad_reduce or pp_rank > 0 or chunk > 0):
        return None
    return st.ddp_bucket_size or max(MEGATRON_MIN_BUCKET, 1_000_000 * network.groups[group].size)


def bucket_key(st: StrategyConfig, network: NetworkModel, order: ParamOrder, group: str, size: int | None) -> tuple[object, ...]:
    """Everything grad_buckets depends on (a search shares buckets across layouts by it)."""
    groups = network.groups
    return (order, group, size, st.zero_state, _pipelined(st), st.fsdp_replicate_size, st.dp_shard_size,
            st.main_grad_bytes, st.dtype_bytes, groups[group], groups["dp_shard"], groups["dp_rep"])


def fill(order: ParamOrder, size: int | None) -> list[tuple[int, int, int]]:
    """(position of the last element, elements per bucket, buckets) per entry in fill order.
    The head and the embedding are taken whole (one large parameter each), the layers'
    parameters as a continuum (a bucket of them closes at ``size``). Past
    MAX_MODELLED_BUCKETS, consecutive full buckets make one entry of k buckets: the totals
    stay exact and the overlap granularity stays under 0.1 % of the chunk, so a model of
    any size costs the same to estimate."""
    total = order.total
    if size is None or total <= size:
        return [(total, total, 1)] if total else []
    out: list[tuple[int, int, int]] = []
    pos = pending = 0

    def whole(n: int) -> None:  # one parameter: it closes the bucket it fills
        nonlocal pos, pending
        pos += n
        pending += n
        if pending >= size:
            out.append((pos, pending, 1))
            pending = 0

    if order.head:
        whole(order.head)
    n = order.layers
    if n and pending + n >= size:
        first = size - pending
        pos += first
        out.append((pos, size, 1))
        n_full, pending = divmod(n - first, size)
        k = -(-(n_full + 1) // MAX_MODELLED_BUCKETS) if n_full + 1 > MAX_MODELLED_BUCKETS else 1
        for _ in range(n_full // k):
            pos += size * k
            out.append((pos, size, k))
        if n_full % k:
            pos += size * (n_full % k)
            out.append((pos, size, n_full % k))
        pos += pending
    else:
        pos += n
        pending += n
    if order.embedding:
        whole(order.embedding)
    if pending:
        out.append((pos, pending, 1))
    return out


def grad_buckets(st: StrategyConfig, network: NetworkModel, order: ParamOrder, group: str,
                 size: int | None, param_bytes: float | None = None) -> list[GradBucket]:
    """The buckets of ``order``'s gradients reduced over ``group``, in the order they fill;
    ZeRO-1 gathers ``param_bytes`` per parameter (default the training dtype's; with
    ``fp8_param_gather`` the chunk's mean over its fp8 and other parameters)."""
    gathered = st.dtype_bytes if param_bytes is None else param_bytes
    if network.groups[group].size <= 1 or order.total <= 0:
        return []
    plan = ShardingPlan.of(st)
    hsdp = group == "dp" and plan.group == "dp_shard"
    shard = plan.group if group == "dp" else group  # HSDP: dense states shard inside one replica

    def across_replicas(elems: int) -> float:
        """HSDP: each replica's gradient shard all-reduced with the other replicas', once per
        step (FSDP2 does it in every backward: graph/sharding.py)."""
        if not hsdp or plan.replicas_per_micro_batch:
            return 0.0
        return network.time(Collective("all_reduce", elems / st.dp_shard_size * plan.reduce_bytes, "dp_rep"))

    def times(elems: int) -> tuple[float, float]:
        if plan.pipelined:  # once per step: fp32 gradients reduce-scattered, bf16 parameters gathered
            return (network.time(Collective("reduce_scatter", elems * plan.reduce_bytes, shard)) + across_replicas(elems),
                    network.time(Collective("all_gather", elems * st.dtype_bytes, shard)))
        if st.zero_state >= 2:  # gradients reduce-scattered in every backward (graph/sharding.py)
            # ZeRO-2 gathers the updated parameters once per iteration; ZeRO-3 per layer, per pass
            gather = network.time(Collective("all_gather", elems * st.dtype_bytes, shard)) if st.zero_state == 2 else 0.0
            return across_replicas(elems), gather
        if st.zero_state >= 1:
            return (network.time(Collective("reduce_scatter", elems * st.main_grad_bytes, shard)) + across_replicas(elems),
                    network.time(Collective("all_gather", elems * gathered, shard)))
        return network.time(Collective("all_reduce", elems * st.main_grad_bytes, group)), 0.0

    cost: dict[int, tuple[float, float]] = {}  # most buckets are full: one size, costed once
    new = tuple.__new__  # a chunk of a large model has hundreds of buckets: the named tuple's __new__ is a Python call
    out = []
    for pos, elems, k in fill(order, size):
        c = cost.get(elems)
        if c is None:
            c = cost[elems] = times(elems)
        out.append(new(GradBucket, (group, pos, c[0] * k, c[1] * k)))
    return out
