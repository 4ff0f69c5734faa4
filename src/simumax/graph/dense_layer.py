"""One dense transformer layer (pre-norm, attention + MLP) as Megatron-Core/TE runs it."""

from __future__ import annotations

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import attention, blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import MemBound
from simumax.graph.ops import Op


def attention_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_in: tuple[str, float]) -> list[Op]:
    """Input norm, QKV, RoPE, core attention, output projection, residual add."""
    P = f"L{layer}"
    rms = model.norm_type == "rmsnorm"
    hd = d.head_dim
    q_w, kv_w = d.heads * hd, d.kv_heads * hd
    gate_w = q_w if model.attention_output_gate else 0  # Megatron's gated attention: the QKV GEMM also makes the gate
    ln_out = (f"{P}.attn_norm.out", d.act(d.h, local=True))
    mixed = (f"{P}.qkv.out", d.act(q_w + 2 * kv_w + gate_w))
    # q, k, v are views into the fused QKV output, so keeping v (or q, k without RoPE)
    # keeps that whole buffer alive; RoPE writes new q and k tensors (and TE's fused
    # attention then keeps a contiguous copy of v instead: ``copies`` below)
    v = mixed
    rotary = model.uses_rope(layer)
    q = (f"{P}.q", d.act(q_w)) if rotary else mixed
    k = (f"{P}.k", d.act(kv_w)) if rotary else mixed
    out = (f"{P}.attn.out", d.act(q_w))
    local = st.transformer_impl == "local"
    bias = model.add_bias_linear
    qkv_bias = bias or model.add_qkv_bias  # Megatron's add_qkv_bias: the QKV linear only
    ops = [
        blocks.norm(f"{P}.attn_norm", "attn_norm", layer, d, x_in, rms=rms, save_rstd=not st.recompute_variance, residual=True).with_(output=ln_out),
        # TE adds the QKV bias in the GEMM epilogue; the local linear adds it separately
        # (FC1's bias goes with the fused bias-GeLU/SwiGLU, the row-parallel ones with the
        # fused bias-dropout-add)
        linears.column_linear(f"{P}.qkv", "qkv", layer, d, ln_out, d.h, q_w + 2 * kv_w + gate_w, bias=qkv_bias, bias_fused=not local).with_(
            output=mixed, **_replicated_kv(model, st, d.h, kv_w, qkv_bias)
        ),
    ]
    flash = not (st.use_math_sdp or local)
    new_qk = rotary or model.qk_layernorm  # q and k become tensors of their own
    split = qkv_split(P, layer, d, mixed, q_w, kv_w, flash=flash, new_qk=new_qk)
    if split is not None:
        ops.append(split)
    # TE's get_qkv_layout: a strided v beside contiguous q, k is no layout its kernels take,
    # so all three are made contiguous (only v copies); context parallelism makes them
    # contiguous too (TE's CP functions). The fused kernel keeps the copy, not the QKV buffer.
    copies: dict[str, tuple[str, float]] = {}
    if flash and (d.cp == 1 or d.cp_a2a == 1) and (new_qk or d.cp > 1):
        strided = {"v": d.act(kv_w)} if new_qk else {"k": d.act(kv_w), "v": d.act(kv_w)}
        if not new_qk and d.kv_heads == d.heads:
            strided["q"] = d.act(q_w)  # MHA's q is a view too (GQA's was reshaped)
        copies = {n: (f"{P}.{n}_contiguous", b) for n, b in strided.items()}
    rope_in = mixed
    if model.qk_layernorm:
        ops.append(_qk_norm(P, layer, d, mixed, q_w + kv_w))
        rope_in = (f"{P}.qk_norm.out", d.act(q_w + kv_w))
        if not rotary:
            q = k = rope_in
    if rotary:
        ops.append(
            blocks.rope(f"{P}.rope", layer, d, q_w + kv_w, fused=st.apply_rope_fusion and not local, rot_dim=hd).with_(
                input=(rope_in,), output=q, also_outputs=(k,))
        )
    if st.use_math_sdp or local:
        fused = attention.softmax_kernel_available(d, st.masked_softmax_fusion, model.attention_sinks)
        core = attention.math_attention(
            f"{P}.attn", layer, d, q, k, v, qk_dim=hd, v_dim=hd, dropout=st.enable_dropout, fused_softmax=fused,
            sinks=model.attention_sinks, window=model.attention_window(layer) is not None,
        )
    else:
        # GPT-OSS's attention sinks: one learned logit per head in the softmax denominator
        core = attention.flash_attention(f"{P}.attn", layer, d, q, k, v, out, qk_dim=hd, v_dim=hd,
                                         window=model.attention_window(layer), sink_params=d.heads if model.attention_sinks else 0,
                                         copies=copies)
    ops.append(core.with_(output=out))
    proj_in = out
    if gate_w:
        proj_in = (f"{P}.attn.gated", d.act(q_w))
        ops.append(_output_gate(P, layer, out, mixed, proj_in))
    proj = linears.row_linear(f"{P}.attn_proj", "attn_proj", layer, d, proj_in, q_w, d.h, bias=bias,
                              keep_original=d.keeps_original_input)
    ops += _with_post_norm(proj, P, "attn", model, st, d, layer)
    ops.append(blocks.dropout_add(f"{P}.attn_add", "attn_add", layer, d, dropout=st.enable_dropout))
    return ops


def _with_post_norm(proj: Op, P: str, part: str, model: ModelConfig, st: StrategyConfig, d: Dims, layer: int) -> list[Op]:
    """A sub-block's output projection, then Gemma 2 / 3's norm on its output
    (``post_sublayer_norm``) before the residual add: a norm like the pre-norms on the
    projection's reduced (sequence-sharded with SP) output, which feeds only it."""
    if not model.post_sublayer_norm:
        return [proj]
    out = (f"{P}.{part}_proj.out", d.act(d.h, local=True))
    norm = blocks.norm(f"{P}.{part}_post_norm", f"{part}_post_norm", layer, d, out, rms=model.norm_type == "rmsnorm",
                       save_rstd=not st.recompute_variance)
    return [proj.with_(output=out), norm]


def qkv_split(P: str, layer: int, d: Dims, mixed: tuple[str, float], q_w: int, kv_w: int, *, flash: bool, new_qk: bool) -> Op | None:
    """Megatron-Core's ``get_query_key_value_tensors``: the QKV output viewed as
    [s, b, groups, (heads/groups + 2)·head_dim] and split into q, k, v (TE's
    ``SplitAlongDim``). With GQA, ``query.reshape(s, b, heads, head_dim)`` cannot be a view
    of the split (a copy: read and write q). In backward the split's gradient is one
    ``torch.cat`` of dq, dk, dv into the QKV layout (read them, write it) unless they are
    views of one buffer in that layout, which only TE's fused attention on an MHA layer
    whose q, k, v went in as views gives (the ``sbh3d`` layout, ``_SplitAlongDim``'s no-op);
    after RoPE or q/k norms they are separate tensors (Megatron-Core's
    ``fused_single_qkv_rope``, off by default, exists to avoid "concatenating ROPE dgrads")."""
    gqa = d.kv_heads < d.heads
    one_buffer = flash and not gqa and not new_qk and d.cp == 1
    fwd = (MemBound("qkv_split.q_reshape", 2 * d.act(q_w)),) if gqa else ()
    bwd = () if one_buffer else (MemBound("qkv_split.grad_cat", 2 * mixed[1]),)
    if not fwd and not bwd:
        return None
    return Op(
        name=f"{P}.qkv_split", module="qkv_split", layer=layer, fwd=fwd, bwd_input=bwd,
        input=(mixed,), fwd_transient=d.act(q_w) if gqa else 0.0, bwd_transient=mixed[1] if bwd else 0.0,
    )


def _output_gate(P: str, layer: int, out: tuple[str, float], mixed: tuple[str, float], gated: tuple[str, float]) -> Op:
    """Megatron's --attention-output-gate (gated attention, Qwen3-Next): the attention output
    times sigmoid(gate) before the output projection, as megatron-core's
    ``Attention._apply_output_gate`` runs it in torch (both transformer implementations):
    ``x * sigmoid(gate.contiguous().float())`` then ``.to(x.dtype)`` — the gate's copy out of
    the QKV buffer, its fp32 cast, the sigmoid, the product (fp32 by type promotion) and its
    cast back: 2 + 3 + 4 + 5 + 3 passes of the output's bf16 bytes. It keeps the output and
    the fp32 sigmoid (the product's operands). Backward: the cast's, the product's two
    gradients (the output's cast back to bf16), the sigmoid's and the gate cast's; the gate's
    gradient lands in the QKV gradient (qkv_split). Checked against Megatron-Core on CPU
    (tests/test_megatron_reference.py)."""
    nbytes = out[1]
    label = f"{P}.attn_gate"
    fwd = (MemBound(f"{label}.gate_contiguous", 2 * nbytes), MemBound(f"{label}.gate_float", 3 * nbytes),
           MemBound(f"{label}.sigmoid", 4 * nbytes), MemBound(f"{label}.mul", 5 * nbytes), MemBound(f"{label}.cast", 3 * nbytes))
    bwd = (MemBound(f"{label}.cast_bwd", 3 * nbytes), MemBound(f"{label}.out_grad", 6 * nbytes),
           MemBound(f"{label}.out_grad_cast", 3 * nbytes), MemBound(f"{label}.sigmoid_grad", 5 * nbytes),
           MemBound(f"{label}.sigmoid_bwd", 6 * nbytes), MemBound(f"{label}.gate_float_bwd", 3 * nbytes))
    return Op(
        name=label, module="attn_gate", layer=layer, fwd=fwd, bwd_input=bwd,
        saved=(out, (f"{label}.sigmoid", 2 * nbytes)), input=(out, mixed), output=gated,
        fwd_transient=4 * nbytes, bwd_transient=4 * nbytes,
    )


def _qk_norm(P: str, layer: int, d: Dims, mixed: tuple[str, float], width: int) -> Op:
    """Megatron's q_layernorm / k_layernorm (TE RMSNorm over head_dim, per head): read q and
    k, write them normalised; backward reads them and the gradient. They save their input
    (the fused QKV buffer, kept anyway) and one fp32 rstd per token and head; every TP rank
    holds both head_dim-wide weights."""
    nbytes = d.act(width)
    rows = d.tokens * (d.heads + d.kv_heads)
    return Op(
        name=f"{P}.qk_norm", module="qk_norm", layer=layer,
        fwd=(MemBound("qk_norm.fwd", 2 * nbytes),), bwd_input=(MemBound("qk_norm.bwd", 3 * nbytes),),
        saved=(mixed, (f"{P}.qk_norm.rstd", float(rows * 4))), input=(mixed,), output=(f"{P}.qk_norm.out", nbytes),
        bwd_transient=nbytes, params=2 * d.head_dim, tp_replicated_params=2 * d.head_dim,
    )


def _replicated_kv(model: ModelConfig, st: StrategyConfig, h: int, kv_w: int, bias: bool) -> dict[str, int]:
    """With tp > kv_head_num each rank holds one whole KV head, shared by tp / kv ranks."""
    if model.kv_head_num >= st.tp_size:
        return {}
    return {"tp_replicated_params": 2 * kv_w * (h + (1 if bias else 0)), "tp_copies": st.tp_size // model.kv_head_num}


def mlp_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_mid: tuple[str, float]) -> list[Op]:
    """Pre-MLP norm, FC1, activation, FC2, residual add."""
    P = f"L{layer}"
    rms = model.norm_type == "rmsnorm"
    ln_out = (f"{P}.mlp_norm.out", d.act(d.h, local=True))
    fc1_n = 2 * d.ffn if model.use_swiglu else d.ffn
    fc1_out = (f"{P}.fc1.out", d.act(fc1_n))
    act_out = (f"{P}.act.out", d.act(d.ffn))
    bias = model.add_bias_linear
    if model.use_swiglu:
        act = blocks.swiglu(f"{P}.act", layer, d, fc1_out, d.ffn, fused=st.use_fused_swiglu)
    else:
        act = blocks.gelu(f"{P}.act", layer, d, fc1_out, d.ffn)
    return [
        blocks.norm(f"{P}.mlp_norm", "mlp_norm", layer, d, x_mid, rms=rms, save_rstd=not st.recompute_variance, residual=True).with_(output=ln_out),
        linears.column_linear(f"{P}.fc1", "fc1", layer, d, ln_out, d.h, fc1_n, bias=bias).with_(output=fc1_out),
        act.with_(output=act_out),
        *_with_post_norm(linears.row_linear(f"{P}.fc2", "fc2", layer, d, act_out, d.ffn, d.h, bias=bias), P, "mlp", model, st,
                         d, layer),
        blocks.dropout_add(f"{P}.mlp_add", "mlp_add", layer, d, dropout=st.enable_dropout),
    ]
