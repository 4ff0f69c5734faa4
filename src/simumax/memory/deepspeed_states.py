"""DeepSpeed ZeRO-1/2/3's model states (bf16 / fp16): what its optimizer
(``runtime/zero/stage_1_and_2.py``, ``stage3.py``) and ZeRO-3's parameter coordinator
(``partitioned_param_coordinator.py``) hold, DeepSpeed 0.19.8. memory/model_states.py
assembles them; docs/modeling.md, "DeepSpeed ZeRO"."""

from __future__ import annotations

from typing import NamedTuple

from simumax.config.strategy import StrategyConfig
from simumax.graph.ops import Stage

FP32 = 4


class DeepSpeedStates(NamedTuple):
    weights: float  # parameter bytes at a forward's peak
    grads: float  # gradient bytes at a forward's peak
    backward_weights: float  # a backward's change of the parameter bytes (stage 3's gathers)
    backward_grads: float  # gradient bytes a backward adds from its first weight gradient
    reduce_buffer: float  # gradient bytes a backward adds at its first reduce (stage 2's partition)


def deepspeed_states(st: StrategyConfig, stage: Stage, shard: float, units: list[int]) -> DeepSpeedStates:
    """The states of DeepSpeed ZeRO-1/2/3 with bf16 (the ZeRO paper's 2 + 2 + 12 bytes per
    parameter, Rajbhandari et al. SC'20 Fig. 1, and its buffers): the parameter and
    gradient bytes held at a forward's peak, and how a backward's differ (``ModelStates``'
    ``backward_weights``: stage 3's gathered parameters, ``deepspeed_gathered``;
    ``backward_grads`` and ``reduce_buffer``: the gradients it adds).

    Gradients (``deepspeed_all_grads``): stage 1 every parameter's, stages 2-3 the rank's
    partition, in the model dtype, plus the reduce bucket(s). Stage 3 allocates its gradient
    partition (``grad_partitions_flat_buffer``) and IPG bucket once, with the optimizer, and
    keeps them (``stage3.py``; only ``offload_states`` frees them). At stages 1-2 none of
    them exists in the first micro-batch's forward: the step frees them (stage 1 the
    parameters' ``.grad``, stage 2 ``averaged_gradients`` / ``grads_in_partition``) and the
    backward allocates them again, the reduce bucket at the first weight gradient, stage 2's
    partition at its first reduce (``copy_grads_in_partition``, once the bucket overflows:
    ``reduce_buffer``, held at the backward's worst moment only where the gradients made by
    then exceed a bucket). Stages 1 and 3 hold the backward's first weight gradient in its
    parameter's ``.grad`` at that moment. A later micro-batch's forward holds what the
    previous backward left: stage 1 every gradient and the bucket, stage 2 the partition (its
    bucket is released after each backward; its later backwards reduce into a second
    partition-sized buffer beside the accumulated one, also at the first reduce).
    Measured phase by phase on DeepSpeed 0.19.8 on CPU (docs/calibration/deepspeed_cpu).
    With the optimizer offloaded (ZeRO-Offload, ``optimizer_cpu_offload``) no gradient
    partition is on the GPU (``partition_on_gpu``) and stages 1-2 keep a transfer buffer
    instead (``offload_buffer``).

    ZeRO-1/2 keep every parameter; ZeRO-3 its partition plus the most it holds gathered
    (``deepspeed_gathered``). ``units``: the parameters of each unit in forward order
    (``model_states.unit_params``)."""
    b = st.dtype_bytes
    bucket = b * _bucket(st)
    weights, bwd_weights = float(stage.params * b), float(stage.params * b)
    if st.zero_state >= 3:
        fwd_gathered, bwd_gathered = deepspeed_gathered(st, units)
        weights, bwd_weights = b * (shard + fwd_gathered), b * (shard + bwd_gathered)
    # stage 2's partition (with one micro-batch), or the partition its later backwards reduce
    # into beside the accumulated one (two partition-sized buffers in them, measured), comes
    # at the first reduce
    at_reduce = b * shard if st.zero_state == 2 and partition_on_gpu(st) else 0.0
    every = deepspeed_all_grads(st, stage, shard)
    transfer = offload_buffer(st, stage)  # ZeRO-Offload's transfer buffer, from the start
    if st.zero_state >= 3:  # allocated with the optimizer and kept
        fwd = bwd = every
    elif st.micro_batch_num == 1:
        fwd, bwd = transfer, transfer + bucket
    else:
        fwd, bwd = every - (bucket if st.zero_state == 2 else 0.0), every
    if st.zero_state == 3 or (st.zero_state == 1 and st.micro_batch_num == 1):
        # the backward's first weight gradient (the last unit's: the output layer's) in its
        # .grad at the peak (stage 2 copies it into its bucket at once; stage 1's later
        # backwards count every gradient already)
        bwd += b * (units[-1] if units else 0)
    return DeepSpeedStates(weights, fwd, bwd_weights - weights, bwd - fwd, at_reduce)


def _bucket(st: StrategyConfig) -> float:
    """Elements of the reduce bucket(s): ``reduce_bucket_size`` allocated whole, whatever
    the model's size (``stage_1_and_2.py::setup_buckets``, ``stage3.py``'s IPG buffer; 5e8
    by default: 1 GB in bf16), two at stages 1-2 with ``overlap_comm`` (one fills while the
    other reduces; stage 3 keeps one)."""
    return st.ds_reduce_bucket_size * (2 if st.ds_overlap and st.zero_state < 3 else 1)


def partition_on_gpu(st: StrategyConfig) -> bool:
    """Whether the rank's gradient partition lives on the GPU: not with the optimizer
    offloaded. ZeRO-3 then allocates ``grad_partitions_flat_buffer`` on the host
    (``stage3.py``: ``self.device`` is the CPU under ``offload_optimizer``); ZeRO-1/2 copy each
    reduced gradient of the partition to the host's fp32 gradients and never build
    ``grads_in_partition`` or the end of the backward's ``averaged_gradients``
    (``stage_1_and_2.py``: ``copy_grads_in_partition`` and the epilogue under ``cpu_offload``)."""
    return not st.optimizer_cpu_offload


def offload_buffer(st: StrategyConfig, stage: Stage) -> float:
    """Bytes of ZeRO-1/2's GPU transfer buffer under ZeRO-Offload: one of the largest
    parameter's size in the model dtype, which gradients pass through to and from the host
    (``stage_1_and_2.py``: ``temp_grad_buffer_for_gpu_offload``, allocated with the optimizer
    and kept; the largest parameter read as the largest op's non-expert parameters: an op's
    experts are one matrix each in DeepSpeed-MoE, each far below the embedding). ZeRO-3 keeps
    none."""
    if not st.optimizer_cpu_offload or st.zero_state >= 3:
        return 0.0
    return float(st.dtype_bytes * max((op.params - op.expert_params for op in stage.ops), default=0))


def deepspeed_all_grads(st: StrategyConfig, stage: Stage, shard: float) -> float:
    """Bytes of DeepSpeed's gradients with all of them allocated: stage 1 every
    parameter's, stages 2-3 the rank's partition where it is on the GPU, in the model dtype
    (``grads_in_partition`` / ``grad_partitions_flat_buffer``), the reduce bucket(s) and
    ZeRO-Offload's transfer buffer."""
    held = stage.params if st.zero_state < 2 else shard * partition_on_gpu(st)
    return st.dtype_bytes * (held + _bucket(st)) + offload_buffer(st, stage)


def deepspeed_gathered(st: StrategyConfig, units: list[int]) -> tuple[float, float]:
    """The most parameters (elements) DeepSpeed ZeRO-3 holds gathered in a forward and in a
    backward
    (``partitioned_param_coordinator.py``), of a stage whose units hold ``units`` parameters
    in forward order: the module being run (at most the largest unit) and what the prefetcher has gathered after it, the next parameters of the
    trace up to ``stage3_prefetch_bucket_size`` elements across as many modules as fit; and
    at the turn from forward to backward, the units kept since their forward — a parameter
    is not released when its next use comes within ``stage3_max_reuse_distance`` elements
    of the trace (``__params_to_release``), and a unit's next use is its backward, after
    the forward and backward of every unit behind it (2 x their parameters) — with the
    prefetch beyond them. On a model of 11.7 M parameters every unit but the embedding was
    still gathered after the forward; at billions of parameters the output layer and
    whatever trailing layers fit in half the distance.

    Each gather fills one flat buffer for its group of parameters and each parameter is
    copied out of it when its module runs (``partition_parameters.py``,
    ``AllGatherCoalescedHandle.wait``: ``param.data = torch.cat(partitions)``); the buffer
    lives until the group's last parameter is copied, so one group's flat buffer, up to the
    prefetch bucket, sits beside the copies (the 11.7 M model, gathered in one group, held
    it twice in its forward). A backward starts from the kept units and the prefetch beyond
    them, and fills a group's buffer only for units not kept (the 11.7 M model, all kept,
    held it once in its backward)."""
    layer = max(units, default=0)
    total = float(sum(units))
    pf = st.ds_prefetch_bucket_size
    kept, behind = 0.0, 0.0
    for n in reversed(units):
        if 2 * behind < st.ds_max_reuse_distance:
            kept += n
        behind += n
    turn = min(total, kept + min(pf, total - kept))
    copies = max(min(total, layer + min(pf, total - layer)), turn)
    return copies + min(pf, total), turn + min(pf, total - kept)


def deepspeed_step(st: StrategyConfig, stage: Stage, shard: float, kept: float, device_share: float) -> float:
    """All bytes DeepSpeed ZeRO holds when it casts the rank's gradient partition for the
    step (``kept``: the optimizer states and workspaces; ``device_share``: the share of the
    optimizer kept on the GPU), bf16 / fp16 gradients accumulated in
    the model dtype (DeepSpeed's default ``grad_accum_dtype``):

    - ``stage_1_and_2.py::step`` first frees the gradients of the parameters outside the
      partition (stage 1's are all there until then) and the backward has released the reduce
      buckets; the partition's gradients (``averaged_gradients``, b bytes per shard element)
      are flattened into a new tensor (b) and cast to fp32 (4): ``self.flatten(...).to(fp32)``;
    - ``stage3.py::_prepare_fp32_grad_for_sub_group`` does the same over the gradient
      partition, beside the parameter partitions and the IPG bucket, which stage 3 keeps.

    The Adam update then runs in place (DeepSpeed's FusedAdam); ZeRO-Offload casts and steps
    the offloaded share on the host, where the partition's gradients already are
    (``partition_on_gpu``), beside stages 1-2's transfer buffer (``offload_buffer``).
    Measured on DeepSpeed 0.19.8 on CPU with an in-place AdamW
    (docs/calibration/deepspeed_cpu/zero_step.jsonl; partition boundaries inside a parameter
    keep that parameter's whole gradient, not modelled)."""
    b = st.dtype_bytes
    params = stage.params if st.zero_state < 3 else shard
    bucket = _bucket(st) if st.zero_state >= 3 else 0
    grads = shard * partition_on_gpu(st)  # offloaded: the partition's gradients are on the host
    return kept + b * (params + grads + bucket) + offload_buffer(st, stage) + (b + FP32) * shard * device_share
