"""A model as Megatron-LM architecture flags (``simumax import megatron`` reads them back;
export/megatron_flags.py adds the strategy's)."""

from __future__ import annotations

from simumax.config.megatron_names import switch_flag, valued_flag
from simumax.config.model import ModelConfig
from simumax.errors import ConfigError

# Megatron's router defaults: a model differing from one states its flag
ROUTER_DEFAULTS = {
    "moe_router_score_function": "softmax", "moe_router_pre_softmax": False, "moe_router_num_groups": None,
    "moe_router_group_topk": None, "moe_router_topk_scaling_factor": None, "moe_router_load_balancing_type": "aux_loss",
    "moe_router_enable_expert_bias": False, "moe_z_loss_coeff": None, "moe_router_force_load_balancing": False,
}


def _m(field: str, value: object) -> str:
    return valued_flag("m", field, value)


def _layer_list(flag: str, bits: list[int]) -> str:
    """A per-layer 0/1 list flag, quoted for the shell (brackets glob)."""
    return f"{flag} '[" + ",".join(map(str, bits)) + "]'"


def model_flags(model: ModelConfig, seq_len: int | None = None) -> list[str]:
    """The model as Megatron-LM architecture flags (simumax import megatron reads them back).
    Megatron requires --max-position-embeddings >= --seq-length: given the job's ``seq_len``,
    a model without the value, or a rotary / position-free one whose value is shorter (no
    table to size), states the sequence length."""
    f = [
        *(_m(field, getattr(model, field)) for field in ("layer_num", "hidden_size", "intermediate_size", "head_num", "head_size",
                                                          "vocab_size")),
        # an unpadded vocabulary (SimuMax's padded_vocab_size false): Megatron pads at least to a multiple of TP
        _m("make_vocab_size_divisible_by", model.make_vocab_size_divisible_by if model.padded_vocab_size else 1),
        f"--normalization {'RMSNorm' if model.norm_type == 'rmsnorm' else 'LayerNorm'}",
        f"--position-embedding-type {model.position_embedding_type}",
    ]
    if model.kv_head_num != model.head_num:
        f += ["--group-query-attention", _m("kv_head_num", model.kv_head_num)]
    positions = model.max_position_embeddings
    if seq_len is not None and (not positions or (positions < seq_len and model.position_embedding_type != "learned_absolute")):
        positions = seq_len
    if positions:
        f.append(_m("max_position_embeddings", positions))
    if model.rotary_base is not None and model.position_embedding_type == "rope":
        f.append(_m("rotary_base", model.rotary_base))
    if model.use_swiglu:
        f.append(switch_flag("m", "use_swiglu"))
    if model.untie_embeddings_and_output_weights:
        f.append(switch_flag("m", "untie_embeddings_and_output_weights"))
    if not model.add_bias_linear:  # biases are Megatron's default
        f.append(switch_flag("m", "add_bias_linear", False))
        if model.add_qkv_bias and model.attention_type != "mla":
            f.append(switch_flag("m", "add_qkv_bias"))
    if model.is_moe:
        f += [_m("expert_num", model.expert_num), _m("topk", model.topk), _m("moe_ffn_hidden_size", model.moe_ffn)]
        if model.moe_shared_expert_intermediate_size:
            f.append(_m("moe_shared_expert_intermediate_size", model.moe_shared_expert_intermediate_size))
            if model.moe_shared_expert_gate:
                f.append(switch_flag("m", "moe_shared_expert_gate"))
        if model.moe_latent_size:
            f.append(_m("moe_latent_size", model.moe_latent_size))
        # routing options that differ from Megatron's defaults
        for name, default in ROUTER_DEFAULTS.items():
            value = getattr(model, name)
            if value != default:
                f.append(switch_flag("m", name) if isinstance(value, bool) else _m(name, value))
        if isinstance(model.moe_layer_freq, int) and model.moe_layer_freq > 1 and not model.dense_layers:
            f.append(f"--moe-layer-freq {model.moe_layer_freq}")
        elif model.dense_layers or model.moe_layer_freq != 1:
            f.append(_layer_list("--moe-layer-freq", [int(model.is_moe_layer(i)) for i in range(model.layer_num)]))
    if isinstance(model.no_rope_freq, int):
        f.append(f"--no-rope-freq {model.no_rope_freq}")
    elif model.no_rope_freq:
        f.append(_layer_list("--no-rope-freq", model.no_rope_freq))
    if model.attention_type == "mla":
        f.append(switch_flag("m", "attention_type", "mla"))
        if model.q_lora_rank:
            f.append(_m("q_lora_rank", model.q_lora_rank))
        f += [_m(field, getattr(model, field)) for field in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")]
    if model.window_size is not None:  # TransformerEngine's (left, right): keys i - left .. i
        f.append(f"--window-size {model.window_size - 1},0")
        if model.window_attn_skip_freq:
            f.append(f"--window-attn-skip-freq {model.window_attn_skip_freq}")
    if model.attention_sinks:
        f.append("--softmax-type learnable")
    if model.post_sublayer_norm:  # a launch line without them would train another model
        raise ConfigError("post_sublayer_norm", "Megatron-LM has no flag for Gemma 2 / 3's sandwich norms (Megatron-Bridge "
                          "builds them in its own layer spec)")
    for name in ("qk_layernorm", "attention_output_gate"):
        if getattr(model, name):
            f.append(switch_flag("m", name))
    if model.mtp_num_layers:
        f.append(_m("mtp_num_layers", model.mtp_num_layers))
    if model.experimental_attention_variant == "dsa":
        f.append("--experimental-attention-variant dsa")
        f += [_m(field, getattr(model, field)) for field in ("dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk",
                                                              "dsa_indexer_topk_freq", "dsa_indexer_skip_topk_offset")]
        if model.dsa_indexer_loss_coeff is not None:
            f.append(_m("dsa_indexer_loss_coeff", model.dsa_indexer_loss_coeff))
        if model.dsa_indexer_use_sparse_loss:
            f.append(switch_flag("m", "dsa_indexer_use_sparse_loss"))
        if not model.dsa_indexer_rotate_activation:
            f.append(switch_flag("m", "dsa_indexer_rotate_activation", False))
    if model.experimental_attention_variant == "gated_delta_net":
        f.append(f"--experimental-attention-variant {model.experimental_attention_variant}")
        freq = model.linear_attention_freq
        f.append(f"--linear-attention-freq {freq}" if isinstance(freq, int) else _layer_list("--linear-attention-freq", freq))
    if model.has_linear_attention:
        f += [_m(field, getattr(model, field)) for field in ("linear_conv_kernel_dim", "linear_key_head_dim",
                                                              "linear_value_head_dim", "linear_num_key_heads",
                                                              "linear_num_value_heads")]
    if model.hybrid_layer_pattern is not None:  # Megatron's hybrid stack (pretrain_mamba.py)
        # with "=": a pattern may start with "-" (an MLP block), which argparse would read as a flag
        f.append(f"--hybrid-layer-pattern='{model.hybrid_layer_pattern}'")
        f += [_m(field, getattr(model, field)) for field in ("mamba_state_dim", "mamba_head_dim", "mamba_num_groups")]
        if model.mamba_num_heads:
            f.append(_m("mamba_num_heads", model.mamba_num_heads))
    return f
