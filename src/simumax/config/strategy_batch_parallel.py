"""The strategy config's first fields: the batch and its precision, the parallel sizes and
layout, and how MoE tokens are dispatched (config/strategy.py's ``StrategyConfig`` inherits
them; pydantic lists a base class's fields first, so the schema and the docs keep their order)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt

from simumax.config.base import ConfigBase


class BatchAndParallelFields(ConfigBase):
    """Batch, precision, parallel sizes and layout fields of ``StrategyConfig``."""

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
