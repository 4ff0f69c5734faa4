"""What megatron-core refuses at start-up, refused here too (config/megatron_rules.py): each
combination is estimated or refused as megatron-core 0.19's own TransformerConfig accepts or
refuses it (constructed on CPU when megatron-core is installed), and the ConfigError names the
field to change."""

from __future__ import annotations

import warnings

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate

SYSTEM = load_system("h100-sxm-80gb")
MOE = load_model("mixtral-8x7b").with_updates({"layer_num": 2})
EP = load_strategy("ep8_pp1_dp8_mbs1")
DENSE = load_model("llama3.1-8b").with_updates({"layer_num": 2})
TP = load_strategy("tp2_pp1_dp4_mbs1")
SELECTIVE = {"megatron_recompute": True}

# (name, model, strategy updates, model updates, the field refused or None, megatron-core's TransformerConfig kwargs)
CASES = [
    ("top-1 softmax", MOE, {}, {"topk": 1}, "moe_router_pre_softmax", {"moe_router_topk": 1}),
    ("top-1 pre-softmax", MOE, {}, {"topk": 1, "moe_router_pre_softmax": True}, None,
     {"moe_router_topk": 1, "moe_router_pre_softmax": True}),
    ("expert bias, softmax", MOE, {}, {"moe_router_enable_expert_bias": True}, "moe_router_enable_expert_bias",
     {"moe_router_enable_expert_bias": True}),
    ("expert bias, sigmoid", MOE, {}, {"moe_router_enable_expert_bias": True, "moe_router_score_function": "sigmoid"}, None,
     {"moe_router_enable_expert_bias": True, "moe_router_score_function": "sigmoid"}),
    ("padding without a capacity", MOE, {}, {"moe_pad_expert_input_to_capacity": True, "capacity": None}, "capacity",
     {"moe_pad_expert_input_to_capacity": True}),
    ("padding to capacity 1", MOE, {}, {"moe_pad_expert_input_to_capacity": True, "capacity": 1.0}, None,
     {"moe_pad_expert_input_to_capacity": True, "moe_expert_capacity_factor": 1.0}),
    ("moe_act recompute, sequential experts", MOE, {**SELECTIVE, "megatron_recompute_modules": ["moe_act"],
     "group_linear_mode": "serial"}, {}, "megatron_recompute_modules",
     {"recompute_granularity": "selective", "recompute_modules": ["moe_act"]}),
    ("moe_act recompute, grouped GEMM", MOE, {**SELECTIVE, "megatron_recompute_modules": ["moe_act"]}, {}, None,
     {"recompute_granularity": "selective", "recompute_modules": ["moe_act"], "moe_grouped_gemm": True}),
    ("delayed fp8, first / last layers bf16", DENSE, {"fp8": True, "fp8_recipe": "delayed", "first_last_layers_bf16": True},
     {}, "first_last_layers_bf16", {"fp8": "e4m3", "fp8_recipe": "delayed", "first_last_layers_bf16": True}),
    ("tensorwise fp8, first / last layers bf16", DENSE,
     {"fp8": True, "fp8_recipe": "tensorwise", "first_last_layers_bf16": True}, {}, None,
     {"fp8": "e4m3", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True}),
    ("delayed fp8, layernorm recompute", DENSE, {"fp8": True, "fp8_recipe": "delayed", **SELECTIVE,
     "megatron_recompute_modules": ["layernorm"]}, {}, "megatron_recompute_modules",
     {"fp8": "e4m3", "fp8_recipe": "delayed", "recompute_granularity": "selective", "recompute_modules": ["layernorm"]}),
    ("linear biases, expert TP 2", MOE, {"tp_size": 2, "ep_size": 4, "etp_size": 2, "enable_sequence_parallel": True},
     {"add_bias_linear": True}, "etp_size", {"add_bias_linear": True, "expert_tensor_parallel_size": 2}),
    ("linear biases, expert TP 1", MOE, {"tp_size": 2, "ep_size": 4, "etp_size": 1, "enable_sequence_parallel": True},
     {"add_bias_linear": True}, None, {"add_bias_linear": True, "expert_tensor_parallel_size": 1}),
    ("router padding without fp8", MOE, {"moe_router_padding_for_quantization": True}, {},
     "moe_router_padding_for_quantization", {"moe_router_padding_for_quantization": True}),
]


def _ours(model, st_upd, m_upd):
    strategy = (TP if model is DENSE else EP).with_updates(st_upd)
    return Estimate(model.with_updates(m_upd) if m_upd else model, strategy, SYSTEM).cost()


@pytest.mark.parametrize("name, model, st_upd, m_upd, field, _", CASES, ids=[c[0] for c in CASES])
def test_refused_as_megatron_refuses(name, model, st_upd, m_upd, field, _) -> None:
    if field is None:
        assert _ours(model, st_upd, m_upd).duration_time_per_iter > 0
    else:
        with pytest.raises(ConfigError) as exc:
            _ours(model, st_upd, m_upd)
        assert exc.value.field == field and "Megatron" in exc.value.rule, exc.value


@pytest.mark.parametrize("name, model, st_upd, m_upd, field, kwargs", CASES, ids=[c[0] for c in CASES])
def test_megatron_core_agrees(name, model, st_upd, m_upd, field, kwargs) -> None:
    """The same combination handed to megatron-core's TransformerConfig: refused there exactly
    where it is refused here."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "bf16": True, "params_dtype": torch.bfloat16}
    if model is MOE:
        base.update(num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if field is None:
            TransformerConfig(**{**base, **kwargs})
        else:
            with pytest.raises((ValueError, AssertionError)):
                TransformerConfig(**{**base, **kwargs})


def test_router_padding_needs_a_dispatcher_that_pads() -> None:
    """--moe-router-padding-for-quantization with the all-gather dispatcher: Megatron refuses it
    ('allgather and alltoall_seq dispatcher does not support ...'; its TransformerEngine version
    check comes first on a machine without TE, so this one is checked here only)."""
    with pytest.raises(ConfigError) as exc:
        _ours(MOE, {"moe_router_padding_for_quantization": True, "fp8": True, "fp8_recipe": "blockwise",
                    "moe_dispatcher_policy": "all_gather"}, {})
    assert exc.value.field == "moe_router_padding_for_quantization"


@pytest.mark.parametrize("updates, field", [
    ({"overlap_param_gather": True, "overlap_grad_reduce": False}, "overlap_param_gather"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True, "zero_state": 0}, "overlap_param_gather"),
    ({"tp_comm_overlap": True, "enable_sequence_parallel": False}, "tp_comm_overlap"),
    ({"tp_comm_overlap": True, "tp_size": 1, "enable_sequence_parallel": False}, "tp_comm_overlap"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True, "tp_comm_overlap": True}, None),
])
def test_overlap_options_as_megatron_validates_them(updates, field) -> None:
    """Megatron-LM's validate_args: --overlap-param-gather needs --overlap-grad-reduce and the
    distributed optimizer (or an FSDP), --tp-comm-overlap sequence parallelism (which Megatron
    turns off at TP 1)."""
    st = TP.with_updates({"enable_sequence_parallel": True})
    if field is None:
        assert Estimate(DENSE, st.with_updates(updates), SYSTEM).cost().duration_time_per_iter > 0
        return
    with pytest.raises(ConfigError) as exc:
        st.with_updates(updates)
    assert exc.value.field == field and "Megatron" in exc.value.rule


@pytest.mark.parametrize("updates, field", [
    ({"optimizer_cpu_offload": True}, "optimizer_cpu_offload"),
    ({"optimizer_cpu_offload": True, "use_precision_aware_optimizer": True, "fp8": True, "fp8_recipe": "tensorwise",
      "fp8_param_gather": True}, "fp8_param_gather"),
    ({"optimizer_cpu_offload": True, "use_precision_aware_optimizer": True, "exp_avg_sq_dtype": "bf16"}, "exp_avg_sq_dtype"),
    ({"optimizer_cpu_offload": True, "zero_state": 3, "fsdp_impl": "torch_fsdp2"}, "optimizer_cpu_offload"),
    ({"optimizer_cpu_offload": True, "use_precision_aware_optimizer": True, "fp8": True, "fp8_recipe": "delayed",
      "fp8_param_gather": True}, None),
    ({"optimizer_cpu_offload": True, "fsdp_impl": "deepspeed"}, None),
])
def test_optimizer_offload_as_megatron_validates_it(updates, field) -> None:
    """Megatron-LM's validate_args: --optimizer-cpu-offload runs on the precision-aware
    optimizer's path, with --fp8-param-gather only under delayed scaling; its
    HybridDeviceOptimizer keeps fp32 states (a lower dtype would not be what runs). DeepSpeed's
    ZeRO-Offload is its own; torchtitan has none for the optimizer alone."""
    st = TP.with_updates({"zero_state": 1})
    if field is None:
        assert Estimate(DENSE, st.with_updates(updates), SYSTEM).cost().duration_time_per_iter > 0
        return
    with pytest.raises(ConfigError) as exc:
        st.with_updates(updates)
    assert exc.value.field == field


def test_mtp_needs_rotary_or_no_positions() -> None:
    """Megatron-LM's validate_args: Multi-Token Prediction with rope or none, not learned
    absolute positions (Megatron's default when --position-embedding-type is left out)."""
    mtp = load_model("deepseek-v3-mtp")
    assert mtp.mtp_num_layers and mtp.with_updates({"position_embedding_type": "none"}).mtp_num_layers
    with pytest.raises(ConfigError) as exc:
        mtp.with_updates({"position_embedding_type": "learned_absolute"})
    assert exc.value.field == "position_embedding_type" and "Megatron" in exc.value.rule


def test_position_table_covers_the_sequence() -> None:
    """Megatron asserts --max-position-embeddings >= --seq-length (and requires the flag): a
    learned table shorter than the sequence is refused; exported flags state the sequence
    length where a model has no value or a rotary one is shorter (no table to size)."""
    from simumax.export.megatron_flags import model_flags

    gpt = load_model("gpt3-175b").with_updates({"layer_num": 2, "max_position_embeddings": 2048,
                                                "position_embedding_type": "learned_absolute"})
    st = TP.with_updates({"seq_len": 4096})
    with pytest.raises(ConfigError) as exc:
        Estimate(gpt, st, SYSTEM).cost()
    assert exc.value.field == "seq_len" and "2048" in exc.value.rule
    assert "--max-position-embeddings 2048" in model_flags(gpt, 2048)
    rope = DENSE.with_updates({"max_position_embeddings": 2048})
    assert "--max-position-embeddings 4096" in model_flags(rope, 4096)
    assert "--max-position-embeddings 8192" in model_flags(DENSE.with_updates({"max_position_embeddings": None}), 8192)


@pytest.mark.parametrize("updates, field", [
    ({"te_version": "2.7"}, "delay_wgrad_compute"),
    ({"te_version": "2.8"}, None),
    ({"te_version": None}, None),  # no version named: nothing to hold against it
    ({"overlap_grad_reduce": False, "gradient_accumulation_fusion": False, "te_version": "2.6"}, "delay_wgrad_compute"),
    ({"overlap_grad_reduce": False, "gradient_accumulation_fusion": False, "te_version": "2.7"}, None),
])
def test_delayed_weight_gradients_as_megatron_validates_them(updates, field) -> None:
    """Megatron-LM's validate_args: --delay-wgrad-compute beside --overlap-grad-reduce needs
    TransformerEngine 2.8, without gradient-accumulation fusion 2.7 (where the strategy says
    its TE version); it and fine-grained activation offload need TE layers."""
    base = {"delay_wgrad_compute": True, "overlap_moe_expert_parallel_comm": True, "overlap_grad_reduce": True}
    if field is None:
        assert Estimate(MOE, EP.with_updates({**base, **updates}), SYSTEM).cost().duration_time_per_iter > 0
        return
    with pytest.raises(ConfigError) as exc:
        EP.with_updates({**base, **updates})
    assert exc.value.field == field and "TransformerEngine" in exc.value.rule
    with pytest.raises(ConfigError, match="TransformerEngine layers"):
        EP.with_updates({"fine_grained_activation_offloading": True, "offload_modules": ["core_attn"],
                         "transformer_impl": "local"})
