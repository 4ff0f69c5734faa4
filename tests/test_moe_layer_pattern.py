"""Which layers of a MoE model are MoE: ``moe_layer_freq`` (Megatron's --moe-layer-freq) and
``dense_layers``; megatron-core ``gpt_layer_specs.get_gpt_decoder_layer_specs``: an int N
makes layer i MoE when i % N == 0, a list gives one 0/1 per layer."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate


def _mixtral(**kw):
    return load_model("mixtral-8x7b").with_updates({"layer_num": 4, **kw})


def test_which_layers_are_moe() -> None:
    kinds = lambda m, n=6: [m.is_moe_layer(i) for i in range(n)]  # noqa: E731  (4 layers, then MTP indices)
    assert kinds(_mixtral()) == [True] * 6
    assert kinds(_mixtral(moe_layer_freq=2)) == [True, False, True, False, False, False]  # MTP: the last layer's kind
    assert kinds(_mixtral(moe_layer_freq=[0, 1, 1, 0])) == [False, True, True, False, False, False]
    assert kinds(_mixtral(moe_layer_freq=2, dense_layers=1)) == [False, False, True, False, False, False]
    assert kinds(_mixtral(dense_layers=1)) == [False, True, True, True, True, True]
    assert not any(kinds(load_model("llama3-8b")))
    for bad in ([0, 1], [0, 1, 2, 1], 0):
        with pytest.raises(ConfigError, match="moe_layer_freq"):
            _mixtral(moe_layer_freq=bad)


def test_dense_layers_of_a_pattern_are_dense_mlps_in_the_estimate() -> None:
    """Every other layer MoE: half the expert parameters, the other layers' MLPs dense
    (intermediate_size), and a faster, smaller step than every layer MoE."""
    st = load_strategy("ep4_pp2_dp4_mbs1").with_updates({"pp_size": 1, "world_size": 8, "ep_size": 8, "seq_len": 4096})
    sy = load_system("h100-sxm-80gb")
    every, half = (Estimate(_mixtral(moe_layer_freq=f), st, sy) for f in (1, 2))
    modules = {(o.layer, o.module) for c in half.chunks for o in c.ops}
    assert (0, "router") in modules and (1, "router") not in modules and (1, "fc1") in modules and (0, "fc1") not in modules
    experts = lambda e: sum(o.expert_params for c in e.chunks for o in c.ops)  # noqa: E731
    assert experts(half) * 2 == experts(every)
    assert half.cost().duration_time_per_iter < every.cost().duration_time_per_iter
    assert half.memory().peak_mem < every.memory().peak_mem


def test_moe_layer_freq_through_megatron_flags_and_hf() -> None:
    from simumax.export.megatron_flags import megatron_flags, model_flags
    from simumax.importers.hf import model_from_hf
    from simumax.importers.megatron_args import parse_megatron_args

    st = load_strategy("ep4_pp2_dp4_mbs1").with_updates({"pp_size": 1, "world_size": 8, "ep_size": 8, "seq_len": 4096})
    for freq, dense in ((2, 0), ([0, 1, 1, 0], 0), (1, 1), (2, 1)):
        m = _mixtral(moe_layer_freq=freq, dense_layers=dense)
        back, _, notes = parse_megatron_args(model_flags(m) + megatron_flags(st, m), world_size=8)
        assert [back.is_moe_layer(i) for i in range(4)] == [m.is_moe_layer(i) for i in range(4)] and not notes
    assert "--moe-layer-freq 2" in model_flags(_mixtral(moe_layer_freq=2))
    # transformers' Qwen2-MoE: MoE when (i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16,
           "intermediate_size": 5632, "num_hidden_layers": 6, "vocab_size": 151936, "num_experts": 60,
           "moe_intermediate_size": 1408, "num_experts_per_tok": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    qwen, notes = model_from_hf(cfg)
    assert [qwen.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert not any("decoder_sparse_step" in n or "mlp_only_layers" in n for n in notes)
    assert not qwen.moe_shared_expert_gate  # no shared expert here
    gated, notes = model_from_hf({**cfg, "shared_expert_intermediate_size": 5632})  # Qwen2MoeSparseMoeBlock's shared_expert_gate
    assert gated.moe_shared_expert_gate and gated.moe_shared_expert_intermediate_size == 5632
    assert not any("gate" in n for n in notes)
