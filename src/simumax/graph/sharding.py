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
from simumax.graph.kernels import Collective
from simumax.graph.ops import Op

MODULE = "fsdp"
SYNC_MODULE = "fsdp_sync"  # collectives on the compute stream (exposed)


def sharding_ops(name: str, layer: int, ops: list[Op], st: StrategyConfig, unit: str = "") -> list[Op]:
    """The ZeRO-2/3 collectives of the parameters held by ``ops``: one prefetched op (none
    below ZeRO-2 or without parameters), and for DeepSpeed without ``overlap_comm`` a
    second, exposed one with the gradient reduce, which then runs on the compute stream.
    ``unit``: which FSDP unit they form for the reshard policy (``StrategyConfig.fsdp_unit_reshards``;
    default: ``name`` for the embedding and the head, else a layer)."""
    if st.zero_state < 2 or st.fsdp2_pipelined:  # pipelined FSDP2 gathers and reduces once per step (dp/buckets.py)
        return []
    dense = sum(o.params - o.expert_params for o in ops)
    expert = sum(o.expert_params for o in ops)
    fwd: list[Collective] = []
    bwd_in: list[Collective] = []
    bwd_w: list[Collective] = []
    dense_group = "dp_shard" if st.fsdp_replicate_size > 1 else "dp"  # HSDP: inside one replica
    for params, group in ((dense, dense_group), (expert, "edp")):
        if params <= 0:
            continue
        # torchtitan shards a tied output layer's final norm with the embedding: no gather of its own
        if st.zero_state >= 3 and not (unit == "tied_head" and st.fsdp_impl == "torch_fsdp2"):
            gather = Collective("all_gather", float(params * st.dtype_bytes), group)
            fwd.append(gather)
            if st.fsdp_unit_reshards(unit or (name if name in ("embedding", "head") else "layer")):
                bwd_in.append(gather)  # gathered again for backward (resharded after forward)
        grad_bytes = 4 if st.fsdp_impl == "torch_fsdp2" else st.main_grad_bytes  # FSDP2 reduce_dtype fp32 (torchtitan)
        bwd_w.append(Collective("reduce_scatter", float(params * grad_bytes), group))
    if not bwd_w:
        return []
    out = []
    exposed = st.fsdp_impl == "deepspeed" and not st.ds_overlap
    if fwd or not exposed:
        out.append(Op(name=f"{name}.fsdp", module=MODULE, layer=layer, fwd=tuple(fwd), bwd_input=tuple(bwd_in),
                      bwd_weight=() if exposed else tuple(bwd_w)))
    if exposed:  # DeepSpeed's reduce on the compute stream when its bucket fills (overlap_comm off)
        out.append(Op(name=f"{name}.grad_reduce", module=SYNC_MODULE, layer=layer, bwd_weight=tuple(bwd_w)))
    return out


def with_sharding(name: str, layer: int, ops: list[Op], st: StrategyConfig, unit: str = "") -> list[Op]:
    """``ops`` followed by their sharding op, if any."""
    extra = sharding_ops(name, layer, ops, st, unit)
    return [*ops, *extra] if extra else ops  # the plain list itself: passes without sharding share it
