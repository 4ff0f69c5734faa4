"""Multi-token prediction (issue 22 part 2): parameters and FLOPs by hand, placement on
the last stage, the layout's m, the flags and the Hugging Face field."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.export.megatron_flags import model_flags
from simumax.importers.hf import model_from_hf
from simumax.importers.megatron_args import parse_megatron_args

SYSTEM = load_system("h100-sxm-80gb")
ST = {"seq_len": 4096, "micro_batch_num": 4, "world_size": 8, "ep_size": 8}


def _est(layers: int, mtp: int, **st) -> Estimate:
    m = load_model("deepseek-v3").with_updates({"layer_num": layers, "dense_layers": 1, "mtp_num_layers": mtp})
    return Estimate(m, load_strategy({**ST, **st}), SYSTEM)


def test_mtp_parameters_and_flops_by_hand() -> None:
    """One MTP depth = eh_proj (2h x h) + enorm, hnorm, final norm (h each) + one MoE layer
    like the decoder's; it shares the embedding and the output head. Its FLOPs per token:
    that layer's, the projection's 2 * 2h * h and the shared head's 2 * h * V, each x3
    for forward and backward (dgrad + wgrad)."""
    h, vocab = 7168, 129280
    base, more, mtp = _est(3, 0), _est(4, 0), _est(3, 1)
    moe_layer = more.params.total - base.params.total
    assert mtp.params.total == base.params.total and mtp.params.active == base.params.active  # published counts leave MTP out
    assert mtp.params.mtp == 2 * h * h + 3 * h + moe_layer
    # DeepSeek-V3: 671 B; its MTP module "14 B" counts its own embedding and head copies
    full = Estimate(load_model("deepseek-v3").with_updates({"mtp_num_layers": 1}), load_strategy({**ST, "world_size": 64, "ep_size": 64}), SYSTEM)
    assert round(full.params.total / 1e9) == 671
    assert round((full.params.mtp + 2 * vocab * h) / 1e9, 1) == 13.5
    tokens = ST["seq_len"] * ST["micro_batch_num"] * 8  # dp 8 (ep lives inside dp)
    extra = mtp.model_flops_per_iter() - base.model_flops_per_iter()
    layer = more.model_flops_per_iter() - base.model_flops_per_iter()
    assert extra == pytest.approx(layer + 3 * tokens * (2 * 2 * h * h + 2 * h * vocab), rel=1e-9)


def test_mtp_sits_on_the_last_stage_and_costs_there() -> None:
    plain, with_mtp = _est(4, 0, pp_size=2, world_size=16), _est(4, 1, pp_size=2, world_size=16)
    assert [any(o.name.startswith("mtp0.") for o in s.ops) for s in with_mtp.stages] == [False, True]
    assert with_mtp.stage_times[0].total == plain.stage_times[0].total
    assert with_mtp.stage_times[1].total > plain.stage_times[1].total
    m0, m1 = plain.memory().stages[1], with_mtp.memory().stages[1]
    assert m1.weights > m0.weights and m1.fwd_activation_cache_per_micro_batch > m0.fwd_activation_cache_per_micro_batch
    # the last stage holds a copy of the word embedding: its gradient is all-reduced with the first stage's
    assert with_mtp.embedding_grad_sync[0] > 0 and plain.embedding_grad_sync[0] == 0


def test_mtp_in_layouts_flags_and_hf() -> None:
    layout = {"pp_size": 2, "world_size": 16, "pipeline_model_parallel_layout": "Ett|ttmL"}
    assert [len(s.layers) for s in _est(4, 1, **layout).stages] == [2, 2]
    with pytest.raises(ConfigError, match="MTP layers"):
        _est(4, 0, **layout).stages  # the layout has an m, the model no MTP
    m = load_model("deepseek-v3-mtp")
    assert m.mtp_num_layers == 1 and "--mtp-num-layers 1" in model_flags(m)
    args = " ".join(model_flags(m)) + " --seq-length 4096 --micro-batch-size 1"
    assert parse_megatron_args(args)[0].mtp_num_layers == 1
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280, "q_lora_rank": 1536,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
           "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3, "n_shared_experts": 1,
           "num_nextn_predict_layers": 1, "hidden_act": "silu", "max_position_embeddings": 163840}
    assert model_from_hf(cfg, "ds")[0].mtp_num_layers == 1


def test_mtp_layers_renamed_from_their_kind_are_built_for_themselves() -> None:
    """The MTP block's layers (global index layer_num + depth) come, like the decoder's,
    renamed from the first layer of their kind (graph/relabel.py): equal to a direct build."""
    est = _est(3, 2, pp_size=1)
    est.chunks
    src = est.layer_profiles.source
    for k in (3, 4):
        assert src.layer(k, False) == src.built_layer(k, False)
        assert src.layer(k, False)[0].name.startswith(f"L{k}.")
