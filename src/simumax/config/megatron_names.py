"""Megatron-LM flag names of simumax model and strategy fields: one table, read by the
importer (flags -> fields, importers/megatron_args.py) and the exporter (fields -> flags,
export/megatron_flags.py). Flags whose value needs a conversion either way (recompute,
dispatcher type, normalization, --moe-layer-freq, ...) are handled in both places by hand.
The exporter writes what Megatron-LM 0.19's parser accepts (tests/test_megatron_flags.py
parses it with that parser); ``OLDER_FLAGS`` are read from older scripts, never written."""

from __future__ import annotations

from typing import Any

# flag -> (target, field, value type); target m = model, s = strategy
VALUED: dict[str, tuple[str, str, type]] = {
    "--num-layers": ("m", "layer_num", int),
    "--hidden-size": ("m", "hidden_size", int),
    "--ffn-hidden-size": ("m", "intermediate_size", int),
    "--num-attention-heads": ("m", "head_num", int),
    "--num-query-groups": ("m", "kv_head_num", int),
    "--kv-channels": ("m", "head_size", int),
    "--vocab-size": ("m", "vocab_size", int),
    "--make-vocab-size-divisible-by": ("m", "make_vocab_size_divisible_by", int),
    "--max-position-embeddings": ("m", "max_position_embeddings", int),
    "--rotary-base": ("m", "rotary_base", float),
    "--num-experts": ("m", "expert_num", int),
    "--moe-router-topk": ("m", "topk", int),
    "--moe-ffn-hidden-size": ("m", "moe_ffn_hidden_size", int),
    "--moe-shared-expert-intermediate-size": ("m", "moe_shared_expert_intermediate_size", int),
    "--moe-expert-capacity-factor": ("m", "capacity", float),
    "--mtp-num-layers": ("m", "mtp_num_layers", int),
    "--hybrid-layer-pattern": ("m", "hybrid_layer_pattern", str),
    "--mamba-state-dim": ("m", "mamba_state_dim", int),
    "--mamba-head-dim": ("m", "mamba_head_dim", int),
    "--mamba-num-groups": ("m", "mamba_num_groups", int),
    "--mamba-num-heads": ("m", "mamba_num_heads", int),
    "--linear-conv-kernel-dim": ("m", "linear_conv_kernel_dim", int),
    "--linear-key-head-dim": ("m", "linear_key_head_dim", int),
    "--linear-value-head-dim": ("m", "linear_value_head_dim", int),
    "--linear-num-key-heads": ("m", "linear_num_key_heads", int),
    "--linear-num-value-heads": ("m", "linear_num_value_heads", int),
    "--num-distributed-optimizer-instances": ("s", "fsdp_replicate_size", int),
    "--optimizer-offload-fraction": ("s", "optimizer_offload_fraction", float),
    "--q-lora-rank": ("m", "q_lora_rank", int),
    "--kv-lora-rank": ("m", "kv_lora_rank", int),
    "--qk-head-dim": ("m", "qk_head_dim", int),
    "--qk-pos-emb-head-dim": ("m", "qk_pos_emb_head_dim", int),
    "--v-head-dim": ("m", "v_head_dim", int),
    "--dsa-indexer-n-heads": ("m", "dsa_indexer_n_heads", int),
    "--dsa-indexer-head-dim": ("m", "dsa_indexer_head_dim", int),
    "--dsa-indexer-topk": ("m", "dsa_indexer_topk", int),
    "--dsa-indexer-topk-freq": ("m", "dsa_indexer_topk_freq", int),
    "--dsa-indexer-skip-topk-offset": ("m", "dsa_indexer_skip_topk_offset", int),
    "--dsa-indexer-loss-coeff": ("m", "dsa_indexer_loss_coeff", float),
    "--dsa-kernel-backend": ("s", "dsa_kernel_backend", str),
    "--seq-length": ("s", "seq_len", int),
    "--cross-entropy-fusion-impl": ("s", "cross_entropy_fusion_impl", str),
    "--micro-batch-size": ("s", "micro_batch_size", int),
    "--tensor-model-parallel-size": ("s", "tp_size", int),
    "--pipeline-model-parallel-size": ("s", "pp_size", int),
    "--context-parallel-size": ("s", "cp_size", int),
    "--expert-model-parallel-size": ("s", "ep_size", int),
    "--expert-tensor-parallel-size": ("s", "etp_size", int),
    "--num-virtual-stages-per-pipeline-rank": ("s", "interleaving_size", int),
    "--microbatch-group-size-per-virtual-pipeline-stage": ("s", "microbatch_group_size_per_vp_stage", int),
    "--decoder-first-pipeline-num-layers": ("s", "num_layers_in_first_pipeline_stage", int),
    "--decoder-last-pipeline-num-layers": ("s", "num_layers_in_last_pipeline_stage", int),
    "--pipeline-model-parallel-layout": ("s", "pipeline_model_parallel_layout", str),
    "--recompute-num-layers": ("s", "recompute_layer_num", int),
    "--cpu-offloading-num-layers": ("s", "cpu_offloading_num_layers", int),
    "--cp-comm-type": ("s", "cp_comm_type", str),
    "--transformer-impl": ("s", "transformer_impl", str),
    "--fp8-recipe": ("s", "fp8_recipe", str),
    "--fp4-recipe": ("s", "fp4_recipe", str),
    "--num-layers-at-start-in-bf16": ("s", "num_layers_at_start_in_bf16", int),
    "--num-layers-at-end-in-bf16": ("s", "num_layers_at_end_in_bf16", int),
    "--moe-router-score-function": ("m", "moe_router_score_function", str),
    "--moe-router-num-groups": ("m", "moe_router_num_groups", int),
    "--moe-router-group-topk": ("m", "moe_router_group_topk", int),
    "--moe-router-topk-scaling-factor": ("m", "moe_router_topk_scaling_factor", float),
    "--moe-router-load-balancing-type": ("m", "moe_router_load_balancing_type", str),
    "--moe-z-loss-coeff": ("m", "moe_z_loss_coeff", float),
    "--moe-flex-dispatcher-num-sms": ("s", "moe_flex_dispatcher_num_sms", int),
    "--moe-router-dtype": ("s", "moe_router_dtype", str),
    "--muon-num-ns-steps": ("s", "muon_num_ns_steps", int),
    "--moe-latent-size": ("m", "moe_latent_size", int),
    "--muon-scalar-optimizer": ("s", "muon_scalar_optimizer", str),
    "--ddp-bucket-size": ("s", "ddp_bucket_size", int),
    "--main-params-dtype": ("s", "main_params_dtype", str),
    "--exp-avg-dtype": ("s", "exp_avg_dtype", str),
    "--exp-avg-sq-dtype": ("s", "exp_avg_sq_dtype", str),
}
# flag -> (target, field, the value the flag sets)
SWITCHES: dict[str, tuple[str, str, Any]] = {
    "--swiglu": ("m", "use_swiglu", True),
    "--disable-dsa-indexer-rotate-activation": ("m", "dsa_indexer_rotate_activation", False),  # 0.19's two spellings
    "--no-dsa-indexer-rotate-activation": ("m", "dsa_indexer_rotate_activation", False),
    "--dsa-indexer-use-sparse-loss": ("m", "dsa_indexer_use_sparse_loss", True),
    "--untie-embeddings-and-output-weights": ("m", "untie_embeddings_and_output_weights", True),
    "--disable-bias-linear": ("m", "add_bias_linear", False),
    "--add-bias-linear": ("m", "add_bias_linear", True),
    "--add-qkv-bias": ("m", "add_qkv_bias", True),
    "--multi-latent-attention": ("m", "attention_type", "mla"),
    "--moe-pad-expert-input-to-capacity": ("m", "moe_pad_expert_input_to_capacity", True),
    "--moe-shared-expert-gate": ("m", "moe_shared_expert_gate", True),
    "--moe-router-pre-softmax": ("m", "moe_router_pre_softmax", True),
    "--moe-router-enable-expert-bias": ("m", "moe_router_enable_expert_bias", True),
    "--moe-router-force-load-balancing": ("m", "moe_router_force_load_balancing", True),
    "--sequence-parallel": ("s", "enable_sequence_parallel", True),
    "--qk-layernorm": ("m", "qk_layernorm", True),
    "--attention-output-gate": ("m", "attention_output_gate", True),
    "--first-last-layers-bf16": ("s", "first_last_layers_bf16", True),
    "--optimizer-cpu-offload": ("s", "optimizer_cpu_offload", True),
    "--fine-grained-activation-offloading": ("s", "fine_grained_activation_offloading", True),
    "--cpu-offloading": ("s", "cpu_offloading", True),
    "--account-for-embedding-in-pipeline-split": ("s", "account_for_embedding_in_pipeline_split", True),
    "--account-for-loss-in-pipeline-split": ("s", "account_for_loss_in_pipeline_split", True),
    "--use-distributed-optimizer": ("s", "zero_state", 1),
    "--bf16": ("s", "dtype", "bf16"),
    "--fp16": ("s", "dtype", "fp16"),
    "--use-flash-attn": ("s", "use_flash_sdp", True),
    "--cross-entropy-loss-fusion": ("s", "cross_entropy_loss_fusion", True),
    "--moe-grouped-gemm": ("s", "group_linear_mode", "grouped"),
    "--moe-permute-fusion": ("s", "moe_permute_fusion", True),
    "--moe-router-fusion": ("s", "moe_router_fusion", True),
    "--moe-apply-probs-on-input": ("s", "moe_apply_probs_on_input", True),
    "--no-masked-softmax-fusion": ("s", "masked_softmax_fusion", False),
    "--no-rope-fusion": ("s", "apply_rope_fusion", False),
    "--no-check-for-nan-in-loss-and-grad": ("s", "check_for_nan_in_grad", False),
    "--no-bias-swiglu-fusion": ("s", "use_fused_swiglu", False),  # megatron-core mlp.py: bias_activation_fusion off
    "--overlap-grad-reduce": ("s", "overlap_grad_reduce", True),
    "--ddp-average-in-collective": ("s", "ddp_average_in_collective", True),
    "--no-gradient-accumulation-fusion": ("s", "gradient_accumulation_fusion", False),
    "--overlap-param-gather": ("s", "overlap_param_gather", True),
    "--tp-comm-overlap": ("s", "tp_comm_overlap", True),
    "--overlap-moe-expert-parallel-comm": ("s", "overlap_moe_expert_parallel_comm", True),
    "--delay-wgrad-compute": ("s", "delay_wgrad_compute", True),
    "--defer-embedding-wgrad-compute": ("s", "defer_embedding_wgrad_compute", True),
    "--accumulate-allreduce-grads-in-fp32": ("s", "use_fp32_accum_grad", True),
    "--grad-reduce-in-bf16": ("s", "grad_reduce_in_bf16", True),
    "--overlap-p2p-communication": ("s", "overlap_p2p_comm", True),
    "--no-overlap-p2p-communication": ("s", "overlap_p2p_comm", False),  # Megatron-LM 0.19 (on by default with interleaving)
    "--overlap-p2p-communication-warmup-flush": ("s", "overlap_p2p_comm_warmup_flush", True),
    "--use-precision-aware-optimizer": ("s", "use_precision_aware_optimizer", True),
    "--no-store-param-remainders": ("s", "store_param_remainders", False),
    "--fp8-param-gather": ("s", "fp8_param_gather", True),
    "--disable-fp8-wgrad": ("s", "fp8_wgrad", False),  # 0.19's two spellings; the one after is written
    "--no-fp8-wgrad": ("s", "fp8_wgrad", False),
    "--moe-shared-expert-overlap": ("s", "moe_shared_expert_overlap", True),
    "--use-tp-pp-dp-mapping": ("s", "rank_order", "tp-cp-ep-pp-dp"),
    "--overlap-param-gather-with-optimizer-step": ("s", "overlap_param_gather_with_optimizer_step", True),
    "--use-nccl-ub": ("s", "nccl_ub", True),
    "--muon-no-split-qkv": ("s", "muon_split_qkv", False),
    "--moe-router-padding-for-fp8": ("s", "moe_router_padding_for_quantization", True),  # 0.19's alias; the one after is written
    "--moe-router-padding-for-quantization": ("s", "moe_router_padding_for_quantization", True),
    "--use-sharp": ("s", "use_sharp", True),
}

# switches Megatron-LM 0.19 no longer has: the default they restated (--add-bias-linear), the
# flag its successor replaced (--cpu-offloading: --cpu-offloading-num-layers > 0 turns it on;
# --overlap-p2p-communication: on by default with the interleaved schedule) or one without a
# flag now (--no-store-param-remainders: only TransformerEngine < 2.1 turns it off)
OLDER_FLAGS = frozenset({"--add-bias-linear", "--cpu-offloading", "--overlap-p2p-communication", "--no-store-param-remainders"})

_FLAG_OF = {(target, field): flag for flag, (target, field, _) in VALUED.items()}
_SWITCH_OF = {(target, field, value): flag for flag, (target, field, value) in SWITCHES.items()}
_WRITTEN = {key: flag for flag, key in SWITCHES.items() if flag not in OLDER_FLAGS}


def flag_of(target: str, field: str) -> str | None:
    """The Megatron flag that sets a model (m) or strategy (s) field, if one does; every
    switch that sets it where several do (``--disable-bias-linear / --add-bias-linear``)."""
    if (target, field) in _FLAG_OF:
        return _FLAG_OF[(target, field)]
    switches = [f for (t, fl, _), f in _SWITCH_OF.items() if (t, fl) == (target, field)]
    return " / ".join(switches) or None


def valued_flag(target: str, field: str, value: Any) -> str:
    """``--flag value`` for a model (m) or strategy (s) field."""
    if isinstance(value, float):
        text = str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"  # 1000000, not 1e+06
    else:
        text = str(value)
    return f"{_FLAG_OF[(target, field)]} {text}"


def switch_flag(target: str, field: str, value: Any = True) -> str:
    """The switch that sets ``field`` to ``value`` (Megatron-LM 0.19's; KeyError where it has none)."""
    return _WRITTEN[(target, field, value)]
