"""Sharded data parallelism as an IR pass: the per-layer collectives of ZeRO-2 / ZeRO-3
(Megatron-FSDP, ``--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads`` /
``optim_grads_params``; the ZeRO paper's stages 2 and 3).

With gradients sharded (ZeRO-2, 3) a rank cannot keep the full gradient of its layers
across micro-batches: every micro-batch's backward reduce-scatters each layer's gradient
into the rank's shard (the main-grad dtype). With parameters sharded too (ZeRO-3) each
layer's parameters are all-gathered before its forward and again before its backward
(resharded after forward, FSDP's default). One op per layer (and one for the embedding,
the head and the MTP block) carries them, after the layer's own ops: its collectives run
on the data-parallel stream, prefetched, so LayerProfiles hides them under the compute of
the ops they belong with (cost exposed only where the collective is longer), slowing that
compute by the tier's ``processor_usage``. Dense parameters shard over DP x CP, expert
parameters over the expert-data-parallel group. Per step (one micro-batch) ZeRO-3 moves
3x the parameter bytes (two gathers, one reduce-scatter) where ZeRO-1 moves 2x once per
iteration (docs/modeling.md)."""

from __future__ import annotations

from simumax.config.strategy import StrategyConfig
from simumax.dp.sharding_plan import ShardingPlan
from simumax.graph.kernels import Collective, Kernel, MemBound
from simumax.graph.ops import Op

MODULE = "fsdp"
SYNC_MODULE = "fsdp_sync"  # collectives on the compute stream (exposed)


def sharding_ops(name: str, layer: int, ops: list[Op], st: StrategyConfig, unit: str = "") -> list[Op]:
    """The ZeRO-2/3 collectives of the parameters held by ``ops``: one prefetched op (none
    below ZeRO-2 or without parameters), and for DeepSpeed without ``overlap_comm`` a
    second, exposed one with the gradient reduce, which then runs on the compute stream.
    ``unit``: which FSDP unit they form for the reshard policy (``ShardingPlan.reshards``;
    default: ``name`` for the embedding and the head, else a layer)."""
    if st.zero_state < 2:  # (asked per layer: the plan only where it can matter)
        return []
    plan = ShardingPlan.of(st)
    if not plan.per_micro_batch:  # pipelined FSDP2: once per step (dp/buckets.py)
        return []
    unit = unit or (name if name in ("embedding", "head") else "layer")
    dense = sum(o.params - o.expert_params for o in ops)
    expert = sum(o.expert_params for o in ops)
    fwd: list[Kernel] = []
    bwd_in: list[Kernel] = []
    bwd_w: list[Kernel] = []
    for params, group in ((dense, plan.group), (expert, "edp")):  # HSDP: dense inside one replica
        if params <= 0:
            continue
        # torchtitan shards a tied output layer's final norm with the embedding: no gather of its own
        if plan.gathers and not (unit == "tied_head" and plan.impl == "torch_fsdp2"):
            gather: tuple[Kernel, ...] = (Collective("all_gather", float(params * st.dtype_bytes), group),)
            if plan.fsdp2:
                # FSDP2 copies the gathered buffer out into each parameter on the compute stream
                # (_fsdp_collectives.py::foreach_all_gather_copy_out, split_with_sizes_copy)
                gather += (MemBound("fsdp_copy_out", 2.0 * params * st.dtype_bytes),)  # no layer: layers share it
            fwd.extend(gather)
            if plan.reshards(unit):
                bwd_in.extend(gather)  # gathered again for backward (resharded after forward)
        if plan.fsdp2:
            # FSDP2 copies the unsharded gradients into the reduce-scatter input (in the reduce
            # dtype) on the compute stream before the reduce-scatter stream may start
            # (_fsdp_collectives.py::foreach_reduce, foreach_reduce_scatter_copy_in: chunk_cat)
            bwd_w.append(MemBound("fsdp_copy_in", float(params * (st.dtype_bytes + plan.reduce_bytes))))
        bwd_w.append(Collective("reduce_scatter", float(params * plan.reduce_bytes), group))
        if plan.replicas_per_micro_batch and group == plan.group == "dp_shard":  # HSDP: the shard across replicas
            bwd_w.append(Collective("all_reduce", float(params / st.dp_shard_size * plan.reduce_bytes), "dp_rep"))
    if not bwd_w:
        return []
    out = []
    exposed = plan.reduce_on_compute_stream
    if fwd or not exposed:
        # FSDP2's unit: what it gathers (the activation walk holds it through the backward)
        unit_bytes = sum(k.bytes for k in fwd if isinstance(k, Collective)) if plan.fsdp2 else 0.0
        out.append(Op(name=f"{name}.fsdp", module=MODULE, layer=layer, fwd=tuple(fwd), bwd_input=tuple(bwd_in),
                      bwd_weight=() if exposed else tuple(bwd_w), unit_gathered=unit_bytes,
                      unit_regathered=bool(bwd_in)))
    if exposed:  # DeepSpeed's reduce on the compute stream when its bucket fills (overlap_comm off)
        out.append(Op(name=f"{name}.grad_reduce", module=SYNC_MODULE, layer=layer, bwd_weight=tuple(bwd_w)))
    return out


def with_sharding(name: str, layer: int, ops: list[Op], st: StrategyConfig, unit: str = "") -> list[Op]:
    """``ops`` followed by their sharding op, if any."""
    extra = sharding_ops(name, layer, ops, st, unit)
    return [*ops, *extra] if extra else ops  # the plain list itself: passes without sharding share it
