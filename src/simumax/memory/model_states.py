"""Weights, gradients, optimizer states and framework buffers of one pipeline stage."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from simumax.config.hardware import datasheet
from simumax.config.strategy import StrategyConfig
from simumax.cost.userbuffers import UB_STREAMS
from simumax.dp.sharding_plan import ShardingPlan
from simumax.graph import fp8
from simumax.graph.kernels import GroupGemm
from simumax.graph.ops import Op, Stage
from simumax.memory.deepspeed_states import deepspeed_all_grads, deepspeed_states, deepspeed_step, partition_on_gpu

ADAM_STATE_BYTES = 8  # fp32 exp_avg + exp_avg_sq
FP32 = 4


@dataclass(frozen=True, slots=True)
class ModelStates:
    weights: float
    grads: float
    optimizer: float
    te_buffers: float
    # FSDP2 (``fsdp2_states``), where its backward can outweigh the forward peak: bytes added
    # to the states while the output layer reduce-scatters (the stored activations still
    # held), and all bytes held at the end of the backward (activations freed; also DeepSpeed
    # ZeRO-1's, with its flat gradient partition, and ZeRO-2's, its last reduce filling the
    # partition); 0: never
    reduce_extra: float = 0.0
    end_of_backward: float = 0.0
    # all bytes held in the optimizer step where it can outweigh both (Megatron's optimizers
    # over bf16 / fp16 gradients: the fp32 copies they step on; DeepSpeed's cast of its
    # gradient partition, ``deepspeed_step``); 0: never
    optimizer_step: float = 0.0
    reduce_frees: float = 0.0  # share of the stored activations backward has freed at that moment
    # how the states at the worst moment of a backward pass differ from the forward's:
    # gradient buffers a sharded optimizer allocates from a backward's first weight gradient
    # and frees in the step, parameters gathered differently (DeepSpeed's reduce buckets and
    # gradient partition, ZeRO-3's gathers: ``deepspeed_states``); 0: the same
    backward_grads: float = 0.0
    backward_weights: float = 0.0
    # a gradient buffer a backward allocates at its first reduce, once more than
    # ``reduce_after`` gradient elements have come (DeepSpeed ZeRO-2's partition): held at
    # the backward's worst moment only where the weight gradients made by then exceed it
    reduce_buffer: float = 0.0
    reduce_after: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.te_buffers

    @property
    def backward_extra(self) -> float:
        return self.backward_grads + self.backward_weights


STATE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}  # per element (fp8 moments' per-tensor scale left out)


def te_fused_adam_masters(st: StrategyConfig) -> bool:
    """TransformerEngine's FusedAdam holds the master parameters and steps on the main
    grads as they are (megatron-core optimizer_config.py,
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``): the precision-aware optimizer,
    unless a low-precision recipe other than delayed scaling with fp32 masters leaves them
    to Megatron (which then copies as without it). With the optimizer offloaded, Megatron's
    HybridDeviceOptimizer holds them instead, as fp32 copies stepped by torch's Adam and
    copied back into the parameters: the step and the bytes of the plain path."""
    if not st.use_precision_aware_optimizer or st.optimizer_cpu_offload:
        return False
    return not (st.low_precision and st.lp_recipe != "delayed" and st.main_params_dtype == "fp32")


def keeps_param_remainders(st: StrategyConfig) -> bool:
    """TE's FusedAdam keeps of each fp32 master only the 16 bits its bf16 parameter lacks
    (``store_param_remainders``: an int16 state, distrib_optimizer.py), rebuilding the
    master from both in the step."""
    return te_fused_adam_masters(st) and st.store_param_remainders and st.dtype == "bf16" and st.main_params_dtype == "fp32"


def master_bytes_per_param(st: StrategyConfig) -> int:
    """The master copy: none when training in fp32; fp32 without the precision-aware
    optimizer; with it, TE's master dtype, or the remainder bits (2 B)."""
    if st.dtype == "fp32":
        return 0
    if not te_fused_adam_masters(st):
        return FP32
    return 2 if keeps_param_remainders(st) else STATE_BYTES[st.main_params_dtype]


def optimizer_bytes_per_param(st: StrategyConfig) -> int:
    """Master copy + Adam moments (fp32 unless the precision-aware optimizer says otherwise);
    with Muon, of the parameters its scalar optimizer steps (Lion keeps one moment)."""
    lion = st.optimizer == "muon" and st.muon_scalar_optimizer == "lion"
    return master_bytes_per_param(st) + STATE_BYTES[st.exp_avg_dtype] + (0 if lion else STATE_BYTES[st.exp_avg_sq_dtype])


def optimizer_state_bytes(st: StrategyConfig, stage: Stage) -> float:
    """The rank's optimizer states: master + Adam moments over its shard; with Muon
    (dp/muon.py) master + one fp32 momentum buffer on its 2-D weights, master + the scalar
    optimizer's moments (Adam two, Lion one) on the rest, sharded as the distributed
    optimizer shards them (Megatron's layer-wise one for the Muon weights: whole weights
    over the same groups)."""
    if st.optimizer != "muon":
        return optimizer_bytes_per_param(st) * shard_params(st, stage)
    from simumax.dp.muon import muon_params  # dp/ builds on this module

    muon, scalar = master_bytes_per_param(st) + FP32, optimizer_bytes_per_param(st)
    dense_m, expert_m = muon_params(stage)
    dense, expert = stage.params - stage.expert_params, stage.expert_params
    return shard_of(st, muon * dense_m + scalar * (dense - dense_m), muon * expert_m + scalar * (expert - expert_m))


def shard_of(st: StrategyConfig, dense: float, expert: float) -> float:
    """This rank's share of dense and expert quantities the optimizer shards: all of them
    without the distributed optimizer; otherwise dense / (dp * cp) and experts / edp."""
    if st.zero_state < 1:
        return float(dense + expert)
    return dense / st.dp_shard_size + expert / st.edp_size


def shard_params(st: StrategyConfig, stage: Stage) -> float:
    """Parameters whose optimizer state this rank owns (``shard_of``)."""
    return shard_of(st, stage.params - stage.expert_params, stage.expert_params)


def device_optimizer_share(st: StrategyConfig) -> float:
    """Share of the optimizer states kept on the GPU (the rest offloaded to the host)."""
    return 1.0 - st.optimizer_offload_fraction if st.optimizer_cpu_offload else 1.0


def fp8_weight_params(stage: Stage, experts: bool | None = None) -> int:
    """Parameters of the stage's TE linears run as fp8 / fp4 GEMMs (their low-precision
    weight copies; layers kept in BF16 have none): all, or only the expert (True) or the
    dense (False) ones."""
    def counted(o: Op) -> int:
        return o.params if experts is None else (o.expert_params if experts else o.params - o.expert_params)
    return sum(n * sum(counted(o) for o in ops if fp8.low_precision_linear(o)) for ops, n in stage.groups())


def stored_param_bytes(st: StrategyConfig, params: float, fp8_params: float) -> float:
    """Bytes of ``params`` model parameters as the rank stores them: the training dtype,
    but the fp8 linears' one byte with ``fp8_param_gather`` (their other layout is TE's
    copy, te_buffers)."""
    if not st.fp8_param_gather:
        return params * st.dtype_bytes
    return (params - fp8_params) * st.dtype_bytes + fp8_params * fp8.recipe(st.lp_recipe).elem_bytes


def unit_params(stage: Stage) -> dict[object, int]:
    """Parameters of each unit ZeRO-3 gathers at once (graph/sharding.py), by unit in
    forward order: a transformer layer (its index), "embedding", or "head" (the output
    layer with its final norm)."""
    per: dict[object, int] = {}
    for p in stage.parts:
        if p.layers:  # a run: every layer holds the same parameters
            per.update(dict.fromkeys(p.layers, sum(o.params for o in p.ops)))
            continue
        for o in p.ops:
            if o.params:  # (ops without parameters, the sharding ops among them, belong to no unit)
                unit = o.layer if o.layer >= 0 else ("embedding" if o.module == "embedding" else "head")
                per[unit] = per.get(unit, 0) + o.params
    return per


def largest_layer_params(stage: Stage) -> int:
    """Parameters of the stage's largest unit."""
    return max(unit_params(stage).values(), default=0)


# TransformerEngine's cuBLAS workspace: 32 MiB + 1 KiB where torch reports compute capability
# >= 9 (Hopper, Blackwell; ROCm's gfx942 reports 9.4), 4 MiB before
# (pytorch/cpp_extensions/gemm.py, get_cublas_workspace_size_bytes)
_CC9_ARCHS = ("hopper", "blackwell", "cdna3")
TE_WORKSPACE_CC9 = 32 * 2**20 + 1024
TE_WORKSPACE_OLDER = 4 * 2**20
TE_GROUPED_GEMM_STREAMS = 4  # tex.get_num_cublas_streams(): the grouped GEMM's cuBLAS streams


def te_gemm_workspaces(st: StrategyConfig, stage: Stage, device: str) -> float:
    """Bytes of the cuBLAS workspaces TransformerEngine allocates through PyTorch's allocator
    at a process's first GEMM of each kind and keeps (``get_cublas_workspace``, lru-cached
    per device and kind): one for its GEMMs, one of three times the size for userbuffers'
    GEMMs (``tp_comm_overlap``), one per cuBLAS stream for grouped GEMMs (expert linears).
    ``device``: the system's name, read for the architecture (an unknown one takes the
    smaller size). PyTorch's own cuBLAS workspace (the output layer's and the router's
    GEMMs) is left out: its size depends on the torch version."""
    if st.transformer_impl != "transformer_engine":
        return 0.0
    sheet = datasheet(device)
    one = TE_WORKSPACE_CC9 if sheet is not None and sheet.arch in _CC9_ARCHS else TE_WORKSPACE_OLDER
    n = 1
    if st.tp_comm_overlap and st.tp_size > 1:
        n += UB_STREAMS  # userbuffers' workspace: one per compute stream of its chunk GEMMs
    if any(isinstance(k, GroupGemm) for ops, _ in stage.groups() for o in ops for k in o.fwd):
        n += TE_GROUPED_GEMM_STREAMS
    return float(n * one)


def model_states(st: StrategyConfig, stage: Stage, device: str) -> ModelStates:
    """Megatron DDP: bf16 params, main grads (fp32 unless reduced in bf16), optimizer
    sharded over DP (dense) / expert-DP (experts) with the distributed optimizer.

    TransformerEngine >= 2.3 keeps one dummy weight-gradient tensor per distinct linear
    weight shape (returned to autograd because the real gradient goes to main_grad: with
    gradient-accumulation fusion only, ``fuse_wgrad_accumulation``);
    grouped (expert) linears do so from 2.10. Every version keeps its cuBLAS workspaces
    (``te_gemm_workspaces``; ``device``: the system's name).
    """
    total = stage.params
    opt = optimizer_state_bytes(st, stage) * device_optimizer_share(st)
    te = te_gemm_workspaces(st, stage, device)
    if st.te_at_least("2.3") and st.gradient_accumulation_fusion:  # (without it the real gradient is returned)
        grouped_too = st.te_at_least("2.10")
        shapes = {s for ops, _ in stage.groups() for o in ops if grouped_too or not o.expert_params for s in o.weight_shapes}
        te += float(sum(n * k for n, k in shapes) * st.dtype_bytes)
    if st.low_precision:  # TE keeps each fp8 / fp4 weight in both layouts (and the recipe's scales) between micro-batches
        r = fp8.recipe(st.lp_recipe)
        # fp8 parameters are the row-wise layout themselves (weights): only the other is TE's
        copies = r.elem_bytes + r.weight_scale_bytes if st.fp8_param_gather else fp8.weight_copy_bytes_per_param(r)
        te += copies * fp8_weight_params(stage)
    weights = float(total * st.dtype_bytes)
    if st.fp8_param_gather:  # (counting the fp8 parameters walks the stage's ops: only then)
        weights = stored_param_bytes(st, total, fp8_weight_params(stage))
    grads = float(total * st.main_grad_bytes)
    if st.fsdp_impl == "deepspeed":  # stages 1-3 (the strategy rules ask zero_state >= 1)
        shard = shard_params(st, stage)
        ds = deepspeed_states(st, stage, shard, list(unit_params(stage).values()))
        weights, grads = ds.weights, ds.grads
    elif st.zero_state >= 2:
        shard = shard_params(st, stage)
        layer = largest_layer_params(stage)
        if st.fsdp_impl == "torch_fsdp2":
            opt = ADAM_STATE_BYTES * shard * device_optimizer_share(st)
            return fsdp2_states(st, stage, shard, opt, te)
        if st.fsdp_impl == "megatron_torch_fsdp2":  # fp32 master + Adam in Megatron's Float16Optimizer
            return fsdp2_states(st, stage, shard, float(opt), te)
        return megatron_fsdp_states(st, stage, shard, layer, float(opt), te)
    states = ModelStates(weights=weights, grads=float(grads), optimizer=float(opt), te_buffers=te)
    if st.fsdp_impl == "deepspeed":
        end = 0.0
        if st.zero_state == 1:
            # at the end of the backward, with every gradient still held, the partition's
            # gradients are copied into a flat buffer of their own (one torch.empty after the
            # last weight gradient, measured: docs/calibration/deepspeed_cpu), which the step
            # then casts (every gradient: states.grads after a first micro-batch)
            end = weights + opt + te + deepspeed_all_grads(st, stage, shard) + st.dtype_bytes * shard * partition_on_gpu(st)
        elif st.zero_state == 2:  # its last reduce, after the last weight gradient, fills the partition
            end = states.total + ds.backward_weights + ds.backward_grads + ds.reduce_buffer
        step = deepspeed_step(st, stage, shard, float(opt) + te, device_optimizer_share(st))
        return replace(states, end_of_backward=end, optimizer_step=step, backward_grads=ds.backward_grads,
                       backward_weights=ds.backward_weights, reduce_buffer=ds.reduce_buffer,
                       reduce_after=float(st.ds_reduce_bucket_size))
    if st.main_grad_bytes != FP32 and not te_fused_adam_masters(st) and st.optimizer != "muon":
        # Megatron's step: an fp32 copy of each bf16 / fp16 main-gradient shard it steps, held
        # until zero_grad (optimizer.py / distrib_optimizer.py, _copy_model_grads_to_main_grads:
        # ``grad = main_grad.float()``, the same tensor only when it is fp32 already)
        return replace(states, optimizer_step=states.total + FP32 * shard_params(st, stage) * device_optimizer_share(st))
    return states


MEGATRON_FSDP_MIN_UNIT = 1_000_000_000  # elements: megatron_fsdp.py's floor on suggested_communication_unit_size


def megatron_fsdp_states(st: StrategyConfig, stage: Stage, shard: float, layer: int, opt: float,
                         te: float) -> ModelStates:
    """Megatron-FSDP (megatron-core 0.19 ``megatron_fsdp``; ``--use-megatron-fsdp``) with its
    default ``suggested_communication_unit_size`` C = max(1e9, 2 x the average unit's
    parameters) elements (``MegatronFSDP.__init__``):

    - the rank's shards of the main gradients (and, ZeRO-3, of the bf16 parameters) persist;
    - ZeRO-3 gathers the unit being run and prefetches up to C / 2 elements ahead
      (``suggested_AG_prefetch_size``), all in bf16;
    - in backward each unit's unsharded gradients (main-grad dtype) are reduce-scattered
      asynchronously and their buffer freed only when the queue of buffers in flight holds
      more than C elements (``GradReducePipeline.wait_for_previous_grad_reduce``): up to C
      plus a unit's unsharded gradients live while the backward has freed the activations
      of the layers behind them (``reduce_extra``, ``reduce_frees``); none at the forward's
      peak."""
    runs = [(sum(o.params for o in p.ops), len(p.layers)) for p in stage.parts if p.layers]  # its FSDP units: the layers
    average = sum(n * k for n, k in runs) // max(sum(k for _, k in runs), 1)
    cap = max(MEGATRON_FSDP_MIN_UNIT, 2 * average)
    params = max(float(stage.params), 1.0)
    weights = float(stage.params * st.dtype_bytes)
    if st.zero_state >= 3:
        weights = st.dtype_bytes * (shard + min(params, layer + cap / 2))
    queued = min(params, cap + layer)
    return ModelStates(weights=weights, grads=float(st.main_grad_bytes * shard), optimizer=opt, te_buffers=te,
                       reduce_extra=st.main_grad_bytes * queued, reduce_frees=queued / params)


class Fsdp2Units(NamedTuple):
    """A stage's FSDP2 units as its ZeRO-3 ops gather them (graph/sharding.py)."""

    kept: float  # bf16 bytes of the units kept gathered from forward to backward (not resharded)
    last: float  # bf16 bytes of the last unit gathered in forward
    last_kept: bool
    prefetched: float  # ... of the unit before it, if gathered again for backward (prefetched then), else 0
    first: float  # ... of the first unit (the embedding: the last reduced in backward)
    second: float  # ... of the unit after it (reduced just before it)
    tied: bool  # the first unit holds a tied output layer: its gradient lives through the backward


def fsdp2_units(stage: Stage) -> Fsdp2Units:
    """From the sharding ops' ``unit_gathered`` / ``unit_regathered`` (graph/sharding.py); a
    tied output layer's head op gathers nothing of its own."""
    kept, gathers, tied = 0.0, [], False
    for ops, n in stage.groups():
        for o in ops:
            if o.module != "fsdp":
                continue
            gathered = o.unit_gathered
            if gathered <= 0:
                tied = tied or o.name == "head.fsdp"
                continue
            if not o.unit_regathered:
                kept += n * gathered
            gathers += [(gathered, not o.unit_regathered)] * min(n, 2)
    if not gathers:
        return Fsdp2Units(0.0, 0.0, True, 0.0, 0.0, 0.0, False)
    second = gathers[1][0] if len(gathers) > 1 else 0.0
    prefetched = gathers[-2][0] if len(gathers) > 1 and not gathers[-2][1] else 0.0
    return Fsdp2Units(kept, gathers[-1][0], gathers[-1][1], prefetched, gathers[0][0], second, tied)


def fsdp2_states(st: StrategyConfig, stage: Stage, shard: float, opt: float, te: float) -> ModelStates:
    """PyTorch FSDP2 (``fully_shard`` per block; torch ``distributed/fsdp/_fully_shard``) as
    torchtitan wraps it (``MixedPrecisionPolicy(bf16, fp32)`` over fp32 parameters) or as
    Megatron-LM's ``--use-torch-fsdp2`` does (``TorchFullyShardedDataParallel``: no policy,
    over the bf16 model, with the fp32 masters in its Float16Optimizer), checked category by
    category against ``fully_shard`` itself wrapped each way (tests/test_fsdp2_torch.py). The
    sharded parameters are p bytes per element (torchtitan's fp32 originals, which the
    optimizer steps; Megatron's bf16 ones), the gradients reduce-scatter and are kept in the
    reduce dtype (fp32; bf16), r times the gathered bf16 bytes. At the end of a micro-batch's
    forward, where activations peak:

    - the parameter shards;
    - gathered bf16 parameters of the units not resharded after forward (torchtitan: the
      final norm + output layer by default; every unit with "never"), plus the
      all-gather output of the last unit gathered, which FSDP2 holds until the next
      all-gather (``AllGatherState``: it keeps the CPU from running ahead of the copy-out);
    - sharded gradients exist only once a backward has reduced into them (the step
      starts with ``zero_grad`` setting them to None): at a later micro-batch's forward
      peak, not at the first's.

    Where the states outweigh the activations the backward holds the peak, at one of two
    moments: the last unit of the forward (the output layer) reduce-scattering its
    gradients — itself resharded by then (FSDP2 reshards before it reduces), its bf16
    gradients, their reduce-scatter input (r x) and its output shard, the unit
    before it prefetched, beside the stored activations (``reduce_extra``,
    over the forward peak's states) — or the first unit's (the embedding's) backward, with
    every shard: its bf16 gradients and reduce-scatter input (1 + r x), or while it runs,
    itself gathered, the previous unit's reduce-scatter input (``ReduceScatterState``,
    freed at the next reduce) and its gradient (three bf16 copies when the output layer
    is tied to it: the two uses' gradients and their sum), and with HSDP after the first
    micro-batch every unit's all-reduced output shard (``end_of_backward``). Megatron's
    optimizer step copies every gradient shard to fp32 before Adam, freeing each bf16 one
    as it goes (optimizer.py, ``_copy_model_grads_to_main_grads``): parameters, masters,
    moments and 4 B per shard element (``optimizer_step``)."""
    plan = ShardingPlan.of(st)
    if plan.pipelined:
        return _pipelined_fsdp2_states(st, stage, shard, opt, te)
    titan = st.fsdp_impl == "torch_fsdp2"
    p = FP32 if titan else st.dtype_bytes
    g = plan.reduce_bytes
    r = g / st.dtype_bytes
    u = fsdp2_units(stage)
    weights = p * shard + u.kept + u.last
    grads = g * shard if st.micro_batch_num > 1 else 0.0
    # at the last unit's reduce it is resharded (its gathered copy and all-gather output gone),
    # its bf16 gradients and their reduce-scatter input live, the unit before it prefetched
    # (the reduce-scatter's output shard is new memory even when it then adds into existing gradients)
    extra = r * u.last + u.prefetched + r * u.last / st.dp_shard_size - (u.last if u.last_kept else 0.0)
    own_shard = 0.0 if grads else r * u.first / st.dp_shard_size  # the first unit's gradient shard, not reduced yet
    during = u.first + (3 if u.tied else 1) * u.first + r * u.second - own_shard
    end = (p + g) * shard + opt + te + max((1 + r) * u.first, during)
    if grads and plan.replicas_per_micro_batch:
        # HSDP adding into existing gradients: every unit's all-reduced output shard is held
        # until the backward ends (FSDPParamGroup._all_reduce_state, cleared in finalize_backward)
        end += g * shard
    step = 0.0 if titan else p * shard + opt + te + FP32 * shard
    return ModelStates(weights=float(weights), grads=float(grads), optimizer=float(opt), te_buffers=te,
                       reduce_extra=extra, end_of_backward=end, optimizer_step=step)


def _pipelined_fsdp2_states(st: StrategyConfig, stage: Stage, shard: float, opt: float, te: float) -> ModelStates:
    """FSDP2 under torch.distributed.pipelining (``ShardingPlan.pipelined``): the
    stage's units stay gathered in bf16 from the step's first forward to its final reduce
    (plus the last all-gather's output, held with no further gather to release it), and
    from the first backward its gradients accumulate unsharded in fp32 (FSDP2 upcasts them
    to the reduce dtype, ``FSDPParam.to_accumulated_grad_if_needed``). After the last
    backward each unit's accumulated gradients are copied into a reduce-scatter input."""
    gathered = st.dtype_bytes * (stage.params + largest_layer_params(stage))
    weights = FP32 * shard + gathered
    grads = float(FP32 * stage.params)
    end = weights + grads + opt + te + FP32 * (largest_layer_params(stage) + shard)
    return ModelStates(weights=float(weights), grads=grads, optimizer=float(opt), te_buffers=te, end_of_backward=end)
