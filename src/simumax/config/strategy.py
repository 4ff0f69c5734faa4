"""Parallel/training strategy config (SimuMax ``strategy/*.json`` format)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, PositiveInt, ValidationInfo, field_validator, model_validator

from simumax.compat.config_methods import SimuMaxStrategyMethods
from simumax.config.base import DEFER_RULES
from simumax.config.simumax_fields import strategy_input
from simumax.config.strategy_batch_parallel import BatchAndParallelFields
from simumax.config.strategy_derived import StrategyDerived
from simumax.config.strategy_rules import check_rules
from simumax.errors import ConfigError

MEGATRON_RECOMPUTE_MODULES = ("core_attn", "mlp", "layernorm", "moe_act", "moe", "shared_experts", "mla_up_proj",
                              "gdn_norm_out")
# Megatron --offload-modules (fine-grained activation offloading; graph/offload.py maps them to ops)
ACTIVATION_OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
# attn_only / mlp_only / sdp_only: SimuMax's sub-block granularities (graph/recompute.py)
OptimizerStateDtype = Literal["fp32", "fp16", "bf16", "fp8"]  # Megatron's --exp-avg(-sq)-dtype choices
RecomputeGranularity = Literal["full_block", "selective_recompute", "attn_only", "mlp_only", "sdp_only"]
PipelineSchedule = Literal["1f1b", "interleaved", "zb", "dualpipev"]
FsdpImpl = Literal["megatron_fsdp", "torch_fsdp2", "megatron_torch_fsdp2", "deepspeed"]
FSDP_IMPLS: tuple[str, ...] = get_args(FsdpImpl)


class StrategyConfig(StrategyDerived, SimuMaxStrategyMethods, BatchAndParallelFields):
    """How one training iteration is laid out on ``world_size`` accelerators.

    Rank order is Megatron's tp-cp-ep-dp-pp (tp fastest). ``dp`` is derived:
    world_size / (tp * cp * pp).
    """

    # optimizer / precision
    zero_state: int = Field(
        1, ge=0, le=3, description="0: plain DDP all-reduce; 1: distributed optimizer (ZeRO-1); 2: gradients sharded too, "
        "reduce-scattered every micro-batch; 3: parameters too, all-gathered per layer (Megatron-FSDP optim_grads / "
        "optim_grads_params).",
    )
    optimizer_cpu_offload: bool = Field(
        False, description="Megatron --optimizer-cpu-offload: the offloaded share of the optimizer states lives in host "
        "memory; its step runs on the CPU after the gradients come over the host link and the parameters go back.",
    )
    optimizer_offload_fraction: float = Field(
        1.0, gt=0, le=1, description="Megatron --optimizer-offload-fraction: share of the optimizer offloaded."
    )
    optimizer: Literal["adam", "muon"] = Field(
        "adam", description="Megatron --optimizer: adam, or muon (2-D weights orthogonalised by Newton-Schulz, one "
        "momentum state; the rest stepped by muon_scalar_optimizer; with zero_state 1 Megatron's layer-wise "
        "distributed optimizer: dp/muon.py).",
    )
    muon_num_ns_steps: PositiveInt = Field(5, le=50, description="Megatron --muon-num-ns-steps: Newton-Schulz iterations.")
    muon_split_qkv: bool = Field(True, description="Megatron --muon-no-split-qkv turns it off: q, k, v orthogonalised apart.")
    muon_scalar_optimizer: Literal["adam", "lion"] = Field(
        "adam", description="Megatron --muon-scalar-optimizer: for embeddings, output layer, norms and biases (Lion: one moment).",
    )
    use_precision_aware_optimizer: bool = Field(
        False, description="Megatron --use-precision-aware-optimizer (distributed optimizer): TransformerEngine's "
        "FusedAdam keeps the master parameters and Adam moments in the dtypes below, reads the main gradients as they "
        "are and writes the model parameters inside its kernel.",
    )
    main_params_dtype: Literal["fp32", "fp16"] = Field(
        "fp32", description="Master parameters (Megatron --main-params-dtype; precision-aware optimizer only).")
    exp_avg_dtype: OptimizerStateDtype = Field(
        "fp32", description="Adam's first moment (Megatron --exp-avg-dtype; precision-aware optimizer only).")
    exp_avg_sq_dtype: OptimizerStateDtype = Field(
        "fp32", description="Adam's second moment (Megatron --exp-avg-sq-dtype; precision-aware optimizer only).")
    store_param_remainders: bool = Field(
        True, description="Precision-aware optimizer, bf16 training, fp32 master: the master keeps only the 16 bits "
        "the bf16 parameter lacks (Megatron's default, TransformerEngine >= 2.1; older Megatron-LM: --no-store-param-remainders).",
    )
    fsdp_impl: FsdpImpl = Field(
        "megatron_fsdp", description="The sharded data-parallel implementation. megatron_fsdp (zero_state 2/3): bf16 "
        "parameters, fp32 main grads and master copy; torch_fsdp2 (zero_state 3, torchtitan): fp32 sharded parameters, "
        "no separate master, bf16 gathers, fp32 reduce-scatters; megatron_torch_fsdp2 (zero_state 3, --use-torch-fsdp2): "
        "bf16 shards, gathers and reduce-scatters, fp32 masters in Megatron's Float16Optimizer; deepspeed (zero_state "
        "1-3, ZeRO with bf16): bf16 gradients, reduced every micro-batch from stage 2 in ds_reduce_bucket_size buckets.",
    )
    fsdp_reshard_after_forward: Literal["default", "always", "never"] = Field(
        "default", description="FSDP2: torchtitan's parallelism.fsdp_reshard_after_forward. always: every unit "
        "(layer, embedding, final norm + output layer) frees its gathered parameters after its forward and gathers "
        "them again for backward; never: all stay gathered until backward; default: the layers and the embedding "
        "reshard, the final norm + output layer unit does not. With pp_size > 1 (torch's pipelining) units are "
        "gathered once per step and reduced after the last backward (default or never; always is refused). Megatron's "
        "wrapper: default and always reshard every unit, never is --torch-fsdp2-no-reshard-after-forward.",
    )
    ds_overlap_comm: bool | None = Field(
        None, description="DeepSpeed zero_optimization.overlap_comm: gradient reduces overlap the backward (two reduce "
        "buckets); null: DeepSpeed's default, true at stage 3, false below.",
    )
    ds_reduce_bucket_size: PositiveInt = Field(
        500_000_000, le=10**12, description="DeepSpeed zero_optimization.reduce_bucket_size, elements (default 5e8).",
    )
    ds_prefetch_bucket_size: PositiveInt = Field(
        50_000_000, le=10**12, description="DeepSpeed stage3_prefetch_bucket_size, elements gathered ahead (default 5e7).",
    )
    ds_max_reuse_distance: PositiveInt = Field(
        1_000_000_000, le=10**12, description="DeepSpeed stage3_max_reuse_distance, elements: a parameter used again "
        "within it stays gathered (default 1e9).",
    )
    fsdp_replicate_size: PositiveInt = Field(
        1, le=65536, description="HSDP: the data-parallel ranks (x CP) split into this many replicas; optimizer states, "
        "and with ZeRO-2/3 gradients and parameters, shard inside a replica, and the replicas all-reduce their "
        "gradient shards once per iteration (Megatron --num-distributed-optimizer-instances).",
    )
    use_fp32_accum_grad: bool = Field(True, description="fp32 main gradients (--accumulate-allreduce-grads-in-fp32).")
    grad_reduce_in_bf16: bool = Field(False, description="Reduce gradients in bf16 (main grads 2 B instead of 4 B).")
    ddp_bucket_size: PositiveInt | None = Field(
        None, description="DDP bucket in elements; default max(40M, 1M * dp) as Megatron."
    )
    ddp_average_in_collective: bool = Field(
        False, description="Megatron --ddp-average-in-collective: the DP collective averages. Without it (Megatron's "
        "default) DDP scales each gradient buffer by 1/dp before its reduce, one pass over the buffer per iteration.",
    )
    check_for_nan_in_grad: bool = Field(
        True, description="Megatron checks the gradients for NaN/Inf before reducing them (a pass over the main-grad "
        "buffer each step; --no-check-for-nan-in-loss-and-grad turns it off).",
    )
    gradient_accumulation_fusion: bool = Field(
        True, description="Megatron's gradient-accumulation fusion (on by default; --no-gradient-accumulation-fusion "
        "turns it off): weight-gradient GEMMs accumulate into the main grad. Off: each writes the gradient in the "
        "parameter dtype and DDP's hook adds it to the main grad (main_grad.add_(grad)), every micro-batch.",
    )
    # kernels
    enable_dropout: bool = Field(False, description="Attention/hidden dropout on (saves masks).")
    use_fused_norm: bool = Field(True, description="Fused (TE/Apex) norm kernels.")
    use_math_sdp: bool = Field(False, description="Unfused attention that materialises softmax probabilities.")
    use_flash_sdp: bool = Field(True, description="Flash attention.")
    use_fused_swiglu: bool = Field(True, description="Fused bias-SwiGLU kernel (--bias-swiglu-fusion).")
    cross_entropy_loss_fusion: bool = Field(False, description="Fused vocab-parallel cross-entropy (Megatron --cross-entropy-loss-fusion).")
    cross_entropy_fusion_impl: Literal["te", "native"] = Field(
        "te", description="With cross_entropy_loss_fusion, Megatron --cross-entropy-fusion-impl: TransformerEngine's "
        "kernel (te), or Megatron-Core's three compiled functions (native, Megatron's default when the flag is absent).",
    )
    transformer_impl: Literal["transformer_engine", "local"] = Field(
        "transformer_engine",
        description="Megatron --transformer-impl: TransformerEngine modules, or Megatron-Core's local spec "
        "(unfused attention with softmax probabilities, unfused RoPE; use_flash_sdp is then ignored).",
    )
    masked_softmax_fusion: bool = Field(
        True, description="Unfused attention: fused scale-mask-softmax kernel (bf16 probs) instead of torch softmax in fp32."
    )
    dsa_kernel_backend: Literal["none", "tilelang", "cudnn"] = Field(
        "none", description="DeepSeek sparse attention's kernels (Megatron --dsa-kernel-backend): tilelang (the fused "
        "indexer and SparseMLA kernels, modelled); none (its default: dense fp32 reference path) and cudnn are not.")
    te_version: str | None = Field(None, description="TransformerEngine version, e.g. '2.11.0' (memory buffers).")
    # recompute
    enable_recompute: bool = Field(False, description="Master switch for the recompute fields below.")
    recompute_granularity: RecomputeGranularity | None = Field(
        None, description="full_block: whole layers; selective_recompute: the *_recompute flags; attn_only / mlp_only: "
        "the attention / MLP sub-block; sdp_only: core attention.",
    )
    recompute_layer_num: int | None = Field(
        None, ge=0, description="Layers per stage (counted from the first) that recompute; null means all. Absent with "
        "full_block / attn_only / mlp_only: 0, SimuMax's default (no layer).",
    )
    recompute_method: Literal["block", "uniform"] = Field(
        "block", description="full_block only (Megatron --recompute-method). block: the first recompute_layer_num layers "
        "of each model chunk recompute, one checkpoint per layer (SimuMax's meaning). uniform: every layer recomputes, "
        "checkpointed in groups of recompute_layer_num consecutive layers (null: 1): only each group's input is kept, "
        "and backward re-runs a whole group before its last layer's backward.",
    )
    attn_recompute: bool = Field(False, description="Selective: recompute core attention.")
    mla_rms_recompute: bool = Field(False, description="Selective: recompute MLA q/kv norms.")
    mlp_recompute: bool = Field(False, description="Selective: recompute the MLP activation function.")
    mlp_rms_recompute: bool = Field(False, description="Selective: recompute the pre-MLP norm.")
    recompute_variance: bool = Field(False, description="Selective: norms keep no fp32 rstd; it is recomputed.")
    megatron_recompute: bool = Field(False, description="Megatron >= 0.14 --recompute-modules semantics.")
    megatron_recompute_modules: list[str] = Field(
        default_factory=list, description=f"Subset of {MEGATRON_RECOMPUTE_MODULES}."
    )
    # activation offloading (Megatron --fine-grained-activation-offloading --offload-modules ...)
    fine_grained_activation_offloading: bool = Field(
        False, description="Tensors the offload_modules save for backward go to host memory during forward (a D2H copy "
        "beside the layer's compute) and come back one layer ahead in backward (graph/offload.py).",
    )
    cpu_offloading: bool = Field(
        False, description="Megatron layer offload (TransformerEngine's CPU offload; Megatron-LM 0.19 turns it on with "
        "--cpu-offloading-num-layers > 0, older ones with --cpu-offloading): every tensor the first "
        "cpu_offloading_num_layers layers save for backward goes to host memory during forward and comes back one layer "
        "ahead in backward (Megatron: pp 1, no recompute).",
    )
    cpu_offloading_num_layers: int = Field(
        0, ge=0, le=100_000, description="Megatron --cpu-offloading-num-layers: the layers (from the first) whose "
        "activations are offloaded; fewer than the model's layers.",
    )
    offload_modules: list[str] = Field(
        default_factory=list, description=f"With fine_grained_activation_offloading: subset of {ACTIVATION_OFFLOAD_MODULES}."
    )
    # memory
    mem_factor: float = Field(0.94, gt=0, le=1, description="allocated / reserved ratio of the caching allocator.")
    # networks: tier names from the system config; null picks by group placement
    tp_net: str | None = Field(None, description="Network tier for TP collectives (auto if null).")
    cp_net: str | None = Field(None, description="Network tier for CP collectives.")
    ep_net: str | None = Field(None, description="Network tier for EP collectives.")
    etp_net: str | None = Field(None, description="Network tier for ETP collectives.")
    dp_net: str | None = Field(None, description="Network tier for DP collectives.")
    pp_net: str | None = Field(None, description="Network tier for PP point-to-point.")
    edp_net: str | None = Field(None, description="Network tier for expert data-parallel collectives (default dp_net's).")
    pp_comm_async: bool = Field(False, description="SimuMax name for overlap_p2p_comm (either turns it on).")
    # pipeline schedule and overlap (Megatron's option names; all overlap is off by default)
    pp_schedule: PipelineSchedule | None = Field(
        None, description="1f1b, interleaved (needs interleaving_size > 1), zb (ZB-H1 zero bubble) or dualpipev; "
        "null: interleaved when interleaving_size > 1, else 1f1b.",
    )
    overlap_grad_reduce: bool = Field(False, description="Gradient reduce of each bucket overlaps the remaining backward.")
    overlap_param_gather: bool = Field(
        False, description="ZeRO-1 parameter all-gather overlaps the next iteration's first forward."
    )
    nccl_ub: bool = Field(
        False, description="Megatron --use-nccl-ub: DP/FSDP buffers registered with NCCL, whose SM-efficient "
        "algorithms hold fewer SMs beside the compute their overlapped collectives run under (cost/nccl_sms.py).",
    )
    use_sharp: bool = Field(
        False, description="Megatron --use-sharp: SHARP for the data-parallel group; with nccl_ub its collectives across "
        "nodes hold fewer SMs (the in-network reduction's bandwidth is not modelled).",
    )
    overlap_param_gather_with_optimizer_step: bool = Field(
        False, description="Megatron --overlap-param-gather-with-optimizer-step (interleaved pipelines): the first model "
        "chunk steps first and its parameter all-gathers run while the other chunks step.",
    )
    tp_comm_overlap: bool = Field(False, description="TP all-gather / reduce-scatter overlap their GEMMs (TE userbuffers).")
    overlap_p2p_comm: bool = Field(False, description="P2P sends run on a communication stream (do not block compute). "
                                   "Megatron-LM 0.19 does so by default in the interleaved schedule (--no-overlap-p2p-communication "
                                   "turns it off) and never in 1F1B; SimuMax files (pp_comm_async) default to off.")
    overlap_p2p_comm_warmup_flush: bool = Field(
        False, description="Megatron --overlap-p2p-communication-warmup-flush: with P2P overlap in the interleaved schedule, "
        "overlap the warm-up and flush P2P too (off: their sends block, as Megatron runs them by default).")
    moe_shared_expert_overlap: bool = Field(
        False, description="Megatron --moe-shared-expert-overlap: the shared experts run on a side stream, FC1 under "
        "the dispatch all-to-all and FC2 under the combine's (and their backward under the all-to-alls' backward).",
    )
    overlap_moe_expert_parallel_comm: bool = Field(
        False, description="EP all-to-all of one micro-batch overlaps compute of another (paired forward/backward)."
    )
    delay_wgrad_compute: bool = Field(
        False, description="Weight-gradient GEMMs run during the backward all-to-all (needs overlap_moe_expert_parallel_comm)."
    )
    defer_embedding_wgrad_compute: bool = Field(
        False, description="LM-head weight gradients of all micro-batches run after the last backward (pipeline drain)."
    )
    enable_straggler_model: bool = Field(False, description="SimuMax straggler model: accepted, not modelled (true is warned once and read as false).")

    @model_validator(mode="before")
    @classmethod
    def _simumax_input(cls, data: Any) -> Any:
        return strategy_input(data, cls.model_fields)

    @field_validator("offload_modules", "megatron_recompute_modules")
    @classmethod
    def _modules(cls, v: list[str], info: ValidationInfo) -> list[str]:
        allowed = ACTIVATION_OFFLOAD_MODULES if info.field_name == "offload_modules" else MEGATRON_RECOMPUTE_MODULES
        for m in v:
            if m not in allowed:
                raise ConfigError(str(info.field_name), f"unknown module {m!r}; allowed {allowed}")
        return v

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> "StrategyConfig":
        if not (info.context or {}).get(DEFER_RULES):
            check_rules(self)
        return self
