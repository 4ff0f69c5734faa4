"""Weights, gradients, optimizer states and framework buffers of one pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass

from simumax.config.strategy import StrategyConfig
from simumax.graph import fp8
from simumax.graph.ops import Stage

ADAM_STATE_BYTES = 8  # fp32 exp_avg + exp_avg_sq
FP32 = 4


@dataclass(frozen=True, slots=True)
class ModelStates:
    weights: float
    grads: float
    optimizer: float
    te_buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.te_buffers


def optimizer_bytes_per_param(st: StrategyConfig) -> int:
    """fp32 master copy (unless training in fp32) + Adam moments."""
    master = 0 if st.dtype == "fp32" else FP32
    return master + ADAM_STATE_BYTES


def shard_params(st: StrategyConfig, stage: Stage) -> float:
    """Parameters whose optimizer state this rank owns: all of them without the
    distributed optimizer; otherwise dense / (dp * cp) and experts / edp."""
    if st.zero_state < 1:
        return float(stage.params)
    dense = stage.params - stage.expert_params
    return dense / st.dp_shard_size + stage.expert_params / st.edp_size


def device_optimizer_share(st: StrategyConfig) -> float:
    """Share of the optimizer states kept on the GPU (the rest offloaded to the host)."""
    return 1.0 - st.optimizer_offload_fraction if st.optimizer_cpu_offload else 1.0


def fp8_weight_params(stage: Stage) -> int:
    """Parameters of the stage's TE linears run as fp8 / fp4 GEMMs (their low-precision
    weight copies; layers kept in BF16 have none)."""
    return sum(n * sum(o.params for o in ops if fp8.low_precision_linear(o)) for ops, n in stage.groups())


def largest_layer_params(stage: Stage) -> int:
    """Parameters of the stage's largest unit ZeRO-3 gathers at once (graph/sharding.py):
    a transformer layer, the embedding, or the head with its final norm."""
    per: dict[object, int] = {}
    for p in stage.parts:
        if p.layers:  # a run: every layer holds the same parameters
            per[p.layers[0]] = sum(o.params for o in p.ops)
            continue
        for o in p.ops:
            unit = o.layer if o.layer >= 0 else ("embedding" if o.module == "embedding" else "head")
            per[unit] = per.get(unit, 0) + o.params
    return max(per.values(), default=0)


def model_states(st: StrategyConfig, stage: Stage) -> ModelStates:
    """Megatron DDP: bf16 params, main grads (fp32 unless reduced in bf16), optimizer
    sharded over DP (dense) / expert-DP (experts) with the distributed optimizer.

    TransformerEngine >= 2.3 keeps one dummy weight-gradient tensor per distinct linear
    weight shape (returned to autograd because the real gradient goes to main_grad);
    grouped (expert) linears do so from 2.10.
    """
    total = stage.params
    opt = optimizer_bytes_per_param(st) * shard_params(st, stage) * device_optimizer_share(st)
    te = 0.0
    if st.te_at_least("2.3"):
        grouped_too = st.te_at_least("2.10")
        shapes = {s for ops, _ in stage.groups() for o in ops if grouped_too or not o.expert_params for s in o.weight_shapes}
        te = float(sum(n * k for n, k in shapes) * st.dtype_bytes)
    if st.low_precision:  # TE keeps each fp8 / fp4 weight in both layouts (and the recipe's scales) between micro-batches
        te += fp8.weight_copy_bytes_per_param(fp8.recipe(st.lp_recipe)) * fp8_weight_params(stage)
    weights = float(total * st.dtype_bytes)
    grads = float(total * st.main_grad_bytes)
    if st.zero_state >= 2:
        shard = shard_params(st, stage)
        layer = largest_layer_params(stage)
        if st.fsdp_impl == "deepspeed":
            weights, grads = deepspeed_states(st, stage, shard, layer)
        elif st.fsdp_impl == "torch_fsdp2":
            # torchtitan's FSDP2: the sharded parameters are the fp32 originals (the optimizer
            # steps them, no separate master); gathers cast to bf16, gradients reduce in fp32
            weights = FP32 * shard + st.dtype_bytes * 2 * layer
            grads = FP32 * (shard + layer)
            opt = ADAM_STATE_BYTES * shard * device_optimizer_share(st)
        else:
            # Megatron-FSDP: the rank keeps its shard of the main grads plus one layer's
            # unsharded gradients for the reduce-scatter in flight; ZeRO-3 also its shard of
            # the parameters plus the current and the prefetched layer unsharded
            grads = st.main_grad_bytes * (shard + layer)
            if st.zero_state >= 3:
                weights = st.dtype_bytes * (shard + 2 * layer)
    return ModelStates(weights=weights, grads=float(grads), optimizer=float(opt), te_buffers=te)


def deepspeed_states(st: StrategyConfig, stage: Stage, shard: float, layer: int) -> tuple[float, float]:
    """(weights, gradients) of DeepSpeed ZeRO-2/3 with bf16 (the ZeRO paper's 2 + 2 + 12
    bytes per parameter, Rajbhandari et al. SC'20 Fig. 1, and its buffers).

    Gradients: the rank's partition in the model dtype (``grads_in_partition`` /
    ``grad_partitions_flat_buffer``) plus the contiguous reduce bucket(s) the backward
    fills, ``reduce_bucket_size`` elements, two with ``overlap_comm`` (one fills while the
    other reduces). ZeRO-2 keeps every parameter; ZeRO-3 its partition plus the module
    being run and what the prefetcher has gathered ahead (``stage3_prefetch_bucket_size``
    elements, at most the next unit)."""
    b = st.dtype_bytes
    bucket = min(st.ds_reduce_bucket_size, stage.params) * (2 if st.ds_overlap else 1)
    grads = b * (shard + bucket)
    weights = float(stage.params * b)
    if st.zero_state >= 3:
        weights = b * (shard + layer + min(st.ds_prefetch_bucket_size, layer))
    return weights, grads
