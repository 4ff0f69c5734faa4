"""Importing Hugging Face config.json files and Megatron-LM command lines; exporting flags."""

from __future__ import annotations

import json
from typing import Callable

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags, model_flags
from simumax.importers.hf import model_from_hf
from simumax.importers.megatron_args import parse_megatron_args
from tests.conftest import run_cli


# the fields of the published config.json files that matter (values as on the Hugging Face hub)
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
             "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "hidden_act": "silu",
             "max_position_embeddings": 8192, "tie_word_embeddings": False}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False}
MIXTRAL_8X7B = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "hidden_act": "silu", "num_local_experts": 8,
                "num_experts_per_tok": 2, "tie_word_embeddings": False}
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "experts_per_token": 4, "head_dim": 64,
               "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
               "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
               "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
               "num_local_experts": 32, "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0,
               "tie_word_embeddings": False, "vocab_size": 201088}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "intermediate_size": 6144, "num_attention_heads": 32,
                 "num_hidden_layers": 48, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "hidden_act": "silu",
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "tie_word_embeddings": False}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
               "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
               "hidden_act": "silu", "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
               # the gate (DeepSeek-V3 config.json): sigmoid, 8 groups / 4, x2.5, aux-loss-free bias, seq aux
               "scoring_func": "sigmoid", "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
               "topk_method": "noaux_tc", "norm_topk_prob": True, "seq_aux": True, "aux_loss_alpha": 0.001}


# Gemma 2, Phi-3 and OLMo 2 config.json (google/gemma-2-9b, google/gemma-2-2b,
# microsoft/Phi-3-mini-4k-instruct, allenai/OLMo-2-1124-7B; the fields that matter) and
# their safetensors parameter totals
GEMMA2_9B = {"architectures": ["Gemma2ForCausalLM"], "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
             "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
             "max_position_embeddings": 8192, "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
             "query_pre_attn_scalar": 256, "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000}
GEMMA2_2B = {**GEMMA2_9B, "hidden_size": 2304, "intermediate_size": 9216, "num_attention_heads": 8, "num_hidden_layers": 26,
             "num_key_value_heads": 4}
PHI3_MINI = {"architectures": ["Phi3ForCausalLM"], "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
             "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
             "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False, "vocab_size": 32064}
OLMO2_7B = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 11008, "max_position_embeddings": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 32, "rope_theta": 500000, "tie_word_embeddings": False, "vocab_size": 100352}


# Llama 4's text model (transformers Llama4TextConfig; Meta's published sizes: Maverick 400B
# total / 17B active, 128 experts, MoE every other layer; Scout 109B / 17B, 16 experts, every
# layer, its total with the vision encoder)
LLAMA4_TEXT = {"hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_attention_heads": 40,
               "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48, "num_experts_per_tok": 1,
               "vocab_size": 202048, "use_qk_norm": True, "attention_chunk_size": 8192, "tie_word_embeddings": False,
               "hidden_act": "silu", "rope_theta": 500000.0}


def test_hf_llama4_text_model() -> None:
    """Maverick: 400B total, 17B active to the published digits; MoE layers 1, 3, 5, ... (the
    last of each interleave step), dense MLPs of intermediate_size_mlp between; top-1
    sigmoid routing beside one shared expert; what is approximated said in notes."""
    mav, notes = model_from_hf({"architectures": ["Llama4ForConditionalGeneration"],
                                "text_config": {**LLAMA4_TEXT, "num_local_experts": 128, "interleave_moe_layer_step": 2}})
    t, a = _params(mav)
    assert round(t) == 401 and round(a) == 17  # 400.7 / 17.2 (Meta: 400 / 17)
    assert [mav.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (mav.intermediate_size, mav.moe_ffn_hidden_size, mav.moe_shared_expert_intermediate_size) == (16384, 8192, 8192)
    assert mav.topk == 1 and mav.moe_router_score_function == "sigmoid" and mav.qk_layernorm
    assert [mav.uses_rope(i) for i in range(8)] == [True, True, True, False] * 2  # NoPE every 4th (interval 4)
    assert any("chunked attention" in n for n in notes) and any("moe_apply_probs_on_input" in n for n in notes)
    scout, _ = model_from_hf({"architectures": ["Llama4ForCausalLM"], **LLAMA4_TEXT, "num_local_experts": 16,
                              "interleave_moe_layer_step": 1})
    assert all(scout.is_moe_layer(i) for i in range(48)) and scout.moe_layer_freq == 1
    assert 105 < _params(scout)[0] < 109 and round(_params(scout)[1]) == 17


def _params(model) -> tuple[float, float]:
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 1}, source="test")
    p = Estimate(model, st, load_system("a100_pcie")).params
    return p.total / 1e9, p.active / 1e9


@pytest.mark.parametrize("cfg,total,active", [
    (LLAMA3_8B, 8.03, 8.03), (MISTRAL_7B, 7.24, 7.24), (MIXTRAL_8X7B, 46.7, 12.9), (QWEN3_30B_A3B, 30.5, 3.3), (DEEPSEEK_V3, 671.0, 37.6),
])
def test_hf_import_matches_published_parameter_counts(cfg, total, active) -> None:
    """To the published figure's last digit (Qwen3-30B-A3B's "3.3B activated" is 3.35
    truncated, so half a unit more is allowed there)."""
    model, notes = model_from_hf(cfg, "m")
    t, a = _params(model)
    digits = 1 if total > 10 else 2
    assert round(t, digits) == total
    assert abs(a - active) <= (0.5 if cfg is not QWEN3_30B_A3B else 1.0) * 10**-digits + 1e-9


@pytest.mark.parametrize("cfg,preset", [(DEEPSEEK_V3, "deepseek-v3-mtp"), (MIXTRAL_8X7B, "mixtral-8x7b"), (QWEN3_30B_A3B, "qwen3-30b-a3b"),
                                        (GPT_OSS_20B, "gpt-oss-20b"), (GEMMA2_9B, "gemma-2-9b")])
def test_hf_import_equals_the_shipped_preset(cfg, preset) -> None:
    """Same model, two routes: every estimate-relevant field agrees (names and pure
    defaults aside), so time and memory agree."""
    model, _ = model_from_hf(cfg, "m")
    # Hugging Face checkpoints train dropless; SimuMax's mixtral file pads to capacity 1
    ref = load_model(preset).with_updates({"moe_pad_expert_input_to_capacity": False, "capacity": None})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"world_size": 8}, source="test")
    a, b = Estimate(model, st, load_system("a100_pcie")), Estimate(ref, st, load_system("a100_pcie"))
    assert a.params.total == b.params.total
    assert a.cost().duration_time_per_iter == pytest.approx(b.cost().duration_time_per_iter, rel=1e-12)
    assert a.memory().peak_mem == pytest.approx(b.memory().peak_mem, rel=1e-12)


def test_hf_sliding_window_layer_patterns() -> None:
    """GPT-OSS's layer_types (sliding, full, ...) is a full layer every 2nd; Mistral windows
    every layer; Qwen's windowed upper layers cannot be said and are noted."""
    m, notes = model_from_hf(GPT_OSS_20B)
    assert (m.window_size, m.window_attn_skip_freq, m.attention_sinks, m.add_bias_linear) == (128, 2, True, True)
    assert [m.attention_window(i) for i in range(4)] == [128, None, 128, None]
    assert not any("bias" in n for n in notes) and any("swiglu_limit" in n for n in notes)
    thirds = {**GPT_OSS_20B, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 8}
    assert model_from_hf(thirds)[0].window_attn_skip_freq == 3
    odd = {**GPT_OSS_20B, "layer_types": ["full_attention"] + ["sliding_attention"] * 23}
    m, notes = model_from_hf(odd)
    assert m.window_size is None and any("layer_types" in n for n in notes)
    assert model_from_hf({**MISTRAL_7B, "sliding_window": 4096})[0].window_size == 4096
    m, notes = model_from_hf({**LLAMA3_8B, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
                              "use_sliding_window": True, "max_window_layers": 28})
    assert m.window_size is None and any("max_window_layers" not in n and "sliding window 4096" in n for n in notes)

def _total(model) -> int:
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 1}, source="test")
    return Estimate(model.with_updates({"padded_vocab_size": False}), st, load_system("a100_pcie")).params.total


@pytest.mark.parametrize("cfg,total", [(GEMMA2_9B, 9_241_705_984), (GEMMA2_2B, 2_614_341_888), (PHI3_MINI, 3_821_079_552),
                                       (OLMO2_7B, 7_298_617_344 - 32 * (8192 - 256))])
def test_hf_gemma2_phi3_olmo2_parameter_counts(cfg, total) -> None:
    """To the parameter: the checkpoints' totals (Gemma 2 with its four norms per layer, the
    sandwich norms; OLMo 2 less the per-layer q / k norm weights it spans over all heads, which
    the model counts per head: 32 x (8192 - 256), said in a note)."""
    model, notes = model_from_hf(cfg, "m")
    assert _total(model) == total
    if cfg is OLMO2_7B:
        assert model.qk_layernorm and any("span all heads" in n for n in notes)


def test_hf_gemma_family() -> None:
    """Gemma 2: gated GeLU as SwiGLU, tied embeddings, sandwich norms, local (4096) and global
    layers alternating from a local first layer; soft-capping and the embedding scale said in
    notes. Gemma 3: its text_config inside the multimodal checkpoint, the Gemma3TextConfig
    defaults it leaves out, per-head q / k norms, five local layers to one global. Gemma 1:
    no sandwich norms, no window."""
    m, notes = model_from_hf(GEMMA2_9B)
    assert m.use_swiglu and not m.untie_embeddings_and_output_weights and m.post_sublayer_norm and not m.qk_layernorm
    assert [m.attention_window(i) for i in range(4)] == [4096, None, 4096, None]
    assert any("GeGLU" in n for n in notes) and any("final logit soft-capping" in n for n in notes)
    assert any("sqrt(hidden_size)" in n for n in notes)
    g3, notes = model_from_hf({"architectures": ["Gemma3ForConditionalGeneration"],
                               "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                                               "num_hidden_layers": 34, "sliding_window": 1024}})
    assert (g3.head_num, g3.kv_head_num, g3.head_size, g3.vocab_size) == (8, 4, 256, 262208)
    assert g3.qk_layernorm and g3.post_sublayer_norm and any("vision tower" in n for n in notes)
    assert [g3.attention_window(i) for i in range(6)] == [1024] * 5 + [None]
    # by hand: q and o (2560 x 2048 each), k and v (2560 x 1024 each), the gated MLP, four norms
    # and the q / k norms per layer; the tied 262,208-row embedding, the final norm
    layer = 2 * 2560 * 2048 + 2 * 2560 * 1024 + 3 * 2560 * 10240 + 4 * 2560 + 2 * 256
    assert _total(g3) == 34 * layer + 262208 * 2560 + 2560 == 3_880_263_168
    g1, _ = model_from_hf({**GEMMA2_9B, "architectures": ["GemmaForCausalLM"], "sliding_window": None})
    assert not g1.post_sublayer_norm and g1.window_size is None and g1.use_swiglu
    phi, _ = model_from_hf(PHI3_MINI)
    assert phi.window_size == 2047 and phi.window_attn_skip_freq is None and phi.untie_embeddings_and_output_weights


def test_post_sublayer_norm_in_the_estimate() -> None:
    """Gemma 2 / 3's sandwich norms: two more norms per layer on the projections' outputs, each
    keeping its input (s x h) for backward; recomputing a sub-block drops its post-norm's
    input; refused with MoE or MLA layers."""
    base = load_model("llama3.1-8b").with_updates({"layer_num": 2})
    st = load_strategy("tp1_pp1_dp8_mbs1")
    plain, post = (Estimate(base.with_updates({"post_sublayer_norm": f}), st, load_system("h100-sxm-80gb")) for f in (False, True))
    mods = [o.module for o in post.chunks[0].ops if o.layer == 0]
    assert mods.index("attn_post_norm") == mods.index("attn_proj") + 1 and mods.index("mlp_post_norm") == mods.index("fc2") + 1
    assert post.params.total - plain.params.total == 2 * 2 * 4096
    act = lambda e: e.memory().stages[0].fwd_activation_cache_per_micro_batch  # noqa: E731
    tokens = st.micro_batch_size * st.seq_len
    assert act(post) - act(plain) == pytest.approx(2 * 2 * tokens * 4096 * 2, rel=1e-3)  # + the rstd (fp32 per token)
    assert post.cost().duration_time_per_iter > plain.cost().duration_time_per_iter
    sub = st.with_updates({"enable_recompute": True, "recompute_granularity": "attn_only", "recompute_layer_num": None})
    plain_r, post_r = (Estimate(base.with_updates({"post_sublayer_norm": f}), sub, load_system("h100-sxm-80gb")) for f in (False, True))
    assert act(post_r) - act(plain_r) == pytest.approx(2 * tokens * 4096 * 2, rel=1e-3)  # the MLP's post-norm only
    with pytest.raises(ConfigError, match="post_sublayer_norm"):
        load_model("mixtral-8x7b").with_updates({"post_sublayer_norm": True})
    with pytest.raises(ConfigError, match="post_sublayer_norm"):  # Megatron-LM has no flag for them
        model_flags(post.model)


# GLM-4.5-Air's config.json (zai-org/GLM-4.5-Air), its layers cut to 4 for the hand count
GLM45_AIR = {"architectures": ["Glm4MoeForCausalLM"], "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
             "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "partial_rotary_factor": 0.5,
             "attention_bias": True, "use_qk_norm": False, "moe_intermediate_size": 1408, "n_routed_experts": 128,
             "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
             "routed_scaling_factor": 1.0, "norm_topk_prob": True, "num_nextn_predict_layers": 1, "vocab_size": 151552,
             "hidden_act": "silu", "tie_word_embeddings": False, "rope_theta": 1000000, "max_position_embeddings": 131072}


def test_hf_glm45_moe_by_hand() -> None:
    """transformers' Glm4Moe: GQA with q/k/v biases (o_proj without), a dense first layer, then
    128 routed experts (top-8) and one shared expert behind a sigmoid router with expert bias;
    parameters by hand on one GPU (the expert bias is a buffer, not a parameter)."""
    m, notes = model_from_hf({**GLM45_AIR, "num_hidden_layers": 4, "num_nextn_predict_layers": 0})
    assert (m.model_type, m.expert_num, m.topk, m.moe_ffn_hidden_size, m.dense_layers) == ("moe", 128, 8, 1408, 1)
    assert (m.moe_shared_expert_intermediate_size, m.moe_router_score_function, m.moe_router_enable_expert_bias) == (1408, "sigmoid", True)
    assert m.add_qkv_bias and not m.add_bias_linear and not m.qk_layernorm and m.moe_router_num_groups is None
    assert not m.moe_pad_expert_input_to_capacity and any("partial_rotary_factor" in n for n in notes)
    h, q, kv, v = 4096, 96 * 128, 8 * 128, 151552
    attn = h * q + q + 2 * (h * kv + kv) + q * h + 2 * h  # q, k, v with biases, o; the two norms
    moe = attn + 128 * 3 * h * 1408 + 3 * h * 1408 + 128 * h  # routed, shared, router
    total = 2 * v * h + attn + 3 * h * 10944 + 3 * moe + h  # untied embeddings, dense layer 0, final norm
    p = Estimate(m, load_strategy({"seq_len": 4096, "world_size": 1}), load_system("h100-sxm-80gb")).params
    assert p.total == total
    full, _ = model_from_hf(GLM45_AIR)
    assert full.mtp_num_layers == 1 and full.layer_num == 46
    glm45 = model_from_hf({**GLM45_AIR, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "use_qk_norm": True})[0]
    assert (glm45.moe_router_num_groups, glm45.moe_router_group_topk, glm45.moe_router_topk_scaling_factor) == (8, 4, 2.5)
    assert glm45.qk_layernorm


def test_hf_notes_and_errors() -> None:
    model, notes = model_from_hf(DEEPSEEK_V3)
    assert model.mtp_num_layers == 1 and not any("multi-token-prediction" in n for n in notes)  # modelled now
    qwen2, notes = model_from_hf({**LLAMA3_8B, "architectures": ["Qwen2ForCausalLM"]})
    assert qwen2.add_qkv_bias and not qwen2.add_bias_linear and not any("bias" in n for n in notes)  # q/k/v only
    llama_bias, notes = model_from_hf({**LLAMA3_8B, "attention_bias": True})
    assert llama_bias.add_qkv_bias and any("output projection's bias" in n for n in notes)  # o_proj's is left out
    assert not model_from_hf(LLAMA3_8B)[0].add_qkv_bias
    with pytest.raises(ConfigError, match="architectures"):
        model_from_hf({**LLAMA3_8B, "architectures": ["BertModel"]})
    with pytest.raises(ConfigError, match="n_routed_experts"):
        model_from_hf({k: v for k, v in DEEPSEEK_V3.items() if k != "n_routed_experts"})


@pytest.mark.parametrize("model,strategy,world", [
    ("llama3-8b", "tp2_pp1_dp4_mbs1_full_recompute", 8), ("llama3-8b", "attn_only_selective", 8),
    ("llama3-70b", "tp1_pp4_vp2_sync_mbs1_mbc8_no_ckpt", 8),
    ("deepseek-v3", "ep8_pp1_dp8_mbs1", 8), ("mixtral-8x7b", "ep4_pp2_dp4_mbs1_full_recompute", 8), ("llama2-7b", "tp4_pp1_dp2_mbs1", 8),
])
def test_megatron_flags_round_trip(model: str, strategy: str, world: int) -> None:
    """export (model + strategy flags) then import: the same estimate. (SimuMax's
    activation-only mlp_recompute has no exact Megatron flag; export writes the nearest,
    --recompute-modules mlp, so presets using it are not round-trip cases.)"""
    m0 = load_model(model)
    if strategy == "attn_only_selective":
        s0 = load_strategy("tp2_pp1_dp4_mbs1_selective_recompute").with_updates({"mlp_recompute": False, "recompute_layer_num": None}, source="test")
    else:  # tier overrides (*_net) are simumax placement hints, not Megatron arguments
        s0 = load_strategy(strategy).with_updates({f"{g}_net": None for g in ("tp", "cp", "ep", "etp", "dp", "pp")}, source="test")
    if model == "deepseek-v3":
        m0 = m0.with_updates({"layer_num": 5}, source="test")
    if m0.is_moe:  # Megatron >= 0.13 dispatches the routing probabilities (no flag says otherwise)
        s0 = s0.with_updates({"dispatch_probs": True}, source="test")
    m, s, notes = parse_megatron_args(model_flags(m0) + megatron_flags(s0, m0), world_size=world)
    assert notes == []
    sys_ = load_system("b200_bf16_ceperm")  # has the tiers every preset strategy names
    a, b = Estimate(m, s, sys_), Estimate(m0, s0, sys_)
    assert a.cost().duration_time_per_iter == pytest.approx(b.cost().duration_time_per_iter, rel=1e-12)
    assert a.memory().peak_mem == pytest.approx(b.memory().peak_mem, rel=1e-12)


def test_megatron_flags_of_routing_limits_and_the_nan_check() -> None:
    """--moe-router-topk-limited-devices N is megatron-core's group-limited routing with one
    group per EP rank (num_groups = EP size, group_topk = N); --no-check-for-nan-in-loss-and-grad
    drops the pass over the main grads before the reduce (a shorter step), and round-trips;
    flags with a real effect that is not modelled are said with the reason."""
    base = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --vocab-size 32000 "
            "--num-experts 64 --moe-router-topk 6 --expert-model-parallel-size 8 --bf16 ")
    m, st, notes = parse_megatron_args(base + "--moe-router-topk-limited-devices 3 --no-check-for-nan-in-loss-and-grad "
                                       "--log-params-norm --use-sharp --distributed-backend nccl", world_size=8)
    assert (m.moe_router_num_groups, m.moe_router_group_topk) == (8, 3) and st.check_for_nan_in_grad is False
    assert any("--log-params-norm (" in n for n in notes) and st.use_sharp
    assert any(n.startswith("--use-sharp:") and "bandwidth" in n for n in notes)
    assert not any(n.startswith("ignored") for n in notes)
    assert "--no-check-for-nan-in-loss-and-grad" in megatron_flags(st, m)
    sy = load_system("h100-sxm-80gb")
    checked = Estimate(m, st.with_updates({"check_for_nan_in_grad": True}), sy)
    assert Estimate(m, st, sy).cost().breakdown["optimizer"] < checked.cost().breakdown["optimizer"]
    # --no-bias-swiglu-fusion: megatron-core's MLP runs the unfused glu (use_fused_swiglu false)
    dense, st2, _ = parse_megatron_args("--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
                                        "--vocab-size 32000 --swiglu --no-bias-swiglu-fusion", world_size=1)
    assert st2.use_fused_swiglu is False and "--no-bias-swiglu-fusion" in megatron_flags(st2, dense)


def test_export_of_a_recompute_megatron_cannot_express_is_a_config_error() -> None:
    """SimuMax's attn_only recompute (the whole attention sub-block) has no Megatron flag:
    export says so as a ConfigError (the CLI's one line, exit 2), not a Python error."""
    st = load_strategy("tp2_pp1_dp4_mbs1_selective_recompute").with_updates(
        {"recompute_granularity": "attn_only"}, source="test")
    with pytest.raises(ConfigError, match="recompute_granularity"):
        megatron_flags(st, load_model("llama3-8b"))
    r = run_cli("export", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "--set", "strategy.enable_recompute=true",
                "--set", "strategy.recompute_granularity=attn_only")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_export_of_selective_recompute_on_some_layers_is_a_config_error() -> None:
    """SimuMax's selective granularities honour recompute_layer_num; Megatron's selective
    recompute (--recompute-modules) applies to every layer, so a count below the model
    chunk's layers has no flag: a ConfigError naming the field, not flags that recompute
    more than the estimate did. Every layer (null, or at least the chunk's count) exports."""
    m = load_model("llama3-8b")  # 32 layers, one chunk
    base = load_strategy("tp2_pp1_dp4_mbs1_selective_recompute")  # SimuMax's file: recompute_layer_num 12
    for granularity in ("selective_recompute", "mlp_only", "sdp_only"):
        st = base.with_updates({"recompute_granularity": granularity}, source="test")
        with pytest.raises(ConfigError, match="recompute_layer_num"):
            megatron_flags(st, m)
        for every in (None, 32):
            assert "--recompute-granularity selective" in megatron_flags(st.with_updates({"recompute_layer_num": every}), m)


def test_megatron_flags_not_modelled_are_said_with_the_reason() -> None:
    """Flags with a real effect the model leaves out (garbage-collection timing, CUDA graphs)
    come back as one note per reason, not as "ignored"."""
    _, _, notes = parse_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 "
                                      "--seq-length 16 --vocab-size 100 --manual-gc --manual-gc-interval 10 "
                                      "--enable-cuda-graph --cuda-graph-scope attn")
    said = [n for n in notes if n.startswith("not modelled")]
    assert len(said) == 2 and "--manual-gc --manual-gc-interval (" in said[0] and "collector" in said[0]
    assert "--enable-cuda-graph --cuda-graph-scope (CUDA graphs" in said[1]
    assert not any(n.startswith("ignored") for n in notes)


def test_megatron_world_size_from_the_launcher(tmp_path) -> None:
    """torchrun's --nproc-per-node x --nnodes (as numbers, variables expanded) is the job's
    world size unless --world-size says otherwise; its rendezvous flags are launcher flags,
    not "ignored" ones; 'gpu' or an elastic range leave the smallest world, as before."""
    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --vocab-size 32000 "
            "--seq-length 2048 --micro-batch-size 1 --global-batch-size 256 --tensor-model-parallel-size 2 "
            "--pipeline-model-parallel-size 2")
    script = tmp_path / "train.sh"
    script.write_text(f"GPUS_PER_NODE=8\nNNODES=4\ntorchrun --nproc_per_node $GPUS_PER_NODE --nnodes=${{NNODES}} "
                      f"--node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port 6000 pretrain_gpt.py {args}\n")
    r = run_cli("import", "megatron", "--file", str(script), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    st = json.loads((tmp_path / "out" / "strategy.json").read_text())
    assert (st["world_size"], st["micro_batch_num"]) == (32, 32)  # DP 8: 256 / 8
    assert "world size 32 from the launcher: --nproc-per-node 8 x --nnodes 4" in r.stderr and "ignored" not in r.stderr
    r = run_cli("import", "megatron", "--file", str(script), "--world-size", "8", "--out", str(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "strategy.json").read_text())["world_size"] == 8
    for launcher, world in (("--nproc-per-node 8", 8), ("--nproc-per-node=gpu --nnodes 2", 4), ("--nproc-per-node 8 --nnodes 1:4", 4),
                            ("--nproc-per-node 4 --nnodes 2:2", 8)):
        _, st, _ = parse_megatron_args(f"{launcher} pretrain_gpt.py {args}")
        assert st.world_size == world, launcher  # 4: TP 2 x PP 2 with DP 1, the smallest


def test_megatron_script_with_unknown_flags_and_errors(tmp_path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py \\\n  --num-layers 4 --hidden-size 1024 \\\n"
                      "  --num-attention-heads 16 --ffn-hidden-size 4096 --vocab-size 32000 --seq-length 2048 \\\n"
                      "  --micro-batch-size 2 --global-batch-size 64 --tensor-model-parallel-size 2 --lr 3e-4  # comment\n"
                      "  --some-new-flag 3\n")
    r = run_cli("import", "megatron", "--file", str(script), "--world-size", "8", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "no effect on time or memory, read past: --lr" in r.stderr and "ignored --some-new-flag" in r.stderr
    st = json.loads((tmp_path / "out" / "strategy.json").read_text())
    assert (st["tp_size"], st["world_size"], st["micro_batch_num"]) == (2, 8, 8)  # 64 / (2 x dp 4)
    with pytest.raises(ConfigError, match="vocab"):
        parse_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 16")
    with pytest.raises(ConfigError, match="global-batch-size"):
        parse_megatron_args("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 16 "
                            "--vocab-size 100 --micro-batch-size 3 --global-batch-size 8", world_size=1)
    m, _, notes = parse_megatron_args("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 128 "
                                      "--seq-length 16 --vocab-size 100 --qk-l2-norm", world_size=1)
    assert m.qk_layernorm and any("--qk-l2-norm" in n for n in notes)  # Llama 4's norm, as the HF importer reads it
    # a hybrid Mamba stack (pretrain_mamba.py): the pattern (its deprecated flag too) sets the
    # layers; Mamba sizes Megatron would refuse and blocks not modelled are ConfigErrors
    hybrid = "--num-layers 4 --hidden-size 512 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 16 --vocab-size 100"
    m, _, _ = parse_megatron_args(hybrid + " --hybrid-override-pattern M-M*", world_size=1)
    assert (m.hybrid_layer_pattern, m.layer_num, m.mamba_heads) == ("M-M*", 4, 16)
    with pytest.raises(ConfigError, match="--mamba-num-groups: must divide"):
        parse_megatron_args(hybrid.replace("512", "64") + " --hybrid-layer-pattern M-M*", world_size=1)
    with pytest.raises(ConfigError, match="DSA"):
        parse_megatron_args(hybrid + " --hybrid-layer-pattern M-D*", world_size=1)
    with pytest.raises(ConfigError, match="--hybrid-attention-ratio"):
        parse_megatron_args(hybrid + " --hybrid-attention-ratio 0.1", world_size=1)


def test_import_cli_one_line_errors(tmp_path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**LLAMA3_8B, "architectures": ["GPT2LMHeadModel"]}))
    for args in (["import", "hf", str(bad)], ["import", "hf", str(tmp_path / "none.json")], ["import", "megatron"]):
        r = run_cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error:")


def test_cli_export_json_then_import_and_presets_json(tmp_path) -> None:
    run = run_cli
    r = run("export", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "--json")
    assert r.returncode == 0, r.stderr
    flags = json.loads(r.stdout)
    r = run("import", "megatron", "--world-size", "8", "--out", str(tmp_path), "--", *" ".join(flags).split())
    assert r.returncode == 0, r.stderr
    r = run("perf", "-m", str(tmp_path / "model.json"), "-s", str(tmp_path / "strategy.json"), "-y", "a100_pcie", "--json")
    ref = run("perf", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "-y", "a100_pcie", "--json")
    assert json.loads(r.stdout)["cost"]["duration_time_per_iter"] == json.loads(ref.stdout)["cost"]["duration_time_per_iter"]
    names = json.loads(run("presets", "system", "--json").stdout)["system"]
    assert {"h100-sxm-80gb", "b200-sxm-180gb", "a100_pcie"} <= set(names)


LAUNCH_SCRIPT = r'''#!/bin/bash
# a Megatron launch script as people write them
TP=2
export PP=4
GPT_ARGS="
    --num-layers 32 \
    --hidden-size 4096 \
    --num-attention-heads 32 \
    --seq-length 4096 \
    --micro-batch-size 1 \
    --global-batch-size 256
"
PARALLEL=(
  --tensor-model-parallel-size ${TP}
  --pipeline-model-parallel-size $PP   # pipeline
)
torchrun --nproc_per_node 8 pretrain_gpt.py \
    $GPT_ARGS \
    "${PARALLEL[@]}" \
    --vocab-size ${VOCAB:-32000} \
    --swiglu --recompute-activations \
    --bf16
'''


def test_import_megatron_launch_script_forms(tmp_path) -> None:
    """GPT_ARGS="..." over lines, a bash array, ${VAR} / $VAR / ${VAR:-default}, comments and
    continuations; Megatron's default FFN size (SwiGLU: 2/3 of 4h, down to a multiple of 64)
    and --recompute-activations (selective core attention)."""
    from simumax.importers.launch_script import megatron_words

    words = megatron_words(LAUNCH_SCRIPT)
    assert words[:2] == ["--nproc_per_node", "8"] and "--tensor-model-parallel-size" in words
    import shlex

    model, st, notes = parse_megatron_args(shlex.join(words), world_size=64)
    assert (st.tp_size, st.pp_size, st.micro_batch_num) == (2, 4, 32)  # 256 / (1 x DP 8)
    assert model.vocab_size == 32000 and model.intermediate_size == int(4 * 4096 * 2 / 3 / 64) * 64 == 10880
    assert st.recompute_mode == "selective" and st.attn_recompute
    assert any("--ffn-hidden-size" in n for n in notes)
    script = tmp_path / "train.sh"
    script.write_text(LAUNCH_SCRIPT)
    out = run_cli("import", "megatron", "--file", str(script), "--world-size", "64")
    assert out.returncode == 0, out.stderr
    bad = tmp_path / "bad.sh"
    bad.write_text('GPT_ARGS="--num-layers 2\n')  # unbalanced quote: one line, exit 2
    out = run_cli("import", "megatron", "--file", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr and "cannot read the script" in out.stderr


def test_perf_with_a_hugging_face_config_says_how_to_convert_it(tmp_path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 64}))
    out = run_cli("perf", "-m", str(cfg), "-s", "tp1_pp1_dp8_mbs1", "-y", "a100_pcie")
    assert out.returncode == 2 and "simumax import hf" in out.stderr and "Traceback" not in out.stderr


def test_rotary_base_and_context_length_travel_with_the_flags(tmp_path) -> None:
    """RoPE base and max positions: read from HF (rope_theta), carried by the published
    presets, exported as --rotary-base / --max-position-embeddings (whole numbers as such)
    and read back."""
    import json

    from simumax.config.loader import load_model
    from simumax.export.megatron_flags import model_flags
    from simumax.importers.hf import load_hf_config
    from simumax.importers.megatron_args import parse_megatron_args

    m = load_model("llama3.1-8b")
    assert (m.rotary_base, m.max_position_embeddings) == (500000, 131072)
    flags = " ".join(model_flags(m))
    assert "--rotary-base 500000" in flags and "--max-position-embeddings 131072" in flags
    assert "--rotary-base 1000000" in " ".join(model_flags(load_model("qwen3-8b")))
    back, _, _ = parse_megatron_args(flags + " --seq-length 4096", world_size=1)
    assert back.rotary_base == 500000 and back.max_position_embeddings == 131072
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": 32,
                               "vocab_size": 128256, "rope_theta": 500000.0, "max_position_embeddings": 131072}))
    hf, _ = load_hf_config(cfg)
    assert hf.rotary_base == 500000 and hf.max_position_embeddings == 131072
    assert load_model("gpt3-175b").rotary_base is None  # learned positions: nothing to export
    assert "--rotary-base" not in " ".join(model_flags(load_model("llama3-8b")))  # SimuMax's file: Megatron's default


def test_megatron_defaults_for_flags_left_out() -> None:
    """A GPT launch line names no architecture switches: Megatron's defaults are LayerNorm,
    learned absolute positions, linear biases, tied embeddings and 0.1 dropout, each said in
    a note where a script might not expect it; a Llama line names them all."""
    gpt = "--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --vocab-size 50257"
    m, s, notes = parse_megatron_args(gpt, world_size=1)
    assert (m.norm_type, m.position_embedding_type, m.add_bias_linear, m.untie_embeddings_and_output_weights) == (
        "layernorm", "learned_absolute", True, False)
    assert s.enable_dropout and m.intermediate_size == 4096 and s.dtype == "fp32"  # no --bf16: Megatron's fp32
    assert {n.split(" not given")[0] for n in notes} >= {"--normalization", "--position-embedding-type",
                                                         "--attention-dropout / --hidden-dropout", "--ffn-hidden-size",
                                                         "--bf16 / --fp16"}
    llama = (gpt + " --bf16 --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --swiglu "
             "--untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0")
    m, s, notes = parse_megatron_args(llama, world_size=1)
    assert (m.norm_type, m.position_embedding_type, m.add_bias_linear, m.untie_embeddings_and_output_weights) == (
        "rmsnorm", "rope", False, True)
    assert not s.enable_dropout and s.dtype == "bf16" and notes == ["--ffn-hidden-size not given: Megatron's default 2688"]
    # context parallelism without --cp-comm-type runs Megatron's default, TransformerEngine's ring
    m, s, notes = parse_megatron_args(llama + " --context-parallel-size 2", world_size=2)
    assert s.cp_comm_type == "p2p" and any(n.startswith("--cp-comm-type not given") for n in notes)
    assert parse_megatron_args(llama + " --context-parallel-size 2 --cp-comm-type a2a", world_size=2)[1].cp_comm_type == "a2a"
    # dropout travels both ways
    on = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"enable_dropout": True})
    assert parse_megatron_args(gpt.split() + megatron_flags(on), world_size=8)[1].enable_dropout
    with pytest.raises(ConfigError, match="--hidden-dropout"):
        parse_megatron_args(gpt + " --hidden-dropout x")
    # a value a config refuses is named by the flag that set it
    for bad, flag in (("--num-layers 0", "--num-layers"), ("--cp-comm-type ring", "--cp-comm-type"),
                      ("--seq-length 0", "--seq-length")):
        with pytest.raises(ConfigError) as exc:
            parse_megatron_args(f"{gpt} {bad}", world_size=1)
        assert exc.value.field == flag


@pytest.mark.parametrize("upd", [
    {"fsdp_impl": "deepspeed", "zero_state": 1}, {"fsdp_impl": "deepspeed", "zero_state": 3, "pp_size": 1},
    {"cpu_offloading": True, "cpu_offloading_num_layers": 4, "pp_size": 1}, {"enable_dropout": True},
    {"zero_state": 3, "pp_size": 1}, {"ddp_average_in_collective": True}, {"gradient_accumulation_fusion": False},
    {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_method": "uniform", "recompute_layer_num": 2},
    {"interleaving_size": 2, "overlap_p2p_comm": True, "micro_batch_num": 8}, {"grad_reduce_in_bf16": True, "zero_state": 1},
    {"ddp_bucket_size": 10_000_000, "overlap_grad_reduce": True},
    {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "fp8", "grad_reduce_in_bf16": True},
    {"use_precision_aware_optimizer": True, "main_params_dtype": "fp16", "store_param_remainders": False},
    {"fp8": True, "fp8_param_gather": True, "zero_state": 1},
    {"use_math_sdp": True, "use_flash_sdp": False},
    {"fsdp_impl": "megatron_torch_fsdp2", "zero_state": 3, "pp_size": 1, "gradient_accumulation_fusion": False},
    {"fsdp_impl": "megatron_torch_fsdp2", "zero_state": 3, "fsdp_reshard_after_forward": "never", "pp_size": 1,
     "gradient_accumulation_fusion": False},
    {"cp_size": 4, "pp_size": 1, "cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [2, 2]},
    {"rank_order": "tp-cp-ep-pp-dp"},
    {"interleaving_size": 2, "micro_batch_num": 8, "overlap_grad_reduce": True, "overlap_param_gather": True,
     "overlap_param_gather_with_optimizer_step": True, "overlap_p2p_comm": True},
    {"enable_recompute": True, "recompute_granularity": "selective_recompute"},
    {"fp8": True, "fp8_wgrad": False},
], ids=["deepspeed-z1", "deepspeed-z3", "te-offload", "dropout", "megatron-fsdp-z3", "average-in-collective",
        "no-wgrad-fusion", "uniform-recompute", "overlap-p2p", "grad-reduce-bf16", "ddp-bucket-size",
        "precision-aware-optimizer", "precision-aware-fp16-master", "fp8-param-gather",
        "unfused-attention", "megatron-torch-fsdp2", "megatron-torch-fsdp2-no-reshard", "hierarchical-cp", "tp-pp-dp-mapping",
        "param-gather-with-optimizer-step", "selective-without-modules", "no-fp8-wgrad"])
def test_new_options_round_trip_through_the_flags(upd) -> None:
    """DeepSpeed ZeRO (Megatron-DeepSpeed's flags), TE layer offload, dropout,
    Megatron-FSDP and averaging in the DP collective: export then import gives the same
    estimate."""
    m0 = load_model("llama3.1-8b")
    s0 = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 8192, **upd})
    m, s, _ = parse_megatron_args(model_flags(m0) + megatron_flags(s0, m0), world_size=8)
    h100 = load_system("h100-sxm-80gb")
    a, b = Estimate(m, s, h100), Estimate(m0, s0, h100)
    assert a.cost().duration_time_per_iter == pytest.approx(b.cost().duration_time_per_iter, rel=1e-12)
    assert a.memory().peak_mem == pytest.approx(b.memory().peak_mem, rel=1e-12)


def test_megatron_torch_fsdp2_as_megatron_validates_it() -> None:
    """Megatron-LM's --use-torch-fsdp2 (validate_args) refuses pipeline and expert
    parallelism, the distributed optimizer, gradient-accumulation fusion, tied embeddings
    and fp16: an imported line breaking one is a ConfigError naming the flag, and a
    megatron_torch_fsdp2 strategy breaking one is refused at load or export. torchtitan's
    FSDP2 (fp32 shards and reduce-scatters) does not export as that flag."""
    gpt = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
           "--global-batch-size 16 --vocab-size 32000 --bf16 --use-torch-fsdp2")
    ok = gpt + " --untie-embeddings-and-output-weights --no-gradient-accumulation-fusion"
    _, s, _ = parse_megatron_args(ok, world_size=8)
    assert (s.fsdp_impl, s.zero_state, s.fsdp_reshard_after_forward) == ("megatron_torch_fsdp2", 3, "default")
    _, s, _ = parse_megatron_args(ok + " --torch-fsdp2-no-reshard-after-forward", world_size=8)
    assert s.fsdp_reshard_after_forward == "never"
    _, s, notes = parse_megatron_args(ok + " --fp8-format hybrid --fp8-param-gather", world_size=8)
    assert s.fp8 and not s.fp8_param_gather and any("turns it off" in n for n in notes)  # as validate_args does
    for extra, flag in (("", "--no-gradient-accumulation-fusion"), (" --no-gradient-accumulation-fusion",
                                                                     "--untie-embeddings-and-output-weights"),
                        (" --pipeline-model-parallel-size 2", "--pipeline-model-parallel-size"),
                        (" --use-distributed-optimizer", "--use-distributed-optimizer")):
        line = (ok if "pipeline" in extra or "distributed" in extra else gpt) + extra
        with pytest.raises(ConfigError) as exc:
            parse_megatron_args(line, world_size=8)
        assert exc.value.field == flag and "torch-fsdp2" in exc.value.rule
    fsdp2 = load_strategy({"seq_len": 4096, "world_size": 8, "zero_state": 3, "fsdp_impl": "megatron_torch_fsdp2",
                           "gradient_accumulation_fusion": False})
    assert "--use-torch-fsdp2" in megatron_flags(fsdp2, load_model("llama3.1-8b"))
    with pytest.raises(ConfigError, match="megatron_torch_fsdp2"):
        megatron_flags(fsdp2.with_updates({"fsdp_impl": "torch_fsdp2"}), load_model("llama3.1-8b"))
    with pytest.raises(ConfigError, match="gradient_accumulation_fusion"):
        fsdp2.with_updates({"gradient_accumulation_fusion": True})
    with pytest.raises(ConfigError, match="untie"):
        megatron_flags(fsdp2, load_model("gemma-2-9b"))
    with pytest.raises(ConfigError, match="pp_size"):
        megatron_flags(fsdp2.with_updates({"pp_size": 2, "fsdp_reshard_after_forward": "never"}), load_model("llama3.1-8b"))


def test_import_says_or_refuses_what_megatron_refuses_at_start_up() -> None:
    """Lines megatron-core / validate_args stop at start-up: the interleaved schedule over two
    stages with P2P blocking is refused (naming the flag); full recompute without a method and
    a method with selective recompute are read as before, with a note saying Megatron refuses them."""
    gpt = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 2048 "
           "--micro-batch-size 1 --global-batch-size 16 --vocab-size 32000 --bf16 ")
    vpp = gpt + "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
    with pytest.raises(ConfigError) as exc:
        parse_megatron_args(vpp + "--no-overlap-p2p-communication", world_size=8)
    assert exc.value.field == "--no-overlap-p2p-communication"
    _, s, _ = parse_megatron_args(vpp.replace("size 2 ", "size 4 ").replace("stage 2", "stage 1") + "--no-overlap-p2p-communication",
                                  world_size=8)
    assert s.interleaving_size == 2 and not s.overlap_p2p_comm  # over 4 stages Megatron runs it blocking
    _, s, notes = parse_megatron_args(gpt + "--recompute-granularity full", world_size=8)
    assert s.recompute_granularity == "full_block" and any("Megatron refuses it" in n for n in notes)
    _, s, notes = parse_megatron_args(gpt + "--recompute-activations --recompute-method uniform", world_size=8)
    assert s.recompute_granularity == "selective_recompute" and any("selective: Megatron refuses" in n for n in notes)


def test_flag_of_names_every_switch_of_a_field() -> None:
    """An error on a field that several Megatron switches set names them all."""
    from simumax.config.megatron_names import flag_of

    assert flag_of("m", "add_bias_linear") == "--disable-bias-linear / --add-bias-linear"
    assert flag_of("s", "dtype") == "--bf16 / --fp16"
    assert flag_of("s", "tp_size") == "--tensor-model-parallel-size"
    assert flag_of("m", "no_such_field") is None


def test_cross_entropy_fusion_implementations() -> None:
    """Megatron's --cross-entropy-loss-fusion runs Megatron-Core's compiled chain unless
    --cross-entropy-fusion-impl te says TransformerEngine's kernel: the importer takes
    Megatron's default, the exporter states the implementation modelled. By hand, per bf16
    logit: native forward 2 + 4 (fp32 copy and max), 4 + 4 (shifted exp and sum), 4 + 4
    (division) = 22 B in 3 kernels, backward 4 + 4 + 2 = 10 B in 1; between TE's single
    pass (4 B) and the unfused chain (38 B). A measured ce_fusion line (SimuMax's B200)
    times either fused form as the one unit it measured."""
    from simumax.graph.blocks import megatron_native_ce_traffic
    from simumax.graph.kernels import MemBound

    assert megatron_native_ce_traffic(2) == ((22.0, 3), (10.0, 1))
    base = "--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 --vocab-size 32000"
    _, native, _ = parse_megatron_args(base + " --cross-entropy-loss-fusion", world_size=1)
    _, te, _ = parse_megatron_args(base + " --cross-entropy-loss-fusion --cross-entropy-fusion-impl te", world_size=1)
    assert (native.cross_entropy_fusion_impl, te.cross_entropy_fusion_impl) == ("native", "te")
    assert "--cross-entropy-fusion-impl native" in megatron_flags(native)
    with pytest.raises(ConfigError, match="cross_entropy_fusion_impl.*refuses"):  # older Megatron lines import; 0.19 refuses them
        megatron_flags(te)
    model = load_model("llama3-8b").with_updates({"layer_num": 2})
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"pp_size": 1, "world_size": 1})

    def loss_time(system: str, **kw: object) -> float:
        est = Estimate(model, st.with_updates(kw), load_system(system))
        loss = next(o for c in est.chunks for o in c.ops if o.name == "loss")
        return sum(est.compute_model.membound(k) for ph in ("fwd", "bwd_input") for k in loss.kernels(ph) if isinstance(k, MemBound))

    t_te, t_native, t_plain = (loss_time("a100-sxm-80gb", **kw) for kw in (
        {"cross_entropy_loss_fusion": True}, {"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "native"}, {}))
    assert t_te < t_native < t_plain
    b200 = [loss_time("b200_bf16_ceperm", cross_entropy_loss_fusion=True, cross_entropy_fusion_impl=i) for i in ("te", "native")]
    assert b200[0] == pytest.approx(b200[1])


def test_uniform_recompute_of_one_layer_recomputes_every_layer() -> None:
    """The common full-recompute line, --recompute-granularity full --recompute-method uniform
    --recompute-num-layers 1, checkpoints every layer (it was read as block: one layer per
    chunk); block with a count keeps its meaning."""
    m0 = load_model("llama3.1-8b")
    h100 = load_system("h100-sxm-80gb")
    head = model_flags(m0) + megatron_flags(load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 8192}), m0)
    every = Estimate(m0, load_strategy("tp1_pp2_dp4_mbs1").with_updates(
        {"seq_len": 8192, "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None}), h100)
    for method, same in (("uniform", True), ("block", False)):
        tail = ["--recompute-granularity full", f"--recompute-method {method}", "--recompute-num-layers 1"]
        m, s, _ = parse_megatron_args(head + tail, world_size=8)
        est = Estimate(m, s, h100)
        assert (est.memory().peak_mem == pytest.approx(every.memory().peak_mem, rel=1e-12)) is same
        assert (est.cost().duration_time_per_iter == pytest.approx(every.cost().duration_time_per_iter, rel=1e-12)) is same


def test_a_2021_megatron_script_reads_as_it_ran() -> None:
    """Narayanan'21-era lines: --checkpoint-activations (every layer, uniform chunks of
    --checkpoint-num-layers; since 2022 --recompute-granularity full --recompute-method
    uniform) estimates as its current spelling, the GPT-2 BPE tokenizer that --merge-file
    implies gives the vocabulary (pretrain_gpt.py's default), and the flags of that time are
    read past with their reasons, none "ignored". Megatron-LM 0.19's --padded-vocab-size (and
    --no-pad-vocab-size) give the vocabulary as it is."""
    head = ("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2 --num-layers 8 --hidden-size 4096 "
            "--num-attention-heads 32 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 1 "
            "--global-batch-size 64 --fp16 --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt ")
    old = head + ("--checkpoint-activations --checkpoint-num-layers 1 --distribute-checkpointed-activations "
                  "--DDP-impl local --no-scatter-gather-tensors-in-pipeline --rampup-batch-size 16 16 5859375")
    new = head + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
    (m, s, notes), (m2, s2, _) = parse_megatron_args(old, world_size=64), parse_megatron_args(new, world_size=64)
    assert m.vocab_size == 50257 and any("GPT2BPETokenizer's 50257 tokens" in n for n in notes)
    assert (s.recompute_granularity, s.recompute_method, s.recompute_layer_num) == ("full_block", "uniform", 1)
    a100 = load_system("a100-sxm-80gb")
    assert Estimate(m, s, a100).cost().duration_time_per_iter == Estimate(m2, s2, a100).cost().duration_time_per_iter
    assert not any(n.startswith("ignored") for n in notes), notes
    assert any("--distribute-checkpointed-activations" in n and "not modelled" in n for n in notes)
    bert = parse_megatron_args(head.replace("--merge-file gpt2-merges.txt", "--tokenizer-type BertWordPieceLowerCase"))
    assert bert[0].vocab_size == 30522
    with pytest.raises(ConfigError, match="--vocab-size: required"):  # a tokenizer model file: its size is unknown
        parse_megatron_args(head.replace("--merge-file gpt2-merges.txt", "--tokenizer-type HuggingFaceTokenizer"))
    padded = parse_megatron_args(head + "--padded-vocab-size 50304")
    assert (padded[0].vocab_size, padded[0].make_vocab_size_divisible_by) == (50304, 1)
    unpadded = parse_megatron_args(head + "--vocab-size 32000 --no-pad-vocab-size")[0]
    assert (unpadded.vocab_size, unpadded.make_vocab_size_divisible_by) == (32000, 1)
    moe = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --vocab-size 32000 --bf16 "
           "--num-experts 8 --moe-router-topk 2 --expert-model-parallel-size 2 ")
    _, s_old, _ = parse_megatron_args(moe + "--moe-layer-recompute", world_size=2)  # 0.19: selective + the moe module
    _, s_new, _ = parse_megatron_args(moe + "--recompute-granularity selective --recompute-modules core_attn moe", world_size=2)
    assert s_old == s_new and s_old.megatron_recompute_modules == ["core_attn", "moe"]
    with pytest.raises(ConfigError, match="--moe-layer-recompute: Megatron refuses it"):
        parse_megatron_args(moe + "--moe-layer-recompute --recompute-granularity full", world_size=2)
    with pytest.raises(ConfigError, match="--checkpoint-num-layers: expected int"):
        parse_megatron_args(old.replace("--checkpoint-num-layers 1", "--checkpoint-num-layers x"))


def test_megatron_layer_freq_expressions_and_layout_virtual_stages() -> None:
    """--moe-layer-freq takes Megatron's Python list expressions ("([0]*3+[1]*58)": three
    dense layers first), read without evaluating code; a --pipeline-model-parallel-layout
    sets the virtual stages per rank as Megatron derives them (len(layout) // pp)."""
    base = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --ffn-hidden-size 512 --seq-length 128 "
            "--vocab-size 1000 --micro-batch-size 1 --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 128 --bf16 ")
    m, _, notes = parse_megatron_args(base + '--moe-layer-freq "([0]*3+[1]*5)"', world_size=1)
    assert m.dense_layers == 3 and not [n for n in notes if "moe-layer-freq" in n]
    m, _, _ = parse_megatron_args(base + "--moe-layer-freq [0,1,1,1,1,1,1,1]", world_size=1)
    assert m.dense_layers == 1
    for bad in ("'[__import__(\"os\")]'", "'[0]*x'", "'[0]+(1'"):
        with pytest.raises(ConfigError) as exc:
            parse_megatron_args(base + f"--moe-layer-freq {bad}", world_size=1)
        assert exc.value.field == "--moe-layer-freq"
    _, s, _ = parse_megatron_args(base + "--global-batch-size 4 --pipeline-model-parallel-size 2 "
                                  "--pipeline-model-parallel-layout 'Ett|tt|tt|ttL'", world_size=2)
    assert s.interleaving_size == 2 and s.pipeline_model_parallel_layout


@pytest.mark.parametrize("dispatcher", ["all2all", "flex"])
def test_shared_expert_overlap_round_trips_through_the_flags(dispatcher: str) -> None:
    m0 = load_model("deepseek-v2-lite").with_updates({"layer_num": 4})
    s0 = load_strategy("ep4_pp2_dp4_mbs1").with_updates({"seq_len": 4096, "moe_shared_expert_overlap": True,
                                                           "moe_dispatcher_policy": dispatcher, "dispatch_probs": True})
    flags = model_flags(m0) + megatron_flags(s0, m0)
    assert "--moe-shared-expert-overlap" in flags
    assert f"--moe-token-dispatcher-type {'flex' if dispatcher == 'flex' else 'alltoall'}" in flags
    m, s, _ = parse_megatron_args(flags, world_size=8)
    h100 = load_system("h100-sxm-80gb")
    a, b = Estimate(m, s, h100), Estimate(m0, s0, h100)
    assert s.moe_shared_expert_overlap and s.moe_dispatcher_policy == dispatcher
    assert a.cost().duration_time_per_iter == pytest.approx(b.cost().duration_time_per_iter, rel=1e-12)


def test_flex_dispatcher_sms_round_trip_and_their_old_names() -> None:
    """--moe-flex-dispatcher-num-sms, and the deprecated --moe-deepep-num-sms /
    --moe-hybridep-num-sms that megatron-core routes to it."""
    m0 = load_model("deepseek-v2-lite").with_updates({"layer_num": 4, "moe_pad_expert_input_to_capacity": False})
    s0 = load_strategy("ep4_pp2_dp4_mbs1").with_updates({"seq_len": 4096, "moe_dispatcher_policy": "flex",
                                                           "moe_flex_dispatcher_num_sms": 24})
    flags = model_flags(m0) + megatron_flags(s0, m0)
    assert "--moe-flex-dispatcher-num-sms 24" in flags
    assert parse_megatron_args(flags, world_size=8)[1].moe_flex_dispatcher_num_sms == 24
    for old in ("--moe-deepep-num-sms", "--moe-hybridep-num-sms"):
        base = [f for f in flags if not f.startswith("--moe-flex-dispatcher-num-sms")]
        assert parse_megatron_args(base + [f"{old} 32"], world_size=8)[1].moe_flex_dispatcher_num_sms == 32
    with pytest.raises(ConfigError):
        parse_megatron_args(flags + ["--moe-deepep-num-sms", "many"], world_size=8)


# transformers 5.23's config-class defaults (MiniMaxM2Config's are MiniMax-M2's own sizes)
MINIMAX_M2 = {"architectures": ["MiniMaxM2ForCausalLM"], "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536,
              "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
              "hidden_act": "silu", "num_experts_per_tok": 8, "num_local_experts": 256, "tie_word_embeddings": False}
OLMO3 = {"architectures": ["Olmo3ForCausalLM"], "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008,
         "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu", "sliding_window": 4096}
SEED_OSS = {"architectures": ["SeedOssForCausalLM"], "vocab_size": 155136, "hidden_size": 4096, "intermediate_size": 27648,
            "num_hidden_layers": 64, "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
            "attention_bias": True, "attention_out_bias": False, "hidden_act": "silu"}


def test_hf_minimax_m2_olmo3_seed_oss() -> None:
    """MiniMax-M2: 256 SwiGLU experts of intermediate_size, top 8, a sigmoid router with the
    score-correction bias, q / k norms: MiniMax's published 230 B total, 10 B activated (the
    input embedding, a lookup, left out). OLMo 3: OLMo 2's layer with Olmo3Config's default
    layer_types, a full-attention layer every 4th. Seed-OSS: q / k / v biases, none on o_proj."""
    m, notes = model_from_hf(MINIMAX_M2)
    assert (m.expert_num, m.topk, m.moe_ffn, m.moe_router_score_function, m.moe_router_enable_expert_bias) == (
        256, 8, 1536, "sigmoid", True)
    assert m.qk_layernorm and any("span all heads" in n for n in notes)
    total, active = _params(m)
    assert round(total, -1) == 230 and round(active - m.padded_vocab(1) * m.hidden_size / 1e9) == 10  # 228.7, 10.4
    o, notes = model_from_hf(OLMO3)
    assert (o.window_size, o.window_attn_skip_freq, o.qk_layernorm) == (4096, 4, True)
    assert [o.attention_window(i) for i in range(4)] == [4096, 4096, 4096, None]
    s, notes = model_from_hf(SEED_OSS)
    assert s.add_qkv_bias and not s.add_bias_linear and not any("bias" in n for n in notes)
    h, heads, kv, d, f, v = 4096, 80, 8, 128, 27648, 155136
    layer = h * (heads + 2 * kv) * d + (heads + 2 * kv) * d + heads * d * h + 3 * h * f + 2 * h
    assert _total(s) == 64 * layer + 2 * v * h + h


GLM47_FLASH = {  # transformers 5.23's Glm4MoeLiteConfig defaults (GLM-4.7-Flash's sizes)
    "architectures": ["Glm4MoeLiteForCausalLM"], "vocab_size": 154880, "hidden_size": 2048, "intermediate_size": 10240,
    "moe_intermediate_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 20, "num_key_value_heads": 20,
    "n_shared_experts": 1, "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 4, "hidden_act": "silu", "tie_word_embeddings": False,
}


def test_hf_glm47_flash_is_mla_over_glm_moe() -> None:
    """GLM-4.7-Flash (Glm4MoeLite): DeepSeek-V3's MLA attention, GLM-4.5's sigmoid router with
    the score-correction bias and the sequence-level aux loss, the first layer dense
    (mlp_layer_types' default); parameters by hand."""
    m, _ = model_from_hf(GLM47_FLASH)
    assert (m.attention_type, m.kv_lora_rank, m.q_lora_rank, m.dense_layers) == ("mla", 512, 768, 1)
    assert (m.moe_router_score_function, m.moe_router_enable_expert_bias, m.moe_router_load_balancing_type) == (
        "sigmoid", True, "seq_aux_loss")
    assert m.moe_router_topk_scaling_factor == 1.8 and m.moe_shared_expert_intermediate_size == 1536
    h, heads, v = 2048, 20, 154880
    mla = (h * 768 + 768 + 768 * heads * (192 + 64) + h * (512 + 64) + 512 + 512 * heads * (192 + 256)
           + heads * 256 * h + h)  # q down, q norm, q up, kv down (+ rope k), kv norm, kv up, out proj, input norm
    dense = 3 * h * 10240 + h
    moe = 64 * 3 * h * 1536 + 3 * h * 1536 + h * 64 + h
    assert _total(m) == 47 * mla + dense + 46 * moe + 2 * v * h + h
    mixed = {**GLM47_FLASH, "num_hidden_layers": 4, "mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}
    assert model_from_hf(mixed)[0].moe_layer_freq == [0, 1, 0, 1]


def test_hf_kimi_k25_reads_its_deepseek_v3_text_model() -> None:
    """Kimi K2.5 (Kimi_K25ForConditionalGeneration): its text_config is a DeepSeek-V3 model (Kimi
    K2's shape: 64 heads, 384 experts, one dense layer), read as DeepSeek-V3 is; the vision tower is
    noted and left out. Its parameters are the kimi-k2 preset's (1.03 T by the same config)."""
    text = {**DEEPSEEK_V3, "architectures": None, "num_attention_heads": 64, "num_key_value_heads": 64,
            "n_routed_experts": 384, "first_k_dense_replace": 1, "vocab_size": 163840, "n_group": 1, "topk_group": 1,
            "routed_scaling_factor": 2.827, "num_nextn_predict_layers": 0}
    m, notes = model_from_hf({"architectures": ["Kimi_K25ForConditionalGeneration"], "text_config": text,
                              "vision_config": {"hidden_size": 1152}})
    assert any("vision tower" in n for n in notes)
    assert (m.attention_type, m.expert_num, m.head_num, m.dense_layers) == ("mla", 384, 64, 1)
    assert _params(m)[0] == pytest.approx(_params(load_model("kimi-k2"))[0], rel=1e-12)


# transformers 5.23's config-class defaults (Ernie4_5_MoeConfig: ERNIE-4.5-21B-A3B's sizes; OlmoeConfig: OLMoE-1B-7B's)
ERNIE45_MOE = {"architectures": ["Ernie4_5_MoeForCausalLM"], "vocab_size": 103424, "hidden_size": 2560,
               "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
               "hidden_act": "silu", "tie_word_embeddings": True, "moe_intermediate_size": 1536, "moe_k": 6,
               "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
               "moe_layer_interval": 1}
OLMOE = {"architectures": ["OlmoeForCausalLM"], "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 1024,
         "num_hidden_layers": 16, "num_attention_heads": 16, "hidden_act": "silu", "num_experts_per_tok": 8, "num_experts": 64}


def test_hf_ernie45_moe_and_olmoe() -> None:
    """ERNIE 4.5 MoE: softmax over all experts before the top-6 (its score-correction bias left out:
    Megatron's expert bias takes sigmoid scores only), two shared experts, MoE from layer 1 (its moe_layer_* keys); 21 B / 3 B by its config. OLMoE: 64
    experts of intermediate_size, top 8, q / k norms; 6.9 B total, 1.3 B active (AI2: "1B active,
    7B total")."""
    e, _ = model_from_hf(ERNIE45_MOE)
    assert (e.expert_num, e.topk, e.dense_layers, e.moe_shared_expert_intermediate_size) == (64, 6, 1, 3072)
    assert e.moe_router_pre_softmax and not e.moe_router_enable_expert_bias and not e.untie_embeddings_and_output_weights
    total, active = _params(e)
    assert (int(total), int(active)) == (21, 3)  # 21.8 B, 3.35 B: the card's "21B total, 3B activated", truncated
    every_other, _ = model_from_hf({**ERNIE45_MOE, "moe_layer_interval": 2})
    assert every_other.moe_layer_freq == [int((i + 1) % 2 == 0 and i >= 1) for i in range(28)]
    o, notes = model_from_hf(OLMOE)
    assert (o.expert_num, o.topk, o.moe_ffn, o.qk_layernorm) == (64, 8, 1024, True)
    total, active = _params(o)
    assert (round(total, 1), round(active, 1)) == (6.9, 1.3)


DOTS_LLM1 = {  # transformers 5.23's Dots1Config keys; a dots.llm1-shaped model (hidden 4096, 128 experts, top 6, 2 shared)
    "architectures": ["Dots1ForCausalLM"], "vocab_size": 152064, "hidden_size": 4096, "intermediate_size": 10944,
    "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32,
    "n_shared_experts": 2, "n_routed_experts": 128, "num_experts_per_tok": 6, "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5, "hidden_act": "silu", "sliding_window": 4096, "max_window_layers": 62,
    "tie_word_embeddings": False,
}


def test_hf_dots_llm1() -> None:
    """dots.llm1 (Dots1): Qwen3's attention with q / k norms over DeepSeek-V3's MoE (sigmoid
    router with the score-correction bias, x2.5), two shared experts, one dense layer; its
    default layer types keep every layer full attention (sliding only from max_window_layers =
    all 62 on): 142 B total, 14 B active (rednote's card: 142B total, 14B activated)."""
    m, notes = model_from_hf(DOTS_LLM1)
    assert (m.expert_num, m.topk, m.dense_layers, m.moe_router_score_function, m.qk_layernorm) == (128, 6, 1, "sigmoid", True)
    assert m.window_size is None and m.moe_shared_expert_intermediate_size == 2 * 1408
    total, active = _params(m)
    assert (int(total), int(active)) == (142, 14)  # 142.8 B, 14.0 B
    late = model_from_hf({**DOTS_LLM1, "max_window_layers": 0})[0]
    assert late.window_size == 4096 and late.window_attn_skip_freq is None  # every layer sliding


def test_simumax_options_export_as_megatron_runs_them_or_are_refused() -> None:
    """Found by exporting random strategies and importing them back: SimuMax's bf16 main
    gradients (use_fp32_accum_grad false; Megatron with --bf16 accumulates in fp32 unless
    --grad-reduce-in-bf16) and Megatron-Core's local modules round-trip to the same estimate;
    what no Megatron flag runs is refused naming the field; a Megatron MoE line dispatches
    its routing probabilities (megatron-core >= 0.13)."""
    h100 = load_system("h100-sxm-80gb")
    dense = load_model("llama3.1-8b").with_updates({"layer_num": 4})
    for upd, flag in (({"use_fp32_accum_grad": False}, "--grad-reduce-in-bf16"),
                      ({"transformer_impl": "local"}, "--transformer-impl local")):
        s0 = load_strategy("tp1_pp2_dp4_mbs1").with_updates(upd)
        flags = megatron_flags(s0, dense)
        assert flag in flags
        m, s, _ = parse_megatron_args(model_flags(dense) + flags, world_size=8)
        assert Estimate(m, s, h100).cost().duration_time_per_iter == pytest.approx(
            Estimate(dense, s0, h100).cost().duration_time_per_iter, rel=1e-12)
    moe = load_model("deepseek-v2-lite").with_updates({"layer_num": 4})
    base = load_strategy("ep4_pp2_dp4_mbs1")
    for upd, field in (({"fp8": True, "fp8_weight_caching": False}, "fp8_weight_caching"),
                       ({"offload_groupgemm_col_inputs": True}, "offload_groupgemm_col_inputs"),
                       ({"fp8": True, "cache_groupgemm_col_fp8_inputs": True}, "cache_groupgemm_col_fp8_inputs"),
                       ({"group_linear_mode": "merged"}, "group_linear_mode")):
        with pytest.raises(ConfigError) as exc:
            megatron_flags(base.with_updates(upd), moe)
        assert exc.value.field == field
    _, s, _ = parse_megatron_args(model_flags(moe) + megatron_flags(base, moe), world_size=8)
    assert s.dispatch_probs and not base.dispatch_probs


def _drawable_fields(cls: type, skip: Callable[[str], bool]) -> dict[str, list]:
    """Every field of ``cls`` whose values are few (booleans, literals, small ints and floats),
    less those ``skip`` names."""
    import typing

    out: dict[str, list] = {}
    for name, f in cls.model_fields.items():
        if skip(name):
            continue
        ann, args, lits = f.annotation, typing.get_args(f.annotation), []

        def walk(a: object) -> None:
            if typing.get_origin(a) is typing.Literal:
                lits.extend(typing.get_args(a))
            for x in typing.get_args(a):
                walk(x)
        walk(ann)
        if ann is bool or (bool in args and len(args) <= 2):
            out[name] = [True, False]
        elif lits:
            out[name] = lits
        elif ann is int or int in args:
            out[name] = [0, 1, 2, 4, 8, 64]
        elif ann is float or float in args:
            out[name] = [1e-6, 0.5, 1.0, 2.0]
    return out


def test_export_then_import_is_the_same_job_for_random_options() -> None:
    """Any job the exporter writes as Megatron-LM flags reads back as the same estimate (time
    and memory): random values of every few-valued strategy and model field over dense, MoE,
    hybrid and sliding-window models (a ConfigError on load or export is a refusal, fine).
    Left out, as no Megatron line carries them by design: DeepSpeed's own config (``ds_*``),
    SimuMax's network-tier hints (``*_net``), its MLP-only / SDP-only recompute (exported as the
    nearest --recompute-modules: not the same job), the straggler model, and the MoE load
    skew (a property of the data). Derandomised: the draws are the same on every run."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    from simumax.config.model import ModelConfig
    from simumax.config.strategy import StrategyConfig

    fields = _drawable_fields(StrategyConfig, lambda n: n.startswith("ds_") or n.endswith("_net") or n in (
        "enable_straggler_model", "recompute_granularity"))
    model_fields = _drawable_fields(ModelConfig, lambda n: n in ("model_name", "moe_load_imbalance", "layer_num"))
    models = {n: load_model(n).with_updates({"layer_num": 4}) for n in ("llama3-8b", "deepseek-v2-lite", "qwen3-next-80b-a3b",
                                                                         "gpt-oss-20b", "mixtral-8x7b")}
    bases = ("tp1_pp2_dp4_mbs1", "tp2_pp1_dp4_mbs1", "ep4_pp2_dp4_mbs1", "tp1_pp4_vp2_sync_mbs1_mbc8_no_ckpt")
    h100 = load_system("h100-sxm-80gb")

    @settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(hs.sampled_from(sorted(models)), hs.sampled_from(bases),
           hs.lists(hs.sampled_from(sorted(fields)), min_size=1, max_size=6, unique=True),
           hs.lists(hs.sampled_from(sorted(model_fields)), max_size=3, unique=True), hs.randoms(use_true_random=False))
    def check(name: str, base: str, names: list[str], model_names: list[str], rnd) -> None:  # type: ignore[no-untyped-def]
        upd = {n: rnd.choice(fields[n]) for n in names}
        try:
            m0 = models[name].with_updates({n: rnd.choice(model_fields[n]) for n in model_names})
            if m0.is_moe:
                upd["dispatch_probs"] = True  # what Megatron >= 0.13 runs, as the import reads it
            s0 = load_strategy(base).with_updates({**upd, **{f"{g}_net": None for g in ("tp", "cp", "ep", "etp", "dp", "pp")}})
            a = Estimate(m0, s0, h100)
            t0, mem0 = a.cost().duration_time_per_iter, a.memory().peak_mem
            flags = model_flags(m0, s0.seq_len) + megatron_flags(s0, m0)
        except ConfigError:
            return
        m, s, _ = parse_megatron_args(flags, world_size=s0.world_size)
        b = Estimate(m, s, h100)
        assert b.cost().duration_time_per_iter == pytest.approx(t0, rel=1e-9), (m0, upd, " ".join(flags))
        assert b.memory().peak_mem == pytest.approx(mem0, rel=1e-9), (m0, upd, " ".join(flags))

    check()
