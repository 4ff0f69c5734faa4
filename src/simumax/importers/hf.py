"""A Hugging Face ``config.json`` (a local file) as a simumax ModelConfig.

Architectures: Llama, Mistral, Qwen2, Qwen3, Phi-3, OLMo 2 / 3, Seed-OSS, Gemma 1 / 2 / 3 (dense; Gemma 2 /
3 with their sandwich norms and local / global attention layers), Mixtral, Qwen2-MoE, Qwen3-MoE, MiniMax-M2,
GPT-OSS (MoE with sliding-window layers and attention sinks), DeepSeek-V2 / V3 and GLM-4.7-Flash (MLA + MoE),
GLM-4.5 (GQA + DeepSeek-V3-style MoE), Llama 4 (its text model: interleaved top-1 MoE with a
shared expert), Qwen3-Next and Qwen3.5 (Gated DeltaNet and gated attention layers, Qwen3.5 dense
or over a MoE; its text model) and Nemotron-H (Megatron's hybrid stack of Mamba-2, attention, MLP
and MoE blocks).
What the ModelConfig cannot say is returned as notes (e.g. a Llama-style output-projection bias),
never silently dropped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simumax.config.base import read_json
from simumax.config.model import ModelConfig
from simumax.errors import ConfigError

DENSE = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM", "Olmo2ForCausalLM",
         "Olmo3ForCausalLM", "SeedOssForCausalLM"}
# Gemma: gated GeLU MLPs, tied embeddings; 2 and 3 add sandwich norms and local / global layers
GEMMA = {"GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"}
# transformers' Gemma3TextConfig defaults (the 4B text model's shape), which a checkpoint's
# text_config leaves out
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rope_theta": 1_000_000.0, "sliding_window": 4096, "sliding_window_pattern": 6,
}
# Qwen3-Next: Qwen3-MoE's experts (and gated shared expert) under Gated DeltaNet layers with
# every full_attention_interval-th layer gated softmax attention
MOE = {"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "Qwen3NextForCausalLM",
       "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM", "MiniMaxM2ForCausalLM"}
# Qwen3.5: Qwen3-Next's Gated DeltaNet and gated attention layers (its projections unfused, the
# same weights), dense or over Qwen3-Next's MoE; the multimodal checkpoints' text_config
QWEN3_5 = {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration",
           "Qwen3_5MoeForCausalLM"}
GATED_DELTANET = QWEN3_5 | {"Qwen3NextForCausalLM"}
MLA = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM"}  # GLM-4.7-Flash: MLA + GLM's MoE
LLAMA4 = {"Llama4ForConditionalGeneration", "Llama4ForCausalLM"}  # the text model (its text_config)
GLM4_MOE = {"Glm4MoeForCausalLM"}  # GLM-4.5 / 4.6: GQA attention, DeepSeek-V3's MoE and MTP
NEMOTRON_H = {"NemotronHForCausalLM"}  # Megatron's hybrid stack: Mamba-2, attention and MLP blocks


def _req(cfg: dict[str, Any], key: str, src: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(key, "required in a Hugging Face config.json for this architecture", src)
    return cfg[key]


def _check_sizes(cfg: dict[str, Any], src: str) -> None:
    """Sizes and counts present must be positive integers (not strings, booleans or 0)."""
    for key in SIZE_KEYS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(key, f"must be a positive integer (got {v!r})", src)


SIZE_KEYS = {
    "num_attention_heads", "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size", "num_key_value_heads",
    "head_dim", "num_local_experts", "num_experts", "moe_intermediate_size", "num_experts_per_tok", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "q_lora_rank", "n_shared_experts",
    "shared_expert_intermediate_size", "max_position_embeddings", "sliding_window", "intermediate_size_mlp",
    "interleave_moe_layer_step", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
    "full_attention_interval", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "moe_shared_expert_intermediate_size", "moe_latent_size",
}


def model_from_hf(cfg: dict[str, Any], name: str | None = None, source: str = "config.json") -> tuple[ModelConfig, list[str]]:
    """(ModelConfig, notes) from a parsed config.json."""
    archs = cfg.get("architectures") or []
    known = DENSE | MOE | MLA | LLAMA4 | GLM4_MOE | GEMMA | NEMOTRON_H | QWEN3_5
    arch = next((a for a in archs if a in known), None)
    if arch is None:
        raise ConfigError("architectures", f"unsupported {archs or 'missing'}; known: {', '.join(sorted(known))}", source)
    notes: list[str] = []
    if arch in LLAMA4 | GEMMA | QWEN3_5 and isinstance(cfg.get("text_config"), dict):
        cfg = cfg["text_config"]  # the multimodal checkpoint's language model
        if arch in GEMMA | QWEN3_5:
            notes.append("the vision tower is not modelled: the text model only")
    if arch.startswith("Gemma3"):
        cfg = {**GEMMA3_TEXT_DEFAULTS, **cfg}  # Gemma 3's text_config states only what differs from them
    _check_sizes(cfg, source)
    heads = _req(cfg, "num_attention_heads", source)
    hidden = _req(cfg, "hidden_size", source)
    act = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")  # Gemma 2 / 3 name it hidden_activation
    out: dict[str, Any] = {
        "model_name": name or str(cfg.get("_name_or_path") or arch).rstrip("/").split("/")[-1],
        "hidden_size": hidden,
        "head_num": heads,
        "kv_head_num": cfg.get("num_key_value_heads") or heads,
        "head_size": cfg.get("head_dim") or hidden // heads,
        # a MoE text model without dense layers may not state one (Qwen3.5-MoE): none of its layers reads it
        "intermediate_size": cfg.get("intermediate_size") or (cfg.get("moe_intermediate_size") if arch in MOE and not
                                                              cfg.get("mlp_only_layers") and (cfg.get("decoder_sparse_step") or 1) == 1
                                                              else None) or _req(cfg, "intermediate_size", source),
        # Nemotron-H counts its pattern (transformers 5 deprecates num_hidden_layers there)
        "layer_num": cfg.get("num_hidden_layers") if arch in NEMOTRON_H else _req(cfg, "num_hidden_layers", source),
        "vocab_size": _req(cfg, "vocab_size", source),
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
        out.update(_gemma(cfg, arch, act, notes))
    elif act not in ("silu", "swish"):
        notes.append(f"hidden_act {act!r}: modelled as an ungated GeLU MLP")
    if arch in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"):
        out["qk_layernorm"] = True
        notes.append("OLMo's norms follow each sub-block instead of preceding it: the same two norms per layer, costed "
                     "in the pre-norm places; its q / k norms span all heads, costed as per-head q / k norms (the same "
                     "passes, (heads + kv heads - 2) x head_dim fewer weights)")
    if arch == "MiniMaxM2ForCausalLM":
        # MiniMaxM2Attention: RMSNorm over the whole q and k projections; MiniMaxM2TopKRouter:
        # sigmoid scores with the score-correction bias (aux-loss-free balancing)
        out.update(qk_layernorm=True, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True)
        notes.append("its q / k norms span all heads, costed as per-head q / k norms (the same passes, fewer weights)")
    if (cfg.get("partial_rotary_factor") or 1.0) < 1.0:
        notes.append(f"partial_rotary_factor {cfg['partial_rotary_factor']}: RoPE costed over every q / k dimension "
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
        if arch in ("MixtralForCausalLM", "GptOssForCausalLM", "MiniMaxM2ForCausalLM"):
            out["expert_num"] = _req(cfg, "num_local_experts", source)
            out["moe_ffn_hidden_size"] = cfg["intermediate_size"]
        else:
            out["expert_num"] = _req(cfg, "num_experts", source)
            out["moe_ffn_hidden_size"] = _req(cfg, "moe_intermediate_size", source)
            if cfg.get("shared_expert_intermediate_size"):
                out["moe_shared_expert_intermediate_size"] = cfg["shared_expert_intermediate_size"]
                out["moe_shared_expert_gate"] = True  # Qwen2MoeSparseMoeBlock.shared_expert_gate
            # transformers' Qwen2/3-MoE decoder layer: MoE when the layer is not in
            # mlp_only_layers and (i + 1) % decoder_sparse_step == 0, else a dense MLP of
            # intermediate_size
            step, dense_only = cfg.get("decoder_sparse_step") or 1, set(cfg.get("mlp_only_layers") or ())
            if step != 1 or dense_only:
                layers = _req(cfg, "num_hidden_layers", source)
                out["moe_layer_freq"] = [int(i not in dense_only and (i + 1) % step == 0) for i in range(layers)]
        out["topk"] = _req(cfg, "num_experts_per_tok", source)
    if arch in MLA:
        out.update(
            model_type="moe", attention_type="mla",
            q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=_req(cfg, "kv_lora_rank", source),
            qk_head_dim=_req(cfg, "qk_nope_head_dim", source), qk_pos_emb_head_dim=_req(cfg, "qk_rope_head_dim", source),
            v_head_dim=_req(cfg, "v_head_dim", source), head_size=cfg["v_head_dim"], kv_head_num=heads,
            expert_num=_req(cfg, "n_routed_experts", source), topk=_req(cfg, "num_experts_per_tok", source),
            moe_ffn_hidden_size=_req(cfg, "moe_intermediate_size", source),
            dense_layers=cfg.get("first_k_dense_replace") or 0,
        )
        if arch == "Glm4MoeLiteForCausalLM":
            out.update(_glm4_moe_lite(cfg, source))
        else:
            out.update(_deepseek_routing(cfg))
        if cfg.get("n_shared_experts"):
            out["moe_shared_expert_intermediate_size"] = cfg["n_shared_experts"] * cfg["moe_intermediate_size"]
        if cfg.get("num_nextn_predict_layers"):
            out["mtp_num_layers"] = cfg["num_nextn_predict_layers"]
    if arch in LLAMA4:
        out.update(_llama4(cfg, source, notes))
    if arch in GLM4_MOE:
        out.update(_glm4_moe(cfg, source, notes))
    if arch in NEMOTRON_H:
        out.update(_nemotron_h(cfg, source, notes))
    if arch in GATED_DELTANET:
        out.update(_qwen3_next(cfg, source, notes))
    if arch == "GptOssForCausalLM":
        # biases on every linear (attention and experts), learned attention sinks per head
        out.update(add_bias_linear=bool(cfg.get("attention_bias", True)), attention_sinks=True)
        if cfg.get("swiglu_limit"):
            notes.append(f"swiglu_limit {cfg['swiglu_limit']}: the clamp of GPT-OSS's SwiGLU is not costed (element-wise)")
    out.update(_sliding_window(cfg, arch, notes))
    if out.get("model_type") == "moe":  # HF checkpoints train dropless (SimuMax files default to padding)
        out.setdefault("moe_pad_expert_input_to_capacity", False)
    return ModelConfig.init_from_dict(out, source=source), notes


# transformers 5's NemotronH layer types, as Megatron's hybrid symbols (NemotronHConfig._pattern_to_list)
NEMOTRON_H_BLOCKS = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}


def _nemotron_pattern(cfg: dict[str, Any], source: str) -> str:
    """The block pattern: ``hybrid_override_pattern`` (the checkpoints' string), else
    transformers 5's ``layers_block_type`` / ``layer_types`` list."""
    if cfg.get("hybrid_override_pattern"):
        return str(cfg["hybrid_override_pattern"])
    for key in ("layers_block_type", "layer_types"):
        types = cfg.get(key)
        if isinstance(types, list) and types:
            unknown = sorted({str(t) for t in types} - set(NEMOTRON_H_BLOCKS))
            if unknown:
                raise ConfigError(key, f"unknown block types {unknown}; known: {sorted(NEMOTRON_H_BLOCKS)}", source)
            return "".join(NEMOTRON_H_BLOCKS[t] for t in types)
    raise ConfigError("hybrid_override_pattern", "required (or layers_block_type) in a Nemotron-H config.json", source)


def _nemotron_h(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """NVIDIA's Nemotron-H config (``NemotronHForCausalLM``): Megatron's hybrid stack, its
    pattern one block per symbol (M Mamba-2, * attention, - MLP, E MoE), the Mamba-2 sizes,
    squared-ReLU MLPs, no position embedding. MoE blocks (Nemotron 3, transformers'
    NemotronHMoE): non-gated squared-ReLU experts, a sigmoid router with a score-correction bias
    (aux-loss-free balancing), group-limited top-k, the routed scaling factor, shared experts of
    ``moe_shared_expert_intermediate_size``, an optional latent projection around the experts."""
    pattern = _nemotron_pattern(cfg, source)
    out: dict[str, Any] = {}
    if "E" in pattern:
        experts = _req(cfg, "n_routed_experts", source)
        out.update(model_type="moe", expert_num=experts, topk=_req(cfg, "num_experts_per_tok", source),
                   moe_ffn_hidden_size=_req(cfg, "moe_intermediate_size", source),
                   **_deepseek_routing({**cfg, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "seq_aux": False}))
        if cfg.get("n_shared_experts"):
            out["moe_shared_expert_intermediate_size"] = cfg["n_shared_experts"] * _req(
                cfg, "moe_shared_expert_intermediate_size", source)
        if cfg.get("moe_latent_size"):
            out["moe_latent_size"] = cfg["moe_latent_size"]
        notes.append("the load-balancing loss is not in config.json: Megatron's default aux_loss is costed beside the "
                     "expert bias")
    if cfg.get("num_nextn_predict_layers"):
        notes.append(f"its {cfg['num_nextn_predict_layers']} MTP layer(s) are not modelled in a hybrid stack: the main "
                     "model only")
    act = cfg.get("mlp_hidden_act", "relu2")
    notes.append(f"mlp_hidden_act {act!r}: an ungated MLP, its activation costed as GeLU's element-wise pass")
    for key, modelled in (("conv_kernel", 4), ("chunk_size", 128)):
        if cfg.get(key) not in (None, modelled):
            notes.append(f"{key} {cfg[key]}: the Mamba-2 mixer is costed with Megatron's {modelled}")
    return {
        **out, "hybrid_layer_pattern": pattern, "layer_num": len(pattern),
        "mamba_num_heads": _req(cfg, "mamba_num_heads", source), "mamba_head_dim": _req(cfg, "mamba_head_dim", source),
        "mamba_state_dim": _req(cfg, "ssm_state_size", source), "mamba_num_groups": _req(cfg, "n_groups", source),
        "use_swiglu": False, "position_embedding_type": "none",
    }


def _qwen3_next(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Qwen3Next and Qwen3_5 (Moe): Gated DeltaNet layers (Qwen3NextGatedDeltaNet:
    in_proj_qkvz and in_proj_ba — Qwen3.5: in_proj_qkv, _z, _b, _a, the same weights —, the conv
    over q, k, v, the gated RMSNorm, out_proj: megatron-core's GatedDeltaNet) where
    ``layer_types`` says linear_attention (by default all but every ``full_attention_interval``-th
    layer), gated softmax attention with per-head q / k norms in the others (Qwen3NextAttention:
    q_proj makes the query and its gate)."""
    layers = _req(cfg, "num_hidden_layers", source)
    types = cfg.get("layer_types")
    if types:
        if len(types) != layers:
            raise ConfigError("layer_types", f"needs one entry per layer ({layers}; got {len(types)})", source)
        linear = [int(t == "linear_attention") for t in types]
    else:
        k = cfg.get("full_attention_interval") or 4
        linear = [int((i + 1) % k != 0) for i in range(layers)]
    k = next((k for k in range(1, layers + 1) if linear == [int((i + 1) % k != 0) for i in range(layers)]), None)
    notes.append("zero-centred RMSNorm weights (1 + w, Qwen3NextRMSNorm): costed as RMSNorm")
    return {
        "experimental_attention_variant": "gated_delta_net", "linear_attention_freq": k if k is not None else linear,
        "attention_output_gate": True, "qk_layernorm": True,
        **{key: cfg[key] for key in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                                     "linear_num_key_heads", "linear_num_value_heads") if cfg.get(key)},
    }


def _sliding_window(cfg: dict[str, Any], arch: str, notes: list[str]) -> dict[str, Any]:
    """window_size / window_attn_skip_freq from ``sliding_window`` and the layer pattern:
    GPT-OSS lists ``layer_types`` (sliding first, then full, alternating); Mistral and
    Mixtral window every layer when ``sliding_window`` is set; Qwen2/3 only with
    ``use_sliding_window``, and then from layer ``max_window_layers`` on, which the model
    cannot say (noted, every layer full)."""
    window = cfg.get("sliding_window")
    if not window:
        return {}
    if arch.startswith("Qwen"):
        if cfg.get("use_sliding_window"):
            notes.append(f"sliding window {window} from layer {cfg.get('max_window_layers')}: not modelled (full attention)")
        return {}
    types = cfg.get("layer_types")
    if not types and arch in GEMMA:
        # transformers before layer_types: Gemma 2 windows every other layer from the first,
        # Gemma 3 all but every sliding_window_pattern-th (6)
        k = 2 if arch == "Gemma2ForCausalLM" else (cfg.get("sliding_window_pattern") or 6)
        return {"window_size": window, "window_attn_skip_freq": k}
    if not types and arch == "Olmo3ForCausalLM":  # Olmo3Config's default layer_types: every 4th layer full
        return {"window_size": window, "window_attn_skip_freq": 4}
    if not types:
        return {"window_size": window}
    full = [i for i, t in enumerate(types) if t != "sliding_attention"]
    if not full:
        return {"window_size": window}
    for k in range(2, len(types) + 1):
        if full == [i for i in range(len(types)) if (i + 1) % k == 0]:
            return {"window_size": window, "window_attn_skip_freq": k}
    notes.append(f"layer_types pattern {types[:4]}...: not a 'every k-th layer full' pattern; modelled as every layer full")
    return {}


def _gemma(cfg: dict[str, Any], arch: str, act: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Gemma / Gemma 2 / Gemma 3 text models: a gated GeLU MLP (gate and up
    projections, tanh GeLU on the gate: the kernels of SwiGLU), embeddings tied by default,
    Gemma 2 / 3's sandwich norms (post_attention_layernorm, post_feedforward_layernorm) and
    Gemma 3's per-head q / k norms; local / global layers in ``_sliding_window``."""
    out: dict[str, Any] = {
        "use_swiglu": True,
        "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", True),
    }
    notes.append(f"{act}-gated MLP (GeGLU) costed as SwiGLU: the same gated kernels and bytes")
    notes.append("the embedding scaled by sqrt(hidden_size): one element-wise pass over the embedding output, not costed")
    if arch != "GemmaForCausalLM":
        out["post_sublayer_norm"] = True
    if arch.startswith("Gemma3"):
        out["qk_layernorm"] = True
    if cfg.get("attn_logit_softcapping"):
        notes.append(f"attention logit soft-capping ({cfg['attn_logit_softcapping']}): FlashAttention applies it inside "
                     "its kernel; costed as plain attention")
    if cfg.get("final_logit_softcapping"):
        notes.append(f"final logit soft-capping ({cfg['final_logit_softcapping']}): a tanh pass over the logits and its "
                     "gradient, not costed")
    return out


def _llama4(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """Llama 4's text model (transformers ``Llama4TextConfig`` / ``Llama4TextDecoderLayer``):
    top-1 sigmoid-routed experts of ``intermediate_size`` beside one shared expert of the same
    size, in the layers ``moe_layers`` names (by default every ``interleave_moe_layer_step``-th,
    ending each run: step - 1, 2·step - 1, ...), dense MLPs of ``intermediate_size_mlp``
    elsewhere; weightless L2 q/k norms."""
    layers = _req(cfg, "num_hidden_layers", source)
    expert = _req(cfg, "intermediate_size", source)
    step = cfg.get("interleave_moe_layer_step") or 1
    moe = set(cfg.get("moe_layers") or range(step - 1, layers, step))
    out: dict[str, Any] = {
        "model_type": "moe", "expert_num": _req(cfg, "num_local_experts", source), "topk": _req(cfg, "num_experts_per_tok", source),
        "moe_ffn_hidden_size": expert, "moe_shared_expert_intermediate_size": expert,
        "intermediate_size": cfg.get("intermediate_size_mlp") or expert, "moe_router_score_function": "sigmoid",
    }
    if moe != set(range(layers)):
        out["moe_layer_freq"] = [int(i in moe) for i in range(layers)]
    # NoPE layers: transformers' no_rope_layers (1 = RoPE), by default every
    # no_rope_layer_interval-th layer (4) without; Megatron's no_rope_freq says 1 for NoPE
    rope = cfg.get("no_rope_layers") or [int((i + 1) % (cfg.get("no_rope_layer_interval") or 4) != 0) for i in range(layers)]
    if len(rope) >= layers and not all(rope[:layers]):
        out["no_rope_freq"] = [1 - int(x) for x in rope[:layers]]
    if cfg.get("use_qk_norm"):
        out["qk_layernorm"] = True
        notes.append("the weightless L2 q/k norm modelled as a q/k RMSNorm (its few weights counted)")
    if cfg.get("attention_chunk_size"):
        notes.append(f"chunked attention ({cfg['attention_chunk_size']} tokens, on the RoPE layers) modelled as full causal "
                     "attention, as Megatron-Core (which has no chunked attention) runs it: the same work up to that "
                     "many tokens")
    notes.append("its router weights each expert's input by the routing probability: Megatron's "
                 "--moe-apply-probs-on-input, a strategy option (moe_apply_probs_on_input)")
    return out


def _glm4_moe(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Glm4Moe: the first ``first_k_dense_replace`` layers dense (intermediate_size),
    then routed experts with ``n_shared_experts`` shared ones, a sigmoid router with DeepSeek-V3's
    score-correction bias (always: Glm4MoeTopkRouter), group-limited top-k when ``n_group`` > 1,
    the routed scaling factor, per-head q / k RMSNorm with ``use_qk_norm``, MTP layers."""
    moe_ffn = _req(cfg, "moe_intermediate_size", source)
    out: dict[str, Any] = {
        "model_type": "moe", "expert_num": _req(cfg, "n_routed_experts", source),
        "topk": _req(cfg, "num_experts_per_tok", source), "moe_ffn_hidden_size": moe_ffn,
        "dense_layers": cfg.get("first_k_dense_replace") or 0,
        # DeepSeek-V3's gate, which the config does not name; GLM-4.5 adds a sequence-level aux loss
        **_deepseek_routing({**cfg, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "seq_aux": True}),
    }
    if cfg.get("n_shared_experts"):
        out["moe_shared_expert_intermediate_size"] = cfg["n_shared_experts"] * moe_ffn
    if cfg.get("use_qk_norm"):
        out["qk_layernorm"] = True
    if cfg.get("num_nextn_predict_layers"):
        out["mtp_num_layers"] = cfg["num_nextn_predict_layers"]
    return out


def _glm4_moe_lite(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """transformers' Glm4MoeLite (GLM-4.7-Flash): DeepSeek-V3's MLA with GLM-4.5's MoE (the
    sigmoid router with the score-correction bias and a sequence-level aux loss); the dense
    layers where ``mlp_layer_types`` says dense (by default the first)."""
    layers = _req(cfg, "num_hidden_layers", source)
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if len(types) != layers or set(types) - {"dense", "sparse"}:
        raise ConfigError("mlp_layer_types", f"needs one 'dense' or 'sparse' per layer ({layers})", source)
    out = _deepseek_routing({**cfg, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "seq_aux": True})
    lead = next((i for i, t in enumerate(types) if t == "sparse"), layers)
    if "dense" in types[lead:]:
        out.update(dense_layers=0, moe_layer_freq=[int(t == "sparse") for t in types])
    else:
        out["dense_layers"] = lead
    return out


def _deepseek_routing(cfg: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek's gate as Megatron's router options: sigmoid (V3) or softmax over all experts
    first (V2), group-limited top-k (``n_group`` / ``topk_group``), the routed scaling factor,
    aux-loss-free expert bias (``topk_method: noaux_tc``) and the sequence-wise aux loss."""
    out: dict[str, Any] = {}
    if cfg.get("scoring_func", "softmax") == "sigmoid":
        out["moe_router_score_function"] = "sigmoid"
    else:
        out["moe_router_pre_softmax"] = True
    method = cfg.get("topk_method", "greedy")
    if method in ("group_limited_greedy", "noaux_tc") and (cfg.get("n_group") or 1) > 1:
        out["moe_router_num_groups"], out["moe_router_group_topk"] = cfg["n_group"], cfg["topk_group"]
    if cfg.get("routed_scaling_factor") not in (None, 1, 1.0):
        out["moe_router_topk_scaling_factor"] = float(cfg["routed_scaling_factor"])
    if method == "noaux_tc":
        out["moe_router_enable_expert_bias"] = True
    if cfg.get("seq_aux", True):
        out["moe_router_load_balancing_type"] = "seq_aux_loss"
    return out


def load_hf_config(path: str | Path, name: str | None = None) -> tuple[ModelConfig, list[str]]:
    p = Path(path)
    data = read_json(p)  # names a missing file, a directory, a FIFO or a device as such
    if not isinstance(data, dict):
        raise ConfigError("config.json", "expected a JSON object", str(p))
    return model_from_hf(data, name or (p.parent.name if p.name == "config.json" else p.stem), str(p))
