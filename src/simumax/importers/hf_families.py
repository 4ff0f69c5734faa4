"""How each Hugging Face architecture family maps onto ModelConfig fields: the architecture
sets ``hf.model_from_hf`` dispatches on, and one function per family that needs more than the
common keys (Gemma, Llama 4, GLM-4.5 / 4.7-Flash, DeepSeek's routing, Qwen3-Next / Qwen3.5,
Nemotron-H, Granite 4.0-H, the sliding-window layer patterns). Keys and defaults as transformers 5.23's
config classes name them."""

from __future__ import annotations

from typing import Any

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
       "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM", "MiniMaxM2ForCausalLM", "OlmoeForCausalLM"}
# ERNIE 4.5 MoE: its own key names (moe_k, moe_num_experts, moe_layer_*), read by ernie45_moe
ERNIE45_MOE = {"Ernie4_5_MoeForCausalLM"}
# Qwen3.5: Qwen3-Next's Gated DeltaNet and gated attention layers (its projections unfused, the
# same weights), dense or over Qwen3-Next's MoE; the multimodal checkpoints' text_config
QWEN3_5 = {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3_5MoeForConditionalGeneration",
           "Qwen3_5MoeForCausalLM"}
GATED_DELTANET = QWEN3_5 | {"Qwen3NextForCausalLM"}
MLA = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeLiteForCausalLM"}  # GLM-4.7-Flash: MLA + GLM's MoE
DSA = {"DeepseekV32ForCausalLM"}  # DeepSeek-V3.2: DeepSeek-V3 with sparse attention (its indexer's index_* keys)
MLA |= DSA
# Kimi K2.5: a DeepSeek-V3 text model (its text_config) under a vision tower
KIMI_K25 = {"Kimi_K25ForConditionalGeneration", "KimiK25ForConditionalGeneration"}
MLA |= KIMI_K25
LLAMA4 = {"Llama4ForConditionalGeneration", "Llama4ForCausalLM"}  # the text model (its text_config)
GLM4_MOE = {"Glm4MoeForCausalLM"}  # GLM-4.5 / 4.6: GQA attention, DeepSeek-V3's MoE and MTP
DOTS1 = {"Dots1ForCausalLM"}  # dots.llm1: Qwen3's attention (q / k norms) over DeepSeek-V3's MoE
NEMOTRON_H = {"NemotronHForCausalLM"}  # Megatron's hybrid stack: Mamba-2, attention, MLP and MoE blocks
# IBM Granite 4.0-H: each layer a Mamba-2 or attention mixer, then a MoE with a shared MLP (or the
# shared MLP alone): the hybrid stack's blocks in pairs
GRANITE_HYBRID = {"GraniteMoeHybridForCausalLM"}


def req(cfg: dict[str, Any], key: str, src: str) -> Any:
    """cfg[key], or a ConfigError naming the key where the config lacks it (or gives null)."""
    if key not in cfg or cfg[key] is None:
        raise ConfigError(key, "required in a Hugging Face config.json for this architecture", src)
    return cfg[key]


# said where a config has an aux-loss-free router but no word on its load-balancing loss
UNSTATED_BALANCING = ("the load-balancing loss is not in config.json: Megatron's default aux_loss is costed beside the "
                      "expert bias")


def v3_gate(cfg: dict[str, Any], seq_aux: bool) -> dict[str, Any]:
    """DeepSeek-V3's gate for a config that does not name it (sigmoid scores with the
    score-correction bias, group-limited top-k, the routed scaling factor), as Megatron's router
    options; ``seq_aux``: with a sequence-level aux loss."""
    return deepseek_routing({**cfg, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "seq_aux": seq_aux})


def deepseek_moe(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """DeepSeek-style MoE keys: ``n_routed_experts`` of ``moe_intermediate_size``, top
    ``num_experts_per_tok``, the first ``first_k_dense_replace`` layers dense, ``n_shared_experts``
    shared experts of the expert size."""
    ffn = req(cfg, "moe_intermediate_size", source)
    out: dict[str, Any] = {
        "model_type": "moe", "expert_num": req(cfg, "n_routed_experts", source),
        "topk": req(cfg, "num_experts_per_tok", source), "moe_ffn_hidden_size": ffn,
        "dense_layers": cfg.get("first_k_dense_replace") or 0,
    }
    if cfg.get("n_shared_experts"):
        out["moe_shared_expert_intermediate_size"] = cfg["n_shared_experts"] * ffn
    return out


def dense_then_moe(pattern: list[int]) -> dict[str, Any]:
    """A per-layer 0/1 MoE pattern as ModelConfig says it: dense layers first, then MoE ones
    (``dense_layers``), else the list (``moe_layer_freq``)."""
    lead = pattern.index(1) if 1 in pattern else len(pattern)
    if 0 not in pattern[lead:]:
        return {"dense_layers": lead}
    return {"dense_layers": 0, "moe_layer_freq": pattern}


# transformers 5's NemotronH layer types, as Megatron's hybrid symbols (NemotronHConfig._pattern_to_list)
NEMOTRON_H_BLOCKS = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}


def _block_symbols(types: object, key: str, source: str) -> str:
    """A NemotronH layer-type list as hybrid symbols; an unknown type is a ConfigError."""
    if not isinstance(types, list) or not types:
        raise ConfigError(key, "expected a non-empty list of layer types", source)
    unknown = sorted({str(t) for t in types} - set(NEMOTRON_H_BLOCKS))
    if unknown:
        raise ConfigError(key, f"unknown block types {unknown}; known: {sorted(NEMOTRON_H_BLOCKS)}", source)
    return "".join(NEMOTRON_H_BLOCKS[t] for t in types)


def _nemotron_pattern(cfg: dict[str, Any], source: str) -> str:
    """The block pattern: ``hybrid_override_pattern`` (the checkpoints' string), else
    transformers 5's ``layers_block_type`` / ``layer_types`` list; with MTP layers
    (``num_nextn_predict_layers``) '/' and each depth's blocks (``mtp_hybrid_override_pattern``,
    else ``mtp_layers_block_type``, by default attention then MoE), Megatron's unified pattern."""
    if cfg.get("hybrid_override_pattern"):
        pattern = str(cfg["hybrid_override_pattern"])
    else:
        key = next((k for k in ("layers_block_type", "layer_types") if cfg.get(k)), None)
        if key is None:
            raise ConfigError("hybrid_override_pattern", "required (or layers_block_type) in a Nemotron-H config.json",
                              source)
        pattern = _block_symbols(cfg[key], key, source)
    depths = cfg.get("num_nextn_predict_layers") or 0
    if depths:
        mtp = cfg.get("mtp_hybrid_override_pattern") or _block_symbols(
            cfg.get("mtp_layers_block_type") or ["full_attention", "moe"], "mtp_layers_block_type", source)
        pattern += "/" + "/".join([str(mtp)] * depths)
    return pattern


def nemotron_h(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """NVIDIA's Nemotron-H config (``NemotronHForCausalLM``): Megatron's hybrid stack, its
    pattern one block per symbol (M Mamba-2, * attention, - MLP, E MoE), the Mamba-2 sizes,
    squared-ReLU MLPs, no position embedding. MoE blocks (Nemotron 3, transformers'
    NemotronHMoE): non-gated squared-ReLU experts, a sigmoid router with a score-correction bias
    (aux-loss-free balancing), group-limited top-k, the routed scaling factor, shared experts of
    ``moe_shared_expert_intermediate_size``, an optional latent projection around the experts; MTP
    depths after '/' in the pattern."""
    pattern = _nemotron_pattern(cfg, source)
    out: dict[str, Any] = {}
    if "E" in pattern:
        experts = req(cfg, "n_routed_experts", source)
        out.update(model_type="moe", expert_num=experts, topk=req(cfg, "num_experts_per_tok", source),
                   moe_ffn_hidden_size=req(cfg, "moe_intermediate_size", source), **v3_gate(cfg, seq_aux=False))
        if cfg.get("n_shared_experts"):
            out["moe_shared_expert_intermediate_size"] = cfg["n_shared_experts"] * req(
                cfg, "moe_shared_expert_intermediate_size", source)
        if cfg.get("moe_latent_size"):
            out["moe_latent_size"] = cfg["moe_latent_size"]
        notes.append(UNSTATED_BALANCING)
    act = cfg.get("mlp_hidden_act", "relu2")
    notes.append(f"mlp_hidden_act {act!r}: an ungated MLP, its activation costed as GeLU's element-wise pass")
    for key, modelled in (("conv_kernel", 4), ("chunk_size", 128)):
        if cfg.get(key) not in (None, modelled):
            notes.append(f"{key} {cfg[key]}: the Mamba-2 mixer is costed with Megatron's {modelled}")
    return {
        **out, "hybrid_layer_pattern": pattern, "layer_num": len(pattern.split("/")[0]),
        "mamba_num_heads": req(cfg, "mamba_num_heads", source), "mamba_head_dim": req(cfg, "mamba_head_dim", source),
        "mamba_state_dim": req(cfg, "ssm_state_size", source), "mamba_num_groups": req(cfg, "n_groups", source),
        "use_swiglu": False, "position_embedding_type": "none",
    }


def granite_hybrid(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """transformers' GraniteMoeHybrid (Granite 4.0-H): per layer a mixer — Mamba-2 where
    ``layer_types`` says linear_attention (GraniteMoeHybridMambaLayer: expand x hidden inner
    width, ``mamba_n_heads`` of ``mamba_d_head``, ``mamba_n_groups`` of state ``mamba_d_state``, conv
    with bias, the gated group norm), attention elsewhere — then, each with its own norm and
    residual, the MoE (SwiGLU experts of ``intermediate_size``, softmax over the top-k logits, a
    SwiGLU shared MLP of ``shared_intermediate_size``) or, without experts, that shared MLP alone:
    the hybrid pattern's mixer and MLP blocks in pairs."""
    layers = req(cfg, "num_hidden_layers", source)
    types = cfg.get("layer_types") or cfg.get("layers_block_type") or ["linear_attention"] * layers
    if len(types) != layers:
        raise ConfigError("layer_types", f"needs one entry per layer ({layers}; got {len(types)})", source)
    experts = cfg.get("num_local_experts", 8) or 0
    mlp = "E" if experts else "-"
    pattern = "".join(("M" if t == "linear_attention" else "*") + mlp for t in types)
    hidden, heads = req(cfg, "hidden_size", source), cfg.get("mamba_n_heads", 128)
    head_dim = cfg.get("mamba_d_head", "auto")
    if head_dim in (None, "auto"):
        head_dim = (cfg.get("mamba_expand") or 2) * hidden // heads
    shared = req(cfg, "shared_intermediate_size", source)
    out: dict[str, Any] = {
        "hybrid_layer_pattern": pattern, "layer_num": len(pattern), "mamba_num_heads": heads, "mamba_head_dim": head_dim,
        "mamba_state_dim": cfg.get("mamba_d_state", 256), "mamba_num_groups": cfg.get("mamba_n_groups", 1),
        "position_embedding_type": "rope" if cfg.get("position_embedding_type") == "rope" else "none",
    }
    if experts:
        out.update(model_type="moe", expert_num=experts, topk=cfg.get("num_experts_per_tok", 2),
                   moe_ffn_hidden_size=req(cfg, "intermediate_size", source), moe_shared_expert_intermediate_size=shared)
    else:
        out["intermediate_size"] = shared  # the shared MLP is the layer's MLP
    for key, modelled in (("mamba_d_conv", 4), ("mamba_chunk_size", 128)):
        if cfg.get(key, 256 if key == "mamba_chunk_size" else 4) != modelled:
            notes.append(f"{key} {cfg.get(key, 256)}: the Mamba-2 mixer is costed with Megatron's {modelled}")
    notes.append("Granite's embedding, residual, attention and logits multipliers: scalar scalings, not costed")
    return out


def qwen3_next(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Qwen3Next and Qwen3_5 (Moe): Gated DeltaNet layers (Qwen3NextGatedDeltaNet:
    in_proj_qkvz and in_proj_ba — Qwen3.5: in_proj_qkv, _z, _b, _a, the same weights —, the conv
    over q, k, v, the gated RMSNorm, out_proj: megatron-core's GatedDeltaNet) where
    ``layer_types`` says linear_attention (by default all but every ``full_attention_interval``-th
    layer), gated softmax attention with per-head q / k norms in the others (Qwen3NextAttention:
    q_proj makes the query and its gate)."""
    layers = req(cfg, "num_hidden_layers", source)
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


def sliding_window(cfg: dict[str, Any], arch: str, notes: list[str]) -> dict[str, Any]:
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
    if not types and arch in DOTS1:  # Dots1Config's default: sliding from max_window_layers on (by default none)
        layers = cfg.get("num_hidden_layers") or 0
        first = cfg.get("max_window_layers", layers)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if not types:
        return {"window_size": window}
    full = [i for i, t in enumerate(types) if t != "sliding_attention"]
    if not full:
        return {"window_size": window}
    if len(full) == len(types):  # every layer attends everything
        return {}
    for k in range(2, len(types) + 1):
        if full == [i for i in range(len(types)) if (i + 1) % k == 0]:
            return {"window_size": window, "window_attn_skip_freq": k}
    notes.append(f"layer_types pattern {types[:4]}...: not a 'every k-th layer full' pattern; modelled as every layer full")
    return {}


def gemma(cfg: dict[str, Any], arch: str, act: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Gemma / Gemma 2 / Gemma 3 text models: a gated GeLU MLP (gate and up
    projections, tanh GeLU on the gate: the kernels of SwiGLU), embeddings tied by default,
    Gemma 2 / 3's sandwich norms (post_attention_layernorm, post_feedforward_layernorm) and
    Gemma 3's per-head q / k norms; local / global layers in ``sliding_window``."""
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


def llama4(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """Llama 4's text model (transformers ``Llama4TextConfig`` / ``Llama4TextDecoderLayer``):
    top-1 sigmoid-routed experts of ``intermediate_size`` beside one shared expert of the same
    size, in the layers ``moe_layers`` names (by default every ``interleave_moe_layer_step``-th,
    ending each run: step - 1, 2·step - 1, ...), dense MLPs of ``intermediate_size_mlp``
    elsewhere; weightless L2 q/k norms."""
    layers = req(cfg, "num_hidden_layers", source)
    expert = req(cfg, "intermediate_size", source)
    step = cfg.get("interleave_moe_layer_step") or 1
    moe = set(cfg.get("moe_layers") or range(step - 1, layers, step))
    out: dict[str, Any] = {
        "model_type": "moe", "expert_num": req(cfg, "num_local_experts", source), "topk": req(cfg, "num_experts_per_tok", source),
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


def glm4_moe(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Glm4Moe: the first ``first_k_dense_replace`` layers dense (intermediate_size),
    then routed experts with ``n_shared_experts`` shared ones, a sigmoid router with DeepSeek-V3's
    score-correction bias (always: Glm4MoeTopkRouter), group-limited top-k when ``n_group`` > 1,
    the routed scaling factor, per-head q / k RMSNorm with ``use_qk_norm``, MTP layers."""
    # DeepSeek-V3's gate, which the config does not name; GLM-4.5 adds a sequence-level aux loss
    out = {**deepseek_moe(cfg, source), **v3_gate(cfg, seq_aux=True)}
    if cfg.get("use_qk_norm"):
        out["qk_layernorm"] = True
    if cfg.get("num_nextn_predict_layers"):
        out["mtp_num_layers"] = cfg["num_nextn_predict_layers"]
    return out


def dots1(cfg: dict[str, Any], source: str, notes: list[str]) -> dict[str, Any]:
    """transformers' Dots1 (dots.llm1): Qwen3's attention with per-head q / k norms, DeepSeek-V3's
    MoE (Dots1TopkRouter is DeepseekV3TopkRouter: sigmoid scores with the score-correction bias,
    group-limited top-k, the routed scaling factor), ``n_shared_experts`` shared experts, the
    first ``first_k_dense_replace`` layers dense."""
    notes.append(UNSTATED_BALANCING)
    return {**deepseek_moe(cfg, source), "qk_layernorm": True, **v3_gate(cfg, seq_aux=False)}


def glm4_moe_lite(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """transformers' Glm4MoeLite (GLM-4.7-Flash): DeepSeek-V3's MLA with GLM-4.5's MoE (the
    sigmoid router with the score-correction bias and a sequence-level aux loss); the dense
    layers where ``mlp_layer_types`` says dense (by default the first)."""
    layers = req(cfg, "num_hidden_layers", source)
    types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
    if len(types) != layers or set(types) - {"dense", "sparse"}:
        raise ConfigError("mlp_layer_types", f"needs one 'dense' or 'sparse' per layer ({layers})", source)
    return {**v3_gate(cfg, seq_aux=True), **dense_then_moe([int(t == "sparse") for t in types])}


def ernie45_moe(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """transformers' Ernie4_5_Moe: softmax over all experts before the top-k
    (Ernie4_5_MoeTopKRouter; its score-correction bias on the choice, ``moe_statics``, is left out:
    Megatron's aux-loss-free expert bias takes sigmoid scores only and TransformerConfig refuses
    it with softmax), ``moe_num_shared_experts`` shared experts of ``moe_intermediate_size``, MoE
    layers where (i + 1) % ``moe_layer_interval`` == 0 between ``moe_layer_start_index`` and
    ``moe_layer_end_index`` (-1: the last), dense MLPs of ``intermediate_size`` elsewhere."""
    layers = req(cfg, "num_hidden_layers", source)
    step, start = cfg.get("moe_layer_interval") or 1, cfg.get("moe_layer_start_index") or 0
    end = cfg.get("moe_layer_end_index", -1)
    end = layers - 1 if end in (None, -1) else end
    out: dict[str, Any] = {
        "model_type": "moe", "expert_num": req(cfg, "moe_num_experts", source), "topk": req(cfg, "moe_k", source),
        "moe_ffn_hidden_size": req(cfg, "moe_intermediate_size", source), "moe_router_pre_softmax": True,
    }
    if cfg.get("moe_num_shared_experts"):
        out["moe_shared_expert_intermediate_size"] = cfg["moe_num_shared_experts"] * cfg["moe_intermediate_size"]
    return {**out, **dense_then_moe([int((i + 1) % step == 0 and start <= i <= end) for i in range(layers)])}


def deepseek_routing(cfg: dict[str, Any]) -> dict[str, Any]:
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
    if method == "noaux_tc" and out.get("moe_router_score_function") == "sigmoid":  # Megatron: sigmoid only
        out["moe_router_enable_expert_bias"] = True
    if cfg.get("seq_aux", True):
        out["moe_router_load_balancing_type"] = "seq_aux_loss"
    return out




def deepseek_sparse_attention(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """DeepSeek-V3.2's sparse attention (Megatron's --experimental-attention-variant dsa): the
    lightning indexer's heads, head dim and top-k (config.json index_n_heads, index_head_dim,
    index_topk)."""
    return {"experimental_attention_variant": "dsa", "dsa_indexer_n_heads": req(cfg, "index_n_heads", source),
            "dsa_indexer_head_dim": req(cfg, "index_head_dim", source), "dsa_indexer_topk": req(cfg, "index_topk", source)}
