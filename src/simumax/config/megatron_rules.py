"""Combinations megatron-core 0.19 refuses at start-up (``TransformerConfig.__post_init__``,
transformer/transformer_config.py), for the options modelled here: an estimate of a job that
cannot be launched would be a number for nothing, so each is a ConfigError naming its field
and quoting Megatron's rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simumax.errors import ConfigError

if TYPE_CHECKING:
    from simumax.config.model import ModelConfig
    from simumax.config.strategy import StrategyConfig


def check_overlap_rules(st: "StrategyConfig") -> None:
    """Megatron-LM's validate_args (training/arguments.py) on the overlap options: the
    parameter gather overlaps only with the gradient reduce and a sharded optimizer, TP's
    communication only with sequence parallelism (Megatron turns SP off at TP 1); delayed
    weight gradients and fine-grained activation offload need TransformerEngine layers (and
    the former, beside the overlapped gradient reduce or without gradient-accumulation
    fusion, TE 2.8 / 2.7 where the strategy names its version)."""
    if st.overlap_param_gather:
        if not st.overlap_grad_reduce:
            raise ConfigError("overlap_param_gather", "needs overlap_grad_reduce (Megatron: 'Must use "
                              "--overlap-param-gather with --overlap-grad-reduce')")
        if st.zero_state == 0:
            raise ConfigError("overlap_param_gather", "needs the distributed optimizer or FSDP (zero_state >= 1), "
                              "as Megatron")
    if st.tp_comm_overlap and not (st.tp_size > 1 and st.enable_sequence_parallel):
        raise ConfigError("tp_comm_overlap", "needs TP > 1 with sequence parallelism (Megatron: 'Tensor parallel "
                          "communication/GEMM overlap can happen only when sequence parallelism is enabled')")
    te = st.transformer_impl == "transformer_engine"
    if st.delay_wgrad_compute:
        if not te:
            raise ConfigError("delay_wgrad_compute", "needs TransformerEngine layers (Megatron)")
        if st.overlap_grad_reduce and st.te_version and not st.te_at_least("2.8"):
            raise ConfigError("delay_wgrad_compute", f"with overlap_grad_reduce needs TransformerEngine 2.8 or later "
                              f"(te_version {st.te_version}), as Megatron")
        if not st.gradient_accumulation_fusion and st.te_version and not st.te_at_least("2.7"):
            raise ConfigError("delay_wgrad_compute", f"without gradient_accumulation_fusion needs TransformerEngine 2.7 "
                              f"or later (te_version {st.te_version}), as Megatron")
    if st.fine_grained_activation_offloading and not te:
        raise ConfigError("fine_grained_activation_offloading", "needs TransformerEngine layers (Megatron)")


def check_optimizer_offload_rules(st: "StrategyConfig") -> None:
    """Megatron's --optimizer-cpu-offload (training/arguments.py, validate_args): it runs on the
    precision-aware optimizer's code path, and with fp8 parameter gathers only under delayed
    scaling. Its HybridDeviceOptimizer (optimizer/cpu_offloading/hybrid_optimizer.py) steps
    torch's Adam on fp32 copies of the parameters (``param_update_in_fp32``) on both devices,
    so lower-precision masters or moments asked for are not what runs. DeepSpeed offloads
    with its own engine; torchtitan has no optimizer-only offload (its CPUOffloadPolicy moves
    the parameters and gradients too)."""
    if not st.optimizer_cpu_offload:
        return
    if st.fsdp_impl == "torch_fsdp2":
        raise ConfigError("optimizer_cpu_offload", "torchtitan has no optimizer-only offload (FSDP2's CPUOffloadPolicy "
                          "moves parameters and gradients too, not modelled)")
    if st.fsdp_impl == "deepspeed":
        return
    if st.fsdp_impl == "megatron_torch_fsdp2":
        raise ConfigError("optimizer_cpu_offload", "runs on the distributed optimizer's precision-aware path, which "
                          "Megatron refuses with --use-torch-fsdp2 (fsdp_impl megatron_torch_fsdp2)")
    if not st.use_precision_aware_optimizer:
        raise ConfigError("optimizer_cpu_offload", "needs use_precision_aware_optimizer (Megatron: 'The optimizer cpu "
                          "offload must be used in conjunction with --use-precision-aware-optimizer')")
    if st.fp8_param_gather and st.fp8_recipe != "delayed":
        raise ConfigError("fp8_param_gather", "with optimizer_cpu_offload needs fp8_recipe delayed (Megatron)")
    for field in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if getattr(st, field) != "fp32":
            raise ConfigError(field, "must be fp32 with optimizer_cpu_offload: Megatron's HybridDeviceOptimizer steps "
                              "torch's Adam on fp32 copies of the parameters whatever it says")


def check_megatron_torch_fsdp2(st: "StrategyConfig") -> None:
    """Megatron-LM's own --use-torch-fsdp2 (``fsdp_impl megatron_torch_fsdp2``; validate_args),
    the strategy's rules: no pipeline or expert parallelism, no gradient-accumulation fusion,
    no fp16, no HSDP replicas (its mesh is the data-parallel group), and fp8 parameter
    gathers turned off (the model's: ``check_megatron_torch_fsdp2_model``)."""
    if st.pp_size > 1:
        raise ConfigError("pp_size", "--use-torch-fsdp2 is not supported with pipeline parallelism (Megatron): pp_size 1")
    if st.ep_size > 1:
        raise ConfigError("ep_size", "--use-torch-fsdp2 is not supported with expert parallelism (Megatron): ep_size 1")
    if st.gradient_accumulation_fusion:
        raise ConfigError("gradient_accumulation_fusion", "--use-torch-fsdp2 is not supported with gradient accumulation "
                          "fusion (Megatron)")
    if st.dtype == "fp16":
        raise ConfigError("dtype", "--use-torch-fsdp2 is not supported with fp16 (Megatron)")
    if st.fsdp_replicate_size > 1:
        raise ConfigError("fsdp_replicate_size", "--use-torch-fsdp2 shards over the whole data-parallel group "
                          "(Megatron's --num-distributed-optimizer-instances needs the distributed optimizer): 1")
    if st.fp8_param_gather:
        raise ConfigError("fp8_param_gather", "Megatron turns it off with --use-torch-fsdp2 (bf16 all-gathers)")


def fsdp_impl_fields(impl: str | None) -> dict[str, object]:
    """The fields choosing ``impl`` brings with it (a search candidate's, the app's):
    Megatron's --use-torch-fsdp2 runs without gradient-accumulation fusion, which
    ``check_megatron_torch_fsdp2`` refuses."""
    return {"gradient_accumulation_fusion": False} if impl == "megatron_torch_fsdp2" else {}


def check_megatron_torch_fsdp2_model(model: "ModelConfig") -> None:
    """Megatron's --use-torch-fsdp2 rule on the model: untied embeddings."""
    if not model.untie_embeddings_and_output_weights:
        raise ConfigError("untie_embeddings_and_output_weights", "--use-torch-fsdp2 requires "
                          "--untie-embeddings-and-output-weights (Megatron)")


def check_precision_rules(st: "StrategyConfig") -> None:
    """The fp8 recipe's and the router padding's rules (strategy fields only)."""
    if st.fp8_on and st.fp8_recipe == "delayed" and st.first_last_layers_bf16:
        raise ConfigError("first_last_layers_bf16", "delayed scaling does not support first / last layers in BF16 (Megatron)")
    if st.fp8_on and st.recomputed_modules & {"moe_act", "layernorm"}:
        if st.fp8_recipe == "delayed":
            raise ConfigError("megatron_recompute_modules", "delayed scaling does not support moe_act and layernorm "
                              "recompute for fp8 (Megatron)")
        if st.te_version and not st.te_at_least("2.6"):
            raise ConfigError("megatron_recompute_modules", f"moe_act and layernorm recompute for fp8 need "
                              f"TransformerEngine 2.6 or later (te_version {st.te_version}), as Megatron")
    if st.moe_router_padding_for_quantization:
        if not (st.fp8_on or st.fp4_on):
            raise ConfigError("moe_router_padding_for_quantization", "needs fp8 or fp4 (Megatron)")
        if st.moe_dispatcher_policy == "all_gather":
            raise ConfigError("moe_router_padding_for_quantization", "is not supported by the all_gather dispatcher (Megatron)")


def check_moe_rules(model: "ModelConfig", st: "StrategyConfig") -> None:
    """The router's, the capacity's and the MoE recompute modules' rules."""
    if not model.is_moe:
        return
    if model.topk == 1 and model.moe_router_score_function == "softmax" and not model.moe_router_pre_softmax:
        # a softmax over one selected logit has a zero gradient
        raise ConfigError("moe_router_pre_softmax", "must be true with top-1 softmax routing (Megatron: 'Please use "
                          "--moe-router-pre-softmax when topk is 1')")
    if model.moe_router_enable_expert_bias and model.moe_router_score_function != "sigmoid":
        raise ConfigError("moe_router_enable_expert_bias", "aux-loss-free expert bias needs the sigmoid score "
                          "function (Megatron)")
    if model.add_bias_linear and st.etp_size > 1:
        raise ConfigError("etp_size", "linear biases in MoE layers need etp_size 1 (Megatron: 'Bias in Moe is only "
                          "supported when ETP==1')")
    if model.moe_pad_expert_input_to_capacity and model.capacity is None:
        raise ConfigError("capacity", "must be set to pad expert inputs to capacity (Megatron: "
                          "moe_expert_capacity_factor)")
    if "moe_act" in st.recomputed_modules and st.group_linear_mode == "serial":
        raise ConfigError("megatron_recompute_modules", "moe_act recompute needs the grouped GEMM experts "
                          "(group_linear_mode grouped; Megatron: --moe-grouped-gemm)")
    if "shared_experts" in st.recomputed_modules and model.moe_shared_expert_intermediate_size and st.moe_shared_expert_overlap:
        raise ConfigError("megatron_recompute_modules", "shared_experts recompute cannot work with "
                          "moe_shared_expert_overlap (Megatron)")
