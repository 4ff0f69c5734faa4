"""The FLOPs Megatron-LM's training log counts for an iteration.

Megatron-LM prints "throughput per GPU (TFLOP/s/GPU)" as ``num_floating_point_operations(args,
batch_size)`` (megatron/training/training.py, 0.19) over the iteration time and the GPU count.
That count is a closed formula, not the model's FLOPs: 3 x 2 FLOPs per weight and token for
every projection, MLP and logit GEMM (the routed experts at top-k, the shared experts, a latent
MoE's projections; MTP's norms and projection, its logits), core attention over s² halved for
the causal mask (packed documents: the sum of their squared lengths), Mamba-2 and Gated
DeltaNet mixers by their own terms. ``megatron_logged_flops`` follows it term by term, so
``perf`` can say what a Megatron log will print for the predicted time; tests hold it equal to
Megatron's own function over many models (tests/test_megatron_flops.py).
"""

from __future__ import annotations

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig

FWD_BWD, FMA = 3, 2  # each GEMM runs forward, data-gradient and weight-gradient; a multiply-add is 2 FLOPs


def _token_counts(st: StrategyConfig) -> tuple[float, float]:
    """(real tokens, sum of squared (sub-)sequence lengths) of the global batch: BSHD
    sequences, or packed documents as the THD path passes them."""
    gbs, s = st.global_batch_size, st.seq_len
    squares = sum(n * length * length for length, n in st.document_groups) or s * s
    return float(gbs * s), float(gbs * squares)


def _attention_terms(m: ModelConfig) -> tuple[float, float]:
    """(token-linear, per squared-length) FLOPs of one softmax-attention layer."""
    h, n = m.hidden_size, m.head_num
    if m.attention_type == "mla":
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q_term = h * n * qk if m.q_lora_rank is None else m.q_lora_rank * (h + n * qk + 1)
        linear = FWD_BWD * FMA * (q_term + m.kv_lora_rank * (h + n * (m.qk_head_dim + m.v_head_dim) + 1)
                                  + h * m.qk_pos_emb_head_dim + n * m.v_head_dim * h)
        core = FWD_BWD * FMA * (n * qk / 2 + n * m.v_head_dim / 2)
        return linear, core
    q = m.head_size * n
    kv = m.head_size * m.kv_head_num
    gate = q if m.attention_output_gate else 0
    linear = FWD_BWD * FMA * (h * (q + 2 * kv + gate) + q * h)
    core = FWD_BWD * FMA * q / 2 * 2
    return linear, core


def _gdn_per_token(m: ModelConfig) -> float:
    """One Gated DeltaNet layer's multiply-adds per token, forward (Megatron's formula: in_proj,
    conv1d, the delta rule's four products, out_proj)."""
    qk = m.linear_key_head_dim * m.linear_num_key_heads
    v = m.linear_value_head_dim * m.linear_num_value_heads
    return (m.hidden_size * (2 * qk + 2 * v + 2 * m.linear_num_value_heads) + m.linear_conv_kernel_dim * (2 * qk + v)
            + m.linear_num_value_heads * m.linear_value_head_dim ** 2 * 4 + m.hidden_size * v)


def _transformer(m: ModelConfig, st: StrategyConfig, tokens: float, sq_sum: float) -> float:
    h = m.hidden_size
    mtp = m.mtp_num_layers
    layers = m.layer_num + mtp
    if m.is_moe:
        moe_layers = sum(m.is_moe_layer(i) for i in range(m.layer_num))
        last_moe = int(m.is_moe_layer(m.layer_num - 1))
        moe_layers += last_moe * mtp
        routed = m.topk
    else:
        moe_layers, routed = 0, 0
    dense_layers = layers - moe_layers
    swiglu = 3 if m.use_swiglu else 2
    moe_ffn = m.moe_ffn_hidden_size or m.intermediate_size
    shared = m.moe_shared_expert_intermediate_size or 0
    latent = m.moe_latent_size
    attn_linear, attn_core = _attention_terms(m)
    if m.experimental_attention_variant == "gated_delta_net":
        freq = m.linear_attention_freq
        pattern = list(freq) if isinstance(freq, list) else [0 if (i + 1) % freq == 0 else 1 for i in range(layers)]  # type: ignore[operator]
        linear_layers = sum(pattern)
        gdn = FWD_BWD * FMA * _gdn_per_token(m)
    else:
        linear_layers, gdn = 0, 0.0
    standard = layers - linear_layers
    routed_term = moe_ffn * routed * swiglu if latent is None else moe_ffn * routed * swiglu * latent / h + 2 * latent
    vocab = m.padded_vocab(st.tp_size)
    per_token = (
        FWD_BWD * FMA * h * (m.intermediate_size * swiglu * dense_layers + routed_term * moe_layers + shared * swiglu * moe_layers)
        + gdn * linear_layers + attn_linear * standard
        + FWD_BWD * FMA * mtp * (3 * h + 2 * h * h)
        + FWD_BWD * FMA * h * vocab * (mtp + 1)
    )
    return tokens * per_token + sq_sum * attn_core * standard


def _hybrid(m: ModelConfig, st: StrategyConfig, tokens: float, sq_sum: float) -> float:
    h = m.hidden_size
    mtp = m.mtp_num_layers
    symbols = m.hybrid_symbols + m.hybrid_mtp_pattern * mtp  # each MTP depth's blocks once per depth
    count = symbols.count
    swiglu = 1.5 if m.use_swiglu else 1.0
    p = m.head_size * m.head_num / h
    g = m.kv_head_num
    attn = 4 * tokens * h * p * (h + h * g / m.head_num) + 2 * sq_sum * h * p
    mlp = 4 * (m.intermediate_size / h) * swiglu * tokens * h * h
    latent = m.moe_latent_size
    moe_ffn = m.moe_ffn_hidden_size or m.intermediate_size
    routed = m.topk or 1
    if latent is None:
        moe = 4 * tokens * h * moe_ffn * routed * swiglu
    else:
        moe = 4 * tokens * latent * moe_ffn * routed * swiglu + 4 * tokens * h * latent
    moe += 4 * tokens * h * (m.moe_shared_expert_intermediate_size or 0) * swiglu
    d_in = 2 * h
    heads = m.mamba_num_heads or d_in // m.mamba_head_dim
    mamba = (2 * tokens * h * (2 * d_in + 2 * m.mamba_num_groups * m.mamba_state_dim + heads)
             + 7 * tokens * d_in * m.mamba_state_dim + 2 * tokens * d_in * h)
    gdn = FMA * tokens * _gdn_per_token(m) if count("G") else 0.0
    fwd = (count("*") * attn + count("-") * mlp + count("M") * mamba + count("E") * moe + count("G") * gdn
           + 2 * tokens * h * m.padded_vocab(st.tp_size) * (1 + mtp))
    return fwd * 3


def megatron_logged_flops(m: ModelConfig, st: StrategyConfig) -> float:
    """FLOPs of one iteration as Megatron-LM 0.19's ``num_floating_point_operations`` counts
    them (the figure behind its TFLOP/s/GPU log line)."""
    tokens, sq_sum = _token_counts(st)
    if m.hybrid_layer_pattern is not None:
        return _hybrid(m, st, tokens, sq_sum)
    return _transformer(m, st, tokens, sq_sum)
