"""A strategy (and model) as Megatron-LM command-line flags (the model's architecture flags:
export/megatron_model_flags.py)."""

from __future__ import annotations

from simumax.config.checks import vstage_layer_counts
from simumax.config.megatron_names import switch_flag, valued_flag
from simumax.config.megatron_rules import check_megatron_torch_fsdp2_model
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError
from simumax.export.megatron_model_flags import model_flags
from simumax.memory.model_states import keeps_param_remainders

__all__ = ["job_flags", "megatron_flags", "model_flags"]


def _s(field: str, value: object) -> str:
    return valued_flag("s", field, value)


DISPATCHERS = {"all2all": "alltoall", "all_gather": "allgather", "flex": "flex"}  # Megatron's dispatcher names


def megatron_flags(st: StrategyConfig, model: ModelConfig | None = None) -> list[str]:
    if st.pp_size > 1 and st.schedule in ("zb", "dualpipev"):  # a launch line would run 1F1B
        raise ConfigError("pp_schedule", f"Megatron-LM has no {st.schedule} schedule (its flags would run 1F1B): "
                          "export a 1f1b or interleaved strategy")
    if st.fsdp_impl == "torch_fsdp2":  # the same fully_shard, another precision and layout: not one flag
        raise ConfigError("fsdp_impl", "torch_fsdp2 is torchtitan's FSDP2 (fp32 shards, fp32 reduce-scatters); "
                          "Megatron's --use-torch-fsdp2 is fsdp_impl megatron_torch_fsdp2 (bf16 shards and "
                          "reduce-scatters, fp32 master): export that, or export torchtitan")
    if st.fsdp_impl == "megatron_torch_fsdp2" and model is not None:  # (the strategy's own rules ran at load)
        check_megatron_torch_fsdp2_model(model)
    return [*_parallel_flags(st, model), *_moe_flags(st, model), *_data_parallel_flags(st), *_precision_flags(st),
            *_kernel_flags(st, model), *_recompute_flags(st, model), *_overlap_and_offload_flags(st)]


def _parallel_flags(st: StrategyConfig, model: ModelConfig | None) -> list[str]:
    """The parallel sizes, batch and sequence, the pipeline split and virtual stages, the rank order, the CP scheme."""
    f = [
        *(_s(field, getattr(st, field)) for field in ("tp_size", "pp_size", "cp_size", "micro_batch_size")),
        f"--global-batch-size {st.global_batch_size}",
        _s("seq_len", st.seq_len),
    ]
    if st.sp:
        f.append(switch_flag("s", "enable_sequence_parallel"))
    uneven = (st.num_layers_in_first_pipeline_stage or st.num_layers_in_last_pipeline_stage or st.pipeline_model_parallel_layout
              or st.account_for_embedding_in_pipeline_split or st.account_for_loss_in_pipeline_split)
    if st.pipeline_model_parallel_layout:  # the layout states the virtual stages itself
        f.append(f"--pipeline-model-parallel-layout '{st.pipeline_model_parallel_layout}'")
    elif model is not None and model.hybrid_layer_pattern is not None:
        pass  # a hybrid pattern's '|' segments state the virtual stages (Megatron refuses the flags beside it)
    elif st.interleaving_size > 1:
        if uneven or model is None:
            f.append(_s("interleaving_size", st.interleaving_size))
        else:
            f.append(f"--num-layers-per-virtual-pipeline-stage {_max_chunk_layers(st, model)}")
    if st.schedule == "interleaved" and st.microbatch_group_size_per_vp_stage:
        f.append(_s("microbatch_group_size_per_vp_stage", st.microbatch_group_size_per_vp_stage))
    if st.num_layers_in_first_pipeline_stage:
        f.append(_s("num_layers_in_first_pipeline_stage", st.num_layers_in_first_pipeline_stage))
    if st.num_layers_in_last_pipeline_stage:
        f.append(_s("num_layers_in_last_pipeline_stage", st.num_layers_in_last_pipeline_stage))
    for field in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if getattr(st, field):
            f.append(switch_flag("s", field))
    if st.rank_order == "tp-cp-ep-pp-dp":
        f.append(switch_flag("s", "rank_order", "tp-cp-ep-pp-dp"))
    if st.document_lengths is not None:  # cu_seqlens at the documents' ends (the lengths are the data's)
        f.append("--dataloader-inter-document-masking")
    if st.cp_size > 1:
        f.append(_s("cp_comm_type", st.cp_comm_type))
        if st.cp_comm_type == "a2a+p2p" and st.hierarchical_context_parallel_sizes:
            f.append("--hierarchical-context-parallel-sizes " + " ".join(map(str, st.hierarchical_context_parallel_sizes)))
    return f


def _moe_flags(st: StrategyConfig, model: ModelConfig | None) -> list[str]:
    """Expert parallelism, the dispatcher, the fused MoE kernels and the capacity (MoE models only)."""
    f: list[str] = []
    if model is not None and model.is_moe:
        # SimuMax's expert-input options, which no Megatron flag runs (its flags would keep the inputs)
        if st.offload_groupgemm_col_inputs:
            raise ConfigError("offload_groupgemm_col_inputs", "has no Megatron-LM flag (Megatron offloads expert "
                              "inputs with fine_grained_activation_offloading, offload_modules expert_fc1 / moe_act)")
        if st.cache_groupgemm_col_fp8_inputs and st.low_precision:
            raise ConfigError("cache_groupgemm_col_fp8_inputs", "has no Megatron-LM flag: its grouped linears keep "
                              "what TransformerEngine keeps")
        if st.group_linear_mode == "merged":
            raise ConfigError("group_linear_mode", "merged (one GEMM over every expert's rows) is an efficiency bound, "
                              "not a Megatron-LM expert layer: export grouped or serial")
        f += [_s("ep_size", st.ep_size), _s("etp_size", st.etp_size)]
        f.append(f"--moe-token-dispatcher-type {DISPATCHERS[st.moe_dispatcher_policy]}")
        if st.group_linear_mode == "grouped":
            f.append(switch_flag("s", "group_linear_mode", "grouped"))
        if st.moe_permute_fusion:
            f.append(switch_flag("s", "moe_permute_fusion"))
        if st.moe_router_fusion:
            f.append(switch_flag("s", "moe_router_fusion"))
        if st.moe_router_padding_for_quantization:
            f.append(switch_flag("s", "moe_router_padding_for_quantization"))
        if st.moe_apply_probs_on_input:
            f.append(switch_flag("s", "moe_apply_probs_on_input"))
        if st.moe_router_dtype is not None:
            f.append(_s("moe_router_dtype", st.moe_router_dtype))
        if st.moe_dispatcher_policy == "flex" and st.moe_flex_dispatcher_num_sms is not None:
            f.append(_s("moe_flex_dispatcher_num_sms", st.moe_flex_dispatcher_num_sms))
        if model.capacity is not None:
            f.append(valued_flag("m", "capacity", float(model.capacity)))
            if model.moe_pad_expert_input_to_capacity:
                f.append(switch_flag("m", "moe_pad_expert_input_to_capacity"))
    return f


def _data_parallel_flags(st: StrategyConfig) -> list[str]:
    """The distributed optimizer or sharded DP (Megatron-FSDP, FSDP2, DeepSpeed), optimizer offload, gradient
    dtypes and buckets, the optimizer."""
    f: list[str] = []
    ds = st.fsdp_impl == "deepspeed"  # Megatron-DeepSpeed: ZeRO comes from the DeepSpeed config (export --format deepspeed)
    if ds:
        f += ["--deepspeed", "--deepspeed_config ds_config.json", f"--zero-stage {st.zero_state}"]
    elif st.zero_state >= 1 and not st.fsdp2:
        f.append(switch_flag("s", "zero_state", 1))
    if st.optimizer_cpu_offload:
        f += [switch_flag("s", "optimizer_cpu_offload"), _s("optimizer_offload_fraction", st.optimizer_offload_fraction)]
    if st.fsdp_replicate_size > 1:
        f.append(_s("fsdp_replicate_size", st.fsdp_replicate_size))
    if st.fsdp_impl == "megatron_torch_fsdp2":  # Megatron's wrapper reshards every unit, or (the flag) none
        f.append("--use-torch-fsdp2")
        if st.fsdp_reshard_after_forward == "never":
            f.append("--torch-fsdp2-no-reshard-after-forward")
    elif st.zero_state >= 2 and not ds:
        f += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {'optim_grads' if st.zero_state == 2 else 'optim_grads_params'}",
              "--ckpt-format fsdp_dtensor"]  # Megatron-FSDP's only checkpoint format (validate_args)
    if st.use_fp32_accum_grad and not st.grad_reduce_in_bf16 and not ds and not st.fsdp2:
        f.append(switch_flag("s", "use_fp32_accum_grad"))
    # bf16 main grads however the file says it (SimuMax's use_fp32_accum_grad false): with --bf16
    # Megatron accumulates in fp32 unless --grad-reduce-in-bf16 (validate_args)
    if (st.grad_reduce_in_bf16 or (not st.use_fp32_accum_grad and st.dtype == "bf16")) and not ds and not st.fsdp2:
        f.append(switch_flag("s", "grad_reduce_in_bf16"))
    if st.optimizer == "muon":
        f.append("--optimizer muon")
        if st.muon_num_ns_steps != 5:
            f.append(_s("muon_num_ns_steps", st.muon_num_ns_steps))
        if not st.muon_split_qkv:
            f.append(switch_flag("s", "muon_split_qkv", False))
        if st.muon_scalar_optimizer != "adam":
            f.append(_s("muon_scalar_optimizer", st.muon_scalar_optimizer))
    if st.use_precision_aware_optimizer:
        f.append(switch_flag("s", "use_precision_aware_optimizer"))
        f += [_s(field, getattr(st, field)) for field in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")]
        if not st.store_param_remainders and keeps_param_remainders(st.with_updates({"store_param_remainders": True})):
            raise ConfigError("store_param_remainders", "Megatron-LM 0.19 has no flag that turns it off (only "
                              "TransformerEngine < 2.1 does): export with store_param_remainders true")
    if st.ddp_bucket_size is not None and not ds:
        f.append(_s("ddp_bucket_size", st.ddp_bucket_size))
    if st.ddp_average_in_collective and not ds:
        f.append(switch_flag("s", "ddp_average_in_collective"))
    if not st.gradient_accumulation_fusion:
        f.append(switch_flag("s", "gradient_accumulation_fusion", False))
    return f


def _precision_flags(st: StrategyConfig) -> list[str]:
    """The training dtype and the FP8 / FP4 recipes."""
    f: list[str] = []
    if st.dtype in ("bf16", "fp16"):
        f.append(switch_flag("s", "dtype", st.dtype))
    if st.low_precision and not st.fp8_weight_caching:
        raise ConfigError("fp8_weight_caching", "false has no Megatron-LM flag (TransformerConfig's "
                          "disable_parameter_transpose_cache has no command-line argument): its flags would cache")
    if st.fp8_on:
        f += ["--fp8-format hybrid", _s("fp8_recipe", st.fp8_recipe)]
        if st.fp8_param_gather:
            f.append(switch_flag("s", "fp8_param_gather"))
        if not st.fp8_wgrad:
            f.append(switch_flag("s", "fp8_wgrad", False))
    if st.fp4_on:
        f += ["--fp4-format e2m1", _s("fp4_recipe", st.lp_recipe)]
    if st.low_precision and st.first_last_layers_bf16:
        f += [switch_flag("s", "first_last_layers_bf16"), _s("num_layers_at_start_in_bf16", st.num_layers_at_start_in_bf16),
              _s("num_layers_at_end_in_bf16", st.num_layers_at_end_in_bf16)]
    return f


def _kernel_flags(st: StrategyConfig, model: ModelConfig | None) -> list[str]:
    """The attention backend, the fusions (RoPE, SwiGLU, cross-entropy), the NaN check, dropout."""
    f: list[str] = []
    if st.transformer_impl == "local":  # Megatron-Core's own modules (the default is TransformerEngine's)
        f.append(_s("transformer_impl", "local"))
    if st.use_math_sdp:  # Megatron-Core's unfused DotProductAttention path
        f.append("--attention-backend unfused")
    elif st.use_flash_sdp:
        f.append(switch_flag("s", "use_flash_sdp"))
    if not st.apply_rope_fusion:
        f.append(switch_flag("s", "apply_rope_fusion", False))
    if not st.check_for_nan_in_grad:
        f.append(switch_flag("s", "check_for_nan_in_grad", False))
    if not st.use_fused_swiglu and model is not None and model.use_swiglu:
        f.append(switch_flag("s", "use_fused_swiglu", False))
    p = "0.1" if st.enable_dropout else "0.0"  # Megatron's defaults are 0.1: said either way
    f += [f"--attention-dropout {p}", f"--hidden-dropout {p}"]
    if st.cross_entropy_loss_fusion:
        if st.cross_entropy_fusion_impl == "te":  # validate_args: "disabled due to stability issues"
            raise ConfigError("cross_entropy_fusion_impl", "Megatron-LM 0.19 refuses TransformerEngine's cross-entropy "
                              "fusion: export with native (or without cross_entropy_loss_fusion)")
        f += [switch_flag("s", "cross_entropy_loss_fusion"), _s("cross_entropy_fusion_impl", st.cross_entropy_fusion_impl)]
    if model is not None and model.experimental_attention_variant == "dsa":
        f.append(_s("dsa_kernel_backend", st.dsa_kernel_backend))
    return f


def _recompute_flags(st: StrategyConfig, model: ModelConfig | None) -> list[str]:
    """Full or selective recompute as Megatron states them."""
    if st.recompute_variance:  # SimuMax's: a line would run norms that keep it
        raise ConfigError("recompute_variance", "has no Megatron-LM flag: TransformerEngine's norms keep their fp32 rstd")
    f: list[str] = []
    mode = st.recompute_mode
    if mode == "full_block" and st.recompute_method == "uniform":
        f += ["--recompute-granularity full", "--recompute-method uniform", _s("recompute_layer_num", st.recompute_group_layers)]
    elif mode == "full_block":
        f += ["--recompute-granularity full", "--recompute-method block"]
        n = st.recompute_layer_num
        f.append(_s("recompute_layer_num", n if n is not None else _max_chunk_layers(st, model)))
    elif mode == "selective" and st.recompute_granularity == "attn_only":
        raise ConfigError("recompute_granularity", "Megatron has no flag that recomputes the attention sub-block (attn_only)")
    elif (mode == "selective" and model is not None and st.recompute_layer_num is not None
          and st.recompute_layer_num < _max_chunk_layers(st, model)):
        # (Megatron's --recompute-modules apply to every layer; the flags would mean more recompute)
        raise ConfigError("recompute_layer_num", f"{st.recompute_layer_num} of the {_max_chunk_layers(st, model)} layers "
                          "of a model chunk has no Megatron flag: its selective recompute applies to every layer; "
                          "export with recompute_layer_num null (every layer)")
    elif mode == "selective" and st.recompute_granularity in ("mlp_only", "sdp_only"):
        mods = ["core_attn"] if st.recompute_granularity == "sdp_only" else ["mlp"] + (["moe"] if model is not None and model.is_moe else [])
        f += ["--recompute-granularity selective"] + (["--recompute-modules " + " ".join(mods)] if mods != ["core_attn"] else [])
    elif mode == "selective":
        mods = [m for flag, m in (("attn_recompute", "core_attn"), ("mlp_recompute", "mlp"), ("mlp_rms_recompute", "layernorm")) if getattr(st, flag)]
        if mods or st.mla_rms_recompute:  # (none of SimuMax's flags: nothing recomputes, Megatron's default)
            f.append("--recompute-granularity selective")
        if mods and mods != ["core_attn"]:
            f.append("--recompute-modules " + " ".join(mods))
    elif mode == "megatron":
        f += ["--recompute-granularity selective", "--recompute-modules " + " ".join(st.megatron_recompute_modules)]
    return f


def _overlap_and_offload_flags(st: StrategyConfig) -> list[str]:
    """The overlap options and activation offload."""
    f: list[str] = []
    f += [switch_flag("s", field) for field in OVERLAP_FIELDS if getattr(st, field)]
    f += _p2p_overlap_flags(st)
    if st.cpu_offloading and st.cpu_offloading_num_layers:  # Megatron-LM 0.19: a layer count > 0 turns it on
        f.append(_s("cpu_offloading_num_layers", st.cpu_offloading_num_layers))
    if st.fine_grained_activation_offloading:
        f += [switch_flag("s", "fine_grained_activation_offloading"), "--offload-modules " + " ".join(st.offload_modules)]
    return f


OVERLAP_FIELDS = ("overlap_grad_reduce", "overlap_param_gather", "overlap_param_gather_with_optimizer_step",
                  "tp_comm_overlap",
                  "overlap_moe_expert_parallel_comm", "moe_shared_expert_overlap", "delay_wgrad_compute",
                  "defer_embedding_wgrad_compute", "nccl_ub", "use_sharp")


def _p2p_overlap_flags(st: StrategyConfig) -> list[str]:
    """Megatron-LM 0.19 overlaps the pipeline's P2P with compute by default in the interleaved
    schedule (``--no-overlap-p2p-communication`` turns it off) and never in 1F1B (it turns the
    option off there: arguments.py, validate_args)."""
    if st.pp_size == 1:
        return []
    if st.schedule == "interleaved":
        if not st.p2p_overlapped:
            if st.pp_size <= 2:  # validate_args: a rank would send and receive one tensor twice at once
                raise ConfigError("overlap_p2p_comm", "Megatron-LM runs the interleaved schedule with pp_size 2 only with "
                                  "P2P overlap: export with it on")
            return [switch_flag("s", "overlap_p2p_comm", False)]
        return [switch_flag("s", "overlap_p2p_comm_warmup_flush")] if st.overlap_p2p_comm_warmup_flush else []
    if st.p2p_overlapped:
        raise ConfigError("overlap_p2p_comm", "Megatron-LM overlaps P2P communication only in the interleaved schedule "
                          "(interleaving_size > 1); its 1F1B sends block: export with it off")
    return []


def _max_chunk_layers(st: StrategyConfig, model: ModelConfig | None) -> int:
    """Layers of the largest model chunk (Megatron counts --recompute-num-layers per chunk)."""
    if model is None:
        return 1
    return max(max(vstage_layer_counts(model, st)), 1)


def job_flags(st: StrategyConfig, model: ModelConfig) -> list[str]:
    """The whole Megatron-LM 0.19 job: the model's flags and the strategy's (``simumax
    export``, ``search``'s best strategy)."""
    return model_flags(model, st.seq_len) + megatron_flags(st, model)
