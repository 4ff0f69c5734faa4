"""Parallel/training strategy config (SimuMax ``strategy/*.json`` format)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, PositiveInt, ValidationInfo, field_validator, model_validator

from simumax.compat.config_methods import SimuMaxStrategyMethods
from simumax.config.base import DEFER_RULES, ConfigBase
from simumax.config.simumax_fields import strategy_input
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


class StrategyConfig(StrategyDerived, SimuMaxStrategyMethods, ConfigBase):
    """How one training iteration is laid out on ``world_size`` accelerators.

    Rank order is Megatron's tp-cp-ep-dp-pp (tp fastest). ``dp`` is derived:
    world_size / (tp * cp * pp).
    """

    # batch
    seq_len: PositiveInt = Field(le=2**27, description="Tokens per sequence.")
    document_lengths: PositiveInt | list[PositiveInt] | None = Field(
        None, description="Documents packed into each sequence, attention within each document only (Megatron "
        "--dataloader-inter-document-masking, or --sft's packed conversations: TransformerEngine's THD attention over "
        "cu_seqlens): their token counts, summing to seq_len, or one length L (seq_len // L documents of L and one of "
        "the rest). None: one document per sequence.",
    )
    micro_batch_size: PositiveInt = Field(1, le=65536, description="Sequences per micro-batch (mbs).")
    micro_batch_num: PositiveInt = Field(1, le=10**6, description="Micro-batches per iteration per DP rank (mbc).")
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="Parameter/activation dtype.")
    fp8: bool = Field(
        False,
        description="FP8 GEMMs in TransformerEngine linears (fp8_matmul / fp8_group_matmul tables), with input/"
        "grad quantize kernels, fp8 saved inputs and fp8 weight copies; LM head, router and attention stay bf16.",
    )
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] = Field(
        "delayed",
        description="TE FP8 recipe (Megatron --fp8-recipe): delayed scaling, tensorwise current scaling, blockwise "
        "(1x128 / 128x128 scales, Hopper+) or mxfp8 (Blackwell); sets the quantize kernels, scales and amax reductions. "
        "Naming a recipe other than delayed turns fp8 on.",
    )
    fp8_weight_caching: bool = Field(
        True,
        description="FP8: TE casts each weight once per iteration and reuses it across micro-batches (Megatron passes "
        "is_first_microbatch); false: the weights are cast in every micro-batch's forward.",
    )
    fp8_wgrad: bool = Field(
        True, description="FP8 weight-gradient GEMMs (Megatron --no-fp8-wgrad turns them off: with the delayed recipe "
        "TE's override_linear_precision.wgrad runs them in BF16 on the BF16 input it keeps, and casts inputs and output "
        "gradients row-wise only; Megatron passes it to the delayed recipe only, so other recipes ignore it).",
    )
    fp8_param_gather: bool = Field(
        False, description="Megatron --fp8-param-gather (TE fp8_model_init): the fp8 linears keep their weights in fp8 "
        "only (no bf16 copy); after the step the distributed optimizer casts its fp32 master shard to fp8 and "
        "all-gathers fp8; the other layout is made from it in the first micro-batch.",
    )
    fp4: bool = Field(
        False, description="FP4 GEMMs in TransformerEngine linears (Megatron --fp4; Blackwell), with the fp4_recipe's "
        "quantize kernels and scales; instead of fp8, not with it.",
    )
    fp4_recipe: Literal["nvfp4"] | None = Field(
        None, description="TE FP4 recipe (Megatron --fp4-recipe): nvfp4, E2M1 with an E4M3 scale per 16 elements "
        "(16 x 16 blocks for weights). Naming a recipe turns fp4 on; fp4 alone uses nvfp4.",
    )
    first_last_layers_bf16: bool = Field(
        False, description="Megatron --first-last-layers-bf16: with fp8 / fp4, the first and last transformer layers "
        "keep BF16 GEMMs (num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16 of them).",
    )
    num_layers_at_start_in_bf16: int = Field(1, ge=0, le=100_000, description="With first_last_layers_bf16: leading layers in BF16.")
    num_layers_at_end_in_bf16: int = Field(1, ge=0, le=100_000, description="With first_last_layers_bf16: trailing layers in BF16.")
    cache_groupgemm_col_fp8_inputs: bool = Field(
        False, description="FP8: grouped (expert) linears keep their fp8 column-wise input instead of the bf16 one."
    )
    offload_groupgemm_col_inputs: bool = Field(
        False, description="Grouped (expert) linears offload their saved inputs to host memory (no device bytes)."
    )
    # parallel sizes
    world_size: PositiveInt = Field(8, le=10**7, description="Total accelerators (SimuMax's default 8).")
    tp_size: PositiveInt = Field(1, le=65536, description="Tensor parallel size.")
    pp_size: PositiveInt = Field(1, le=65536, description="Pipeline parallel size.")
    cp_size: PositiveInt = Field(1, le=65536, description="Context parallel size.")
    ep_size: PositiveInt = Field(1, le=65536, description="Expert parallel size (MoE).")
    etp_size: PositiveInt = Field(1, le=65536, description="Expert tensor parallel size (MoE).")
    interleaving_size: PositiveInt = Field(1, le=1024, description="Virtual pipeline chunks per rank (VPP).")
    microbatch_group_size_per_vp_stage: PositiveInt | None = Field(
        None, description="Megatron's VPP micro-batch group; default pp_size."
    )
    num_layers_in_first_pipeline_stage: PositiveInt | None = Field(
        None, description="Layers on the first PP stage; the rest split evenly."
    )
    num_layers_in_last_pipeline_stage: PositiveInt | None = Field(
        None, description="Layers on the last PP stage; the rest split evenly."
    )
    account_for_embedding_in_pipeline_split: bool = Field(
        False, description="Megatron --account-for-embedding-in-pipeline-split: the embedding counts as a layer in the split."
    )
    account_for_loss_in_pipeline_split: bool = Field(
        False, description="Megatron --account-for-loss-in-pipeline-split: the loss counts as a layer in the split."
    )
    pipeline_model_parallel_layout: str | None = Field(
        None, max_length=10_000, description="Megatron --pipeline-model-parallel-layout: E embedding, t layer, m MTP, L loss, "
        "| between virtual stages, x*n and (...)*n repeat (e.g. 'Et*3|(tttt|)*14ttmL').",
    )
    enable_sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (with tp > 1).")
    cp_comm_type: Literal["a2a", "all_gather", "p2p", "a2a+p2p"] = Field(
        "p2p", description="Context-parallel attention scheme (Megatron --cp-comm-type, default p2p): a2a (Ulysses), all_gather, "
        "p2p (ring), or a2a+p2p (hierarchical: an all-to-all inside the first group of "
        "hierarchical_context_parallel_sizes, the ring across the second). TransformerEngine runs a sliding window "
        "only with a2a or all_gather, attention sinks only with a2a.",
    )
    rank_order: Literal["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"] = Field(
        "tp-cp-ep-dp-pp", description="How ranks are numbered, innermost first (Megatron's order; "
        "--use-tp-pp-dp-mapping: tp-cp-ep-pp-dp, pipeline neighbours inside a node, DP across): which groups are "
        "consecutive ranks and so fit in a node.",
    )
    hierarchical_context_parallel_sizes: list[PositiveInt] | None = Field(
        None, description="Megatron --hierarchical-context-parallel-sizes, with cp_comm_type a2a+p2p: [all-to-all group, "
        "ring group] sizes (consecutive CP ranks first), their product cp_size.",
    )
    moe_dispatcher_policy: Literal["all2all", "all_gather", "flex"] = Field(
        "all2all", description="MoE token dispatcher (Megatron --moe-token-dispatcher-type): all2all (one copy per routed "
        "expert), all_gather, or flex (DeepEP / HybridEP: each token sent once per destination node and rank).",
    )
    dispatch_probs: bool = Field(
        False,
        description="MoE: routing probabilities travel with the tokens in dispatch and weight the expert "
        "activation (Megatron >= 0.13); otherwise the combine's unpermute applies them.",
    )
    moe_permute_fusion: bool = Field(True, description="MoE: TE fused permute/unpermute kernels (--moe-permute-fusion).")
    moe_flex_dispatcher_num_sms: int | None = Field(
        None, ge=1, description="MoE flex dispatcher (DeepEP / HybridEP): SMs its dispatch and combine kernels hold "
        "(--moe-flex-dispatcher-num-sms; None: Megatron's 20). Overlapped with compute, they slow it by that share.",
    )
    moe_router_fusion: bool = Field(
        False, description="MoE: TE's fused router kernels (--moe-router-fusion, TE >= 2.7): score function, "
        "group-limited top-k, scaling and the dense probabilities in one kernel each way, the aux-loss scores and "
        "loss in one each.",
    )
    moe_router_padding_for_quantization: bool = Field(
        False, description="Megatron --moe-router-padding-for-quantization (--moe-router-padding-for-fp8): the router "
        "pads each expert's tokens for the fp8 / fp4 grouped GEMMs, so the experts' pad and unpad copies do not run.",
    )
    apply_rope_fusion: bool = Field(
        True, description="Fused RoPE (Megatron's default; --no-rope-fusion turns it off): one TransformerEngine kernel "
        "on q and k, and for MLA megatron-core's two YaRN kernels; off, megatron-core's torch RoPE (t*cos + "
        "rotate_half(t)*sin, several passes each way). The local transformer_impl's dense attention always runs the "
        "torch RoPE.",
    )
    moe_apply_probs_on_input: bool = Field(
        False, description="MoE, top-1 routing: the routing probability multiplies each expert's input tokens before "
        "FC1 (--moe-apply-probs-on-input, Llama 4), not its activation.",
    )
    moe_router_dtype: Literal["fp32", "fp64"] | None = Field(
        None, description="MoE: the router's logits, routing and probabilities in fp32 (--moe-router-dtype fp32; None: "
        "the activation dtype). Its gating GEMM writes fp32 logits; its gradient GEMMs cast the weight and input to fp32 "
        "and run on TF32 tensor cores. fp64 is not modelled.",
    )
    group_linear_mode: Literal["grouped", "serial", "merged"] = Field(
        "grouped",
        description="MoE expert GEMMs: grouped (TE grouped GEMM, --moe-grouped-gemm), serial (one GEMM per "
        "local expert), merged (one GEMM over all expert rows; an efficiency upper bound).",
    )
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
    enable_straggler_model: bool = Field(False, description="SimuMax straggler model (accepted, no effect).")

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
