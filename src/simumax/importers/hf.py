"""A Hugging Face ``config.json`` (a local file) as a simumax ModelConfig.

Architectures: Llama, Mistral, Qwen2, Qwen3, Phi-3, OLMo 2 / 3, Seed-OSS, Gemma 1 / 2 / 3 (dense; Gemma 2 /
3 with their sandwich norms and local / global attention layers), Mixtral, Qwen2-MoE, Qwen3-MoE, MiniMax-M2, OLMoE,
ERNIE 4.5 MoE, dots.llm1,
GPT-OSS (MoE with sliding-window layers and attention sinks), DeepSeek-V2 / V3 / V3.2 (sparse attention), Kimi K2.5
(its text model) and
GLM-4.7-Flash (MLA + MoE),
GLM-4.5 (GQA + DeepSeek-V3-style MoE), Llama 4 (its text model: interleaved top-1 MoE with a
shared expert), Qwen3-Next and Qwen3.5 (Gated DeltaNet and gated attention layers, Qwen3.5 dense
or over a MoE; its text model), Nemotron-H (Megatron's hybrid stack of Mamba-2, attention, MLP
and MoE blocks) and Granite 4.0-H (Mamba-2 / attention mixers, each before a MoE or MLP).
What the ModelConfig cannot say is returned as notes (e.g. a Llama-style output-projection bias),
never silently dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simumax.config.base import read_json
from simumax.config.model import ModelConfig
from simumax.errors import ConfigError
from simumax.importers.hf_families import (
    DENSE, DOTS1, DSA, ERNIE45_MOE, GATED_DELTANET, GEMMA, GEMMA3_TEXT_DEFAULTS, GLM4_MOE, GRANITE_HYBRID, KIMI_K25, LLAMA4, MLA,
    MOE, NEMOTRON_H, QWEN3_5, deepseek_moe, deepseek_routing, deepseek_sparse_attention, dots1, ernie45_moe, gemma, glm4_moe,
    glm4_moe_lite, granite_hybrid, llama4, nemotron_h, qwen3_next, req, sliding_window,
)


def _check_sizes(cfg: dict[str, Any], src: str, zero_ok: frozenset[str] = frozenset()) -> None:
    """Sizes and counts present must be positive integers (not strings, booleans or 0; 0 where
    ``zero_ok`` or ``COUNT_KEYS`` allow it), the factors positive numbers."""
    for key in SIZE_KEYS | COUNT_KEYS:
        v = cfg.get(key)
        low = 0 if key in zero_ok or key in COUNT_KEYS else 1
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
            raise ConfigError(key, f"must be a {'non-negative' if low == 0 else 'positive'} integer (got {v!r})", src)
    for key in FACTOR_KEYS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise ConfigError(key, f"must be a positive number (got {v!r})", src)
    for keys, kind, ok in ((DICT_KEYS, "an object", lambda v: isinstance(v, dict)),
                           (BOOL_KEYS, "true or false", lambda v: isinstance(v, bool)),
                           (STR_KEYS, "a string", lambda v: isinstance(v, str)),
                           (STR_LIST_KEYS, "a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
                           (INT_LIST_KEYS, "a list of integers",
                            lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v))):
        for key in keys:
            v = cfg.get(key)
            if v is not None and not ok(v):
                raise ConfigError(key, f"must be {kind} (got {v!r})", src)


SIZE_KEYS = {
    "num_attention_heads", "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size", "num_key_value_heads",
    "head_dim", "num_local_experts", "num_experts", "moe_intermediate_size", "num_experts_per_tok", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "q_lora_rank", "n_shared_experts",
    "shared_expert_intermediate_size", "max_position_embeddings", "sliding_window", "intermediate_size_mlp",
    "interleave_moe_layer_step", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
    "full_attention_interval", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "moe_shared_expert_intermediate_size", "moe_latent_size",
    "shared_intermediate_size", "mamba_n_heads", "mamba_n_groups", "mamba_d_state", "decoder_sparse_step", "n_group",
    "topk_group", "index_n_heads", "index_head_dim", "index_topk", "mamba_d_head", "moe_k", "moe_layer_interval",
    "moe_num_experts", "attention_chunk_size", "no_rope_layer_interval", "sliding_window_pattern",
}
COUNT_KEYS = {"first_k_dense_replace", "num_nextn_predict_layers", "moe_num_shared_experts", "moe_layer_start_index",
              "max_window_layers"}  # may be 0
DICT_KEYS = {"rope_parameters", "rope_scaling"}
BOOL_KEYS = {"tie_word_embeddings", "attention_bias", "mlp_bias", "qk_norm", "use_qk_norm", "use_sliding_window", "seq_aux",
             "attention_out_bias"}
STR_KEYS = {"hidden_act", "hidden_activation", "mlp_hidden_act", "scoring_func", "topk_method", "position_embedding_type",
            "hybrid_override_pattern", "mtp_hybrid_override_pattern"}
STR_LIST_KEYS = {"layer_types", "layers_block_type", "mlp_layer_types", "mtp_layers_block_type"}
INT_LIST_KEYS = {"mlp_only_layers", "moe_layers", "no_rope_layers"}
FACTOR_KEYS = {"routed_scaling_factor", "rope_theta", "partial_rotary_factor", "mamba_expand", "swiglu_limit",
               "attn_logit_softcapping", "final_logit_softcapping"}


def model_from_hf(cfg: dict[str, Any], name: str | None = None, source: str = "config.json") -> tuple[ModelConfig, list[str]]:
    """(ModelConfig, notes) from a parsed config.json."""
    archs = cfg.get("architectures") or []
    known = DENSE | MOE | MLA | LLAMA4 | GLM4_MOE | GEMMA | NEMOTRON_H | QWEN3_5 | GRANITE_HYBRID | ERNIE45_MOE | DOTS1
    arch = next((a for a in archs if a in known), None)
    if arch is None:
        raise ConfigError("architectures", f"unsupported {archs or 'missing'}; known: {', '.join(sorted(known))}", source)
    notes: list[str] = []
    if arch in LLAMA4 | GEMMA | QWEN3_5 | KIMI_K25 and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # the multimodal checkpoint's language model
        if arch in GEMMA | QWEN3_5 | KIMI_K25:
            notes.append("the vision tower is not modelled: the text model only")
    if arch.startswith("Gemma3"):
        cfg = {**GEMMA3_TEXT_DEFAULTS, **cfg}  # Gemma 3's text_config states only what differs from them
    # Granite 4.0-H without experts says num_local_experts 0 (its shared MLP alone)
    _check_sizes(cfg, source, frozenset({"num_local_experts"}) if arch in GRANITE_HYBRID else frozenset())
    heads = req(cfg, "num_attention_heads", source)
    hidden = req(cfg, "hidden_size", source)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")  # Gemma 2 / 3 name it hidden_activation
    out: dict[str, Any] = {
        "model_name": name or str(cfg.get("_name_or_path") or arch).rstrip("/").split("/")[-1],
        "hidden_size": hidden,
        "head_num": heads,
        "kv_head_num": cfg.get("num_key_value_heads") or heads,
        "head_size": cfg.get("head_dim") or hidden // heads,
        "intermediate_size": _dense_ffn(cfg, arch, source),
        # Nemotron-H counts its pattern (transformers 5 deprecates num_hidden_layers there)
        "layer_num": cfg.get("num_hidden_layers") if arch in NEMOTRON_H else req(cfg, "num_hidden_layers", source),
        "vocab_size": req(cfg, "vocab_size", source),
        "use_swiglu": act in ("silu", "swish"),  # every supported architecture gates its MLP
        "norm_type": "rmsnorm",
        "position_embedding_type": "rope",
        "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", False),
    }
    if cfg.get("max_position_embeddings"):
        out["max_position_embeddings"] = cfg["max_position_embeddings"]
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta")  # transformers 5: rope_parameters
    if theta:
        out["rotary_base"] = float(theta)
    if arch in GEMMA:
        out.update(gemma(cfg, arch, act, notes))
    elif act not in ("silu", "swish"):
        notes.append(f"hidden_act {act!r}: modelled as an ungated GeLU MLP")
    if arch in ("Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM"):
        out["qk_layernorm"] = True
        notes.append("OLMo's norms follow each sub-block instead of preceding it: the same two norms per layer, costed "
                     "in the pre-norm places; its q / k norms span all heads, costed as per-head q / k norms (the same "
                     "passes, (heads + kv heads - 2) x head_dim fewer weights)")
    if arch == "MiniMaxM2ForCausalLM":
        # MiniMaxM2Attention: RMSNorm over the whole q and k projections; MiniMaxM2TopKRouter:
        # sigmoid scores with the score-correction bias (aux-loss-free balancing)
        out.update(qk_layernorm=True, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)
        notes.append("its q / k norms span all heads, costed as per-head q / k norms (the same passes, fewer weights)")
    partial = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0
    if partial < 1.0:
        notes.append(f"partial_rotary_factor {partial}: RoPE costed over every q / k dimension "
                     "(an element-wise pass)")
    if arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM") or (arch in GLM4_MOE and cfg.get("attention_bias")):
        out["add_qkv_bias"] = True  # Qwen2Attention, Glm4MoeAttention: q / k / v projections with bias, o_proj without
    elif arch == "SeedOssForCausalLM" and cfg.get("attention_bias", True):
        out["add_qkv_bias"] = True  # SeedOssAttention: q / k / v biases (attention_bias), o_proj's own flag
        if cfg.get("attention_out_bias"):
            notes.append("attention_out_bias: the output projection's bias is not modelled (one hidden-size vector per layer)")
    elif cfg.get("attention_bias") and arch != "GptOssForCausalLM":
        # Llama-style attention_bias: q, k, v and o; Megatron's add_qkv_bias covers the first three
        out["add_qkv_bias"] = True
        notes.append("attention_bias: the output projection's bias is not modelled (one hidden-size vector per layer)")
    if cfg.get("qk_norm") or arch.startswith("Qwen3"):
        out["qk_layernorm"] = True  # Qwen3's per-head q / k RMSNorm
    if arch in MOE:
        out["model_type"] = "moe"
        if arch in ("MixtralForCausalLM", "GptOssForCausalLM", "MiniMaxM2ForCausalLM", "OlmoeForCausalLM"):
            # experts of intermediate_size, no dense MLP (OLMoE names their count num_experts)
            out["expert_num"] = req(cfg, "num_experts" if arch == "OlmoeForCausalLM" else "num_local_experts", source)
            out["moe_ffn_hidden_size"] = cfg["intermediate_size"]
        else:
            out["expert_num"] = req(cfg, "num_experts", source)
            out["moe_ffn_hidden_size"] = req(cfg, "moe_intermediate_size", source)
            if cfg.get("shared_expert_intermediate_size"):
                out["moe_shared_expert_intermediate_size"] = cfg["shared_expert_intermediate_size"]
                out["moe_shared_expert_gate"] = True  # Qwen2MoeSparseMoeBlock.shared_expert_gate
            # transformers' Qwen2/3-MoE decoder layer: MoE when the layer is not in
            # mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense MLP of
            # intermediate_size
            step, dense_only = cfg.get("decoder_sparse_step") or 1, set(cfg.get("mlp_only_layers") or ())
            if step != 1 or dense_only:
                layers = req(cfg, "num_hidden_layers", source)
                out["moe_layer_freq"] = [int(i not in dense_only and (i + 1) % step == 0) for i in range(layers)]
        out["topk"] = req(cfg, "num_experts_per_tok", source)
    if arch in MLA:
        out.update(
            attention_type="mla",
            q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=req(cfg, "kv_lora_rank", source),
            qk_head_dim=req(cfg, "qk_nope_head_dim", source), qk_pos_emb_head_dim=req(cfg, "qk_rope_head_dim", source),
            v_head_dim=req(cfg, "v_head_dim", source), head_size=cfg["v_head_dim"], kv_head_num=heads,
            **deepseek_moe(cfg, source),
        )
        out.update(glm4_moe_lite(cfg, source) if arch == "Glm4MoeLiteForCausalLM" else deepseek_routing(cfg))
        if cfg.get("num_nextn_predict_layers"):
            out["mtp_num_layers"] = cfg["num_nextn_predict_layers"]
        if arch in DSA:
            out.update(deepseek_sparse_attention(cfg, source))
    if arch in LLAMA4:
        out.update(llama4(cfg, source, notes))
    if arch in GLM4_MOE:
        out.update(glm4_moe(cfg, source, notes))
    if arch in NEMOTRON_H:
        out.update(nemotron_h(cfg, source, notes))
    if arch in GRANITE_HYBRID:
        out.update(granite_hybrid(cfg, source, notes))
    if arch in ERNIE45_MOE:
        out.update(ernie45_moe(cfg, source))
    if arch in DOTS1:
        out.update(dots1(cfg, source, notes))
    if arch in GATED_DELTANET:
        out.update(qwen3_next(cfg, source, notes))
    if arch == "GptOssForCausalLM":
        # biases on every linear (attention and experts), learned attention sinks per head
        out.update(add_bias_linear=bool(cfg.get("attention_bias", True)), attention_sinks=True)
        if cfg.get("swiglu_limit"):
            notes.append(f"swiglu_limit {cfg['swiglu_limit']}: the clamp of GPT-OSS's SwiGLU is not costed (element-wise)")
    out.update(sliding_window(cfg, arch, notes))
    if out.get("model_type") == "moe":  # HF checkpoints train dropless (SimuMax files default to padding)
        out.setdefault("moe_pad_expert_input_to_capacity", False)
    return ModelConfig.init_from_dict(out, source=source), notes


def _dense_ffn(cfg: dict[str, Any], arch: str, source: str) -> int:
    """``intermediate_size``; a MoE text model without dense layers may not state one
    (Qwen3.5-MoE), and none of its layers reads it: its expert size then."""
    all_moe = arch in MOE and not cfg.get("mlp_only_layers") and (cfg.get("decoder_sparse_step") or 1) == 1
    if not cfg.get("intermediate_size") and all_moe and cfg.get("moe_intermediate_size"):
        return int(cfg["moe_intermediate_size"])
    return int(req(cfg, "intermediate_size", source))


def load_hf_config(path: str | Path, name: str | None = None) -> tuple[ModelConfig, list[str]]:
    p = Path(path)
    data = read_json(p)  # names a missing file, a directory, a FIFO or a device as such
    if not isinstance(data, dict):
        raise ConfigError("config.json", "expected a JSON object", str(p))
    return model_from_hf(data, name or (p.parent.name if p.name == "config.json" else p.stem), str(p))
