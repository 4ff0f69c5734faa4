"""Megatron's optimizer step over one rank's shard, pass by pass, split at the
gradient-norm all-reduce; and the CPU-offloaded share (HybridDeviceOptimizer)."""

from __future__ import annotations

from typing import Callable

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.dp import muon
from simumax.dp.muon import muon_params
from simumax.dp.sharding_plan import ShardingPlan
from simumax.graph import fp8
from simumax.graph.kernels import Kernel, MemBound
from simumax.graph.ops import Stage
from simumax.memory.model_states import (
    FP32,
    device_optimizer_share,
    fp8_weight_params,
    keeps_param_remainders,
    optimizer_bytes_per_param,
    shard_of,
    shard_params,
    stored_param_bytes,
    te_fused_adam_masters,
)


def step_passes(st: StrategyConfig, system: SystemConfig, stage: Stage, cost: Callable[[Kernel], float],
                model: ModelConfig | None = None) -> tuple[float, float]:
    """(before, after) the gradient-norm all-reduce, in seconds, for one rank (bytes/param).

    Before: the DDP buffers' scaling by 1/dp (read and write g per scaled parameter,
    ``prescaled_params``), main grad -> fp32 optimizer grad (g + 4 with bf16 main grads; none with fp32
    ones: Megatron's ``_copy_model_grads_to_main_grads`` sets ``grad = main_grad.float()``,
    which is the same tensor when it is fp32 already), with fp16 the loss scaler's unscale
    (read and write 4 per stepped parameter), the nan/inf check (a norm over the
    rank's whole main-grad buffer, g per local parameter: Megatron's default
    check_for_nan_in_grad runs it per bucket before the reduce; ``check_for_nan_in_grad``
    false skips it), grad norm (4).
    After: clip scale (8), Adam (read grad, master, m, v; write master, m, v:
    4 + 2*12), master -> bf16 param (4 + 2), and zeroing the full main-grad buffer (g);
    under FSDP2 no bucketed nan check and no buffer to zero (``zero_grad`` sets the gradient
    shards to None), and torchtitan's AdamW steps its fp32 parameters with no master copy
    (its "master" bytes in ``states`` are the parameter's own);
    under torch's pipelining FSDP2's once-per-step gradient copy-in (before) and parameter
    copy-out (after); then the host's share when the optimizer is offloaded. With Muon (given ``model``; ``cost``
    prices its Newton-Schulz GEMMs too) Adam steps only the weights Muon does not, and Muon's
    own step over the rest follows (dp/muon.py).

    With TransformerEngine's FusedAdam holding the masters (precision-aware optimizer,
    ``te_fused_adam_masters``) the step reads the main grads as they are (``decoupled_grad``:
    no fp32 copy; norm and clip over g bytes) and writes the model parameter in the Adam
    kernel (no copy pass), reading it too where the master keeps only its remainder bits.

    With ``fp8_param_gather`` the fp8 linears' parameters are written as fp8 (1 B, after an
    amax pass over the master under current scaling), and instead of casting the bf16
    weights TE makes their other layout from the gathered fp8 data."""
    g = st.main_grad_bytes
    states = optimizer_bytes_per_param(st)
    te_adam = te_fused_adam_masters(st)
    full_shard = shard_params(st, stage)
    shard = full_shard * device_optimizer_share(st)  # what the GPU steps itself
    before = [MemBound("ddp.scale_grads", scaled * 2 * g)] if (scaled := prescaled_params(st, stage)) else []
    if g != 4 and not te_adam:
        before.append(MemBound("optimizer.copy_grads", shard * (g + 4)))
    if st.dtype == "fp16":
        # the loss scaler's unscale and inf check over the fp32 main grads the step reads
        # (optimizer.py, _unscale_main_grads_and_check_for_nan: _amp_foreach_non_finite_check_and_unscale_)
        before.append(MemBound("optimizer.unscale", shard * 8))
    step_grad = g if te_adam else 4  # the gradient the norm, clip and Adam read
    if st.check_for_nan_in_grad and not st.fsdp2:  # DDP's per-bucket check (FSDP2 has no buckets)
        before.append(MemBound("optimizer.check_finite", stage.params * g))
    before.append(MemBound("optimizer.grad_norm", shard * step_grad))
    # the parameters as stored (fp8_param_gather: the fp8 linears' one byte; the cast from the
    # fp32 master computes its amax first under current scaling), pro rata on the shard
    r = fp8.recipe(st.lp_recipe) if st.low_precision else None
    fp8_share = fp8_weight_params(stage) / stage.params if st.fp8_param_gather and stage.params else 0.0
    param_bytes = stored_param_bytes(st, shard, shard * fp8_share) + (shard * fp8_share * 4 if r and r.amax_pass else 0.0)
    muon_time, adam_shard = 0.0, shard
    if st.optimizer == "muon" and model is not None:
        # Muon steps the 2-D weights (dp/muon.py), the scalar optimizer the rest
        adam_shard = max(0.0, shard - shard_of(st, *muon_params(stage)))
        param_bytes *= adam_shard / shard if shard else 0.0
        muon_time = muon.step_seconds(model, st, stage, cost, system.host_op_us)
    if te_adam:
        param_io = param_bytes * (2 if keeps_param_remainders(st) else 1)  # written; read too to rebuild the master
        stepped = [MemBound("optimizer.adam", adam_shard * (step_grad + 2 * states) + param_io)]
    elif st.fsdp_impl == "torch_fsdp2":  # torchtitan's AdamW steps the fp32 parameter shards themselves
        stepped = [MemBound("optimizer.adam", adam_shard * (4 + 2 * states))]
    else:
        stepped = [MemBound("optimizer.adam", adam_shard * (4 + 2 * states)),
                   MemBound("optimizer.copy_params", adam_shard * 4 + param_bytes)]
    after = [MemBound("optimizer.clip", shard * 2 * step_grad), *stepped]
    plan = ShardingPlan.of(st)
    if plan.pipelined:
        # FSDP2 under torch's pipelining reduces once per step: each unit's accumulated fp32
        # gradients copied into its reduce-scatter input (foreach_reduce_scatter_copy_in), and
        # gathers once: the all-gather output copied out into the parameters
        # (foreach_all_gather_copy_out), both on the compute stream (graph/sharding.py per micro-batch)
        before.insert(0, MemBound("fsdp_copy_in", stage.params * (FP32 + plan.reduce_bytes)))
        after.append(MemBound("fsdp_copy_out", 2.0 * stage.params * st.dtype_bytes))
    if not st.fsdp2:  # DDP zeroes its gradient buffer; FSDP2's gradients are set to None
        after.append(MemBound("optimizer.zero_grad", stage.params * g))
    if r is not None and st.fp8_param_gather:
        # fp8 weights: the gathered fp8 data gives the other layout (read one, write one with
        # its scales) in the first micro-batch (TE's transpose cache, invalidated by the gather)
        after.append(MemBound("fp8.weight_other_layout",
                              fp8_weight_params(stage) * (2 * r.elem_bytes + r.weight_scale_bytes)))
    elif r is not None and st.fp8_weight_caching:
        # the fp8 weight copies are cast once per iteration (in the first micro-batch's
        # forward, after this step's new weights): counted with the step, per rank
        after.append(MemBound("fp8.cast_weights", fp8.weight_cast_bytes(r, fp8_weight_params(stage), st.dtype_bytes)))
    return sum(map(cost, before)), sum(map(cost, after)) + muon_time + offloaded_step(st, system, full_shard - shard)


def prescaled_params(st: StrategyConfig, stage: Stage) -> int:
    """Local parameters whose DDP gradient buffer is scaled before its reduce, once per
    iteration (megatron/core/distributed/param_and_grad_buffer.py, ``start_grad_sync``:
    ``bucket.grad_data *= bucket.gradient_scaling_factor`` when the factor is not 1). The
    factor is 1/(dp x cp) for every buffer without ``--ddp-average-in-collective``; with it,
    1 for dense buffers and edp / (dp x cp) for expert ones (distributed_data_parallel.py).
    Megatron-FSDP (ZeRO-2/3) and DeepSpeed reduce otherwise: none here."""
    if st.zero_state >= 2 or st.fsdp_impl == "deepspeed":
        return 0
    dp_cp = st.dp_size * st.cp_size
    experts = stage.expert_params
    if not st.ddp_average_in_collective:
        return stage.params if dp_cp > 1 else 0
    return experts if st.edp_size != dp_cp else 0


def offloaded_step(st: StrategyConfig, system: SystemConfig, params: float) -> float:
    """Megatron's CPU-offloaded optimizer share (HybridDeviceOptimizer), serially: fp32
    gradients to the host, Adam there over master, m and v (bound by host memory
    bandwidth: read grad, master, m, v, write master, m, v), bf16 parameters back.
    DeepSpeed's ZeRO-Offload copies each reduced gradient of the partition to the host in the
    backward (``stage_1_and_2.py::async_inplace_copy_grad_to_fp32_buffer_from_gpu``,
    ``stage3.py::partition_grads``, non-blocking): with ``overlap_comm`` on its reduction
    stream, hidden under the backward (Ren et al., ZeRO-Offload, ATC'21, section 4.2); without,
    on the compute stream, in series as here."""
    if params <= 0:
        return 0.0
    link, host = system.host_link_gbps * 1e9, system.host_mem_gbps * 1e9
    d2h = 0.0 if st.fsdp_impl == "deepspeed" and st.ds_overlap else params * 4 / link
    adam = params * (4 + 2 * optimizer_bytes_per_param(st)) / host
    h2d = params * st.dtype_bytes / link
    return d2h + adam + h2d
