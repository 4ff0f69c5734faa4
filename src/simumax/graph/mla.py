"""DeepSeek multi-latent attention (MLA) as Megatron-Core runs it, with TP over heads.

Order per layer: input norm, q down-projection + q norm, kv down-projection + kv norm,
q/kv up-projections, RoPE + concatenation into contiguous query/key/value, flash
attention, output projection, residual add.

The down-projections are "duplicated" linears (every TP rank holds the whole weight and
runs it on its own sequence-sharded tokens); the up-projections are column-parallel over
heads, so with SP they all-gather the compressed [tokens, rank] input (much smaller than
the hidden state) and the decoupled RoPE key [tokens, rope_dim] is all-gathered too.
SimuMax asserts tp == 1 for MLA; this module does not need to.
"""

from __future__ import annotations

from typing import NamedTuple

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import attention, blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, MemBound, op_label
from simumax.graph.ops import Op, Tensor


# megatron-core's torch RoPE (rope_utils._apply_rotary_pos_emb_bshd with MLA's interleave:
# the interleave copy, t * cos, rotate_half, * sin, the add, the final cat): about four
# passes each way, each a read and a write (as blocks.rope)
TORCH_ROPE_PASSES = 4


def rope_passes(fused: bool) -> int:
    """Bytes moved per byte of a positional part RoPE rotates, each way: one read and one write
    with a fused kernel, the torch RoPE's passes otherwise."""
    return 2 if fused else 2 * TORCH_ROPE_PASSES


def _rope_concat(
    name: str, layer: int, d: Dims, q: Tensor, kv: Tensor, kv_comb: Tensor, rope_widths: tuple[int, int],
    outs: tuple[Tensor, Tensor, Tensor], fused: bool = True,
) -> Op:
    """RoPE on the q and k positional parts and the contiguous query, key (the one k_pe
    broadcast to every head) and value attention takes, kernel by kernel as Megatron runs them.
    With SP, k_pe is all-gathered over TP first (reduce-scattered in backward), except on the
    local spec, whose k_pe comes from the kv projection's gathered output.

    Fused (``apply_rope_fusion``, megatron-core's YaRN kernels, ``fusions/
    fused_mla_yarn_rope_apply.py``): ``ApplyMLARotaryEmbQ`` rotates q's positional part in
    place (q is the query), ``ApplyMLARotaryEmbKV`` reads kv and k_pe and writes key and value;
    backward the same two, the kv one summing k_pe's gradient over the heads. Unfused
    (``--no-rope-fusion``): the torch RoPE on each part, the concatenations into query and key,
    value made contiguous; backward the RoPE backward on both, the broadcast's sum over heads,
    and the gradients of the split q and kv up-projection outputs re-assembled (two copies);
    each of the two torch RoPE calls keeps its cos and sin [s, 1, 1, rope_dim] (as
    blocks.rope), the fused kernels nothing."""
    q_pe, k_pe = (d.act(w) for w in rope_widths)
    query, key, value = outs
    saved: tuple[Tensor, ...] = ()
    label = op_label(name)
    gathered = d.sp and not (d.local and d.tp > 1)  # the local spec's k_pe comes from the gathered kv (_down_projection)
    fwd: list = [Collective("all_gather", k_pe, "tp")] if gathered else []
    bwd: list = []
    if fused:
        fwd += [MemBound(f"{label}.rope_q", 2 * q_pe), MemBound(f"{label}.rope_kv", kv[1] + k_pe + key[1] + value[1])]
        bwd += [MemBound(f"{label}.rope_q_bwd", 2 * q_pe), MemBound(f"{label}.rope_kv_bwd", key[1] + value[1] + kv[1] + k_pe)]
        transient = kv[1] + k_pe  # the kv and k_pe gradients (q's is rotated in place)
    else:
        passes = 2 * TORCH_ROPE_PASSES
        fwd += [
            MemBound(f"{label}.rope_q", passes * q_pe), MemBound(f"{label}.rope_k", passes * k_pe),
            MemBound(f"{label}.cat_query", 2 * query[1]), MemBound(f"{label}.cat_key", 2 * key[1]),
            MemBound(f"{label}.contiguous_value", 2 * value[1]),
        ]
        bwd += [
            MemBound(f"{label}.rope_q_bwd", passes * q_pe), MemBound(f"{label}.k_pe_sum", q_pe + k_pe),
            MemBound(f"{label}.rope_k_bwd", passes * k_pe), MemBound(f"{label}.q_grad", 2 * q[1]),
            MemBound(f"{label}.kv_grad", 2 * kv[1]),
        ]
        transient = sum(b for _, b in outs) + q[1] + kv[1]
        table = float(d.s * rope_widths[1] * d.act_bytes)
        saved = tuple((f"{name}.{t}_{f}", table) for t in ("q", "k") for f in ("cos", "sin"))
    if gathered:
        bwd.append(Collective("reduce_scatter", k_pe, "tp"))
    return Op(
        name=name, module="mla_rope", layer=layer, fwd=tuple(fwd), bwd_input=tuple(bwd),
        input=(q, kv, kv_comb),  # k_pe is a view into the kv down-projection output
        bwd_transient=transient, saved=saved,
    )


def _down_projection(name: str, module: str, layer: int, d: Dims, x: Tensor, n: int) -> Op:
    """A down-projection (hidden -> q or kv latent) as Megatron-Core builds it
    (``multi_latent_attention.MLASelfAttention``): TransformerEngine's linear in
    "duplicated" mode (the whole weight on every TP rank, run on the rank's own tokens); the
    local spec's ColumnParallelLinear instead splits the weight over TP (gather_output
    False), so ``_qkv_down_projection`` / ``get_query_key_value_tensors`` gather its output
    over TP and, with SP, shard the sequence again (linears.gathered_column_linear)."""
    if not d.local or d.tp == 1:
        return linears.replicated_linear(name, module, layer, d, x, d.h, n)
    return linears.gathered_column_linear(name, module, layer, d, x, d.h, n, te=False)


class Latents(NamedTuple):
    """The tensors MLA's down-projections leave for the up-projections and attention."""

    ln_out: Tensor  # the input norm's output (the hidden state attention reads)
    q_c_norm: Tensor | None  # the normed q latent (None: full-rank query)
    kv_comb: Tensor  # the kv down-projection's output: the kv latent and k_pe
    kv_c_norm: Tensor  # the normed kv latent
    table: tuple[Tensor, ...]  # the unfused RoPE's frequency table, () with the fused kernels


def latent_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_in: Tensor) -> tuple[list[Op], Latents]:
    """Input norm, q / kv down-projections and their norms (MLASelfAttention and
    AbsorbedMLASelfAttention alike)."""
    P = f"L{layer}"
    rms = model.norm_type == "rmsnorm"
    rope_dim = model.qk_pos_emb_head_dim
    kv_rank, q_rank = model.kv_lora_rank, model.q_lora_rank
    save_rstd = not st.recompute_variance

    ln_out = (f"{P}.attn_norm.out", d.act(d.h, local=True))
    ops = [blocks.norm(f"{P}.attn_norm", "attn_norm", layer, d, x_in, rms=rms, save_rstd=save_rstd, residual=True).with_(output=ln_out)]
    q_c_norm = None
    if q_rank:
        q_c = (f"{P}.q_down.out", d.act(q_rank, local=True))
        q_c_norm = (f"{P}.q_norm.out", d.act(q_rank, local=True))
        ops += [
            _down_projection(f"{P}.q_down", "q_down", layer, d, ln_out, q_rank).with_(output=q_c),
            blocks.norm(f"{P}.q_norm", "mla_q_norm", layer, d, q_c, rms=rms, save_rstd=save_rstd, width=q_rank).with_(output=q_c_norm),
        ]
    # the local spec's kv down-projection output is gathered over TP: every token's (k_pe a view of it)
    kv_comb = (f"{P}.kv_down.out", d.act(kv_rank + rope_dim, local=not (d.local and d.tp > 1)))
    # the unfused RoPE's frequency table, which MLASelfAttention computes in every layer
    # (fp32 [s, 1, 1, rope_dim]): a checkpoint of the up-projections (mla_up_proj) keeps it
    # as an input; the fused kernels take megatron-core's cached cos / sin instead
    table = () if st.apply_rope_fusion else ((f"{P}.rope_table", float(d.s * rope_dim * 4)),)
    kv_c = (f"{P}.kv_c", d.act(kv_rank, local=True))  # contiguous copy of the split for the norm
    kv_c_norm = (f"{P}.kv_norm.out", d.act(kv_rank, local=True))
    ops += [
        _down_projection(f"{P}.kv_down", "kv_down", layer, d, ln_out, kv_rank + rope_dim).with_(output=kv_comb, also_outputs=table),
        blocks.norm(f"{P}.kv_norm", "mla_kv_norm", layer, d, kv_c, rms=rms, save_rstd=save_rstd, width=kv_rank).with_(
            input=(kv_comb,), output=kv_c_norm
        ),
    ]
    return ops, Latents(ln_out, q_c_norm, kv_comb, kv_c_norm, table)


def mla_attention_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_in: Tensor) -> list[Op]:
    P = f"L{layer}"
    heads = d.heads
    nope, rope_dim, v_dim = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    q_dim = nope + rope_dim
    kv_rank, q_rank = model.kv_lora_rank, model.q_lora_rank
    ops, (ln_out, q_c_norm, kv_comb, kv_c_norm, table) = latent_ops(model, st, d, layer, x_in)

    q_full = (f"{P}.q_up.out", d.act(heads * q_dim))
    if q_rank:
        ops.append(linears.column_linear(f"{P}.q_up", "mla_up_proj", layer, d, q_c_norm, q_rank, heads * q_dim).with_(output=q_full))
    else:  # DeepSeek-V2-Lite: full-rank query projection on the hidden state
        ops.append(linears.column_linear(f"{P}.q_proj", "mla_up_proj", layer, d, ln_out, d.h, heads * q_dim).with_(output=q_full))
    kv_full = (f"{P}.kv_up.out", d.act(heads * (nope + v_dim)))
    ops.append(linears.column_linear(f"{P}.kv_up", "mla_up_proj", layer, d, kv_c_norm, kv_rank, heads * (nope + v_dim)).with_(output=kv_full))

    query = (f"{P}.query", d.act(heads * q_dim))
    key = (f"{P}.key", d.act(heads * q_dim))
    value = (f"{P}.value", d.act(heads * v_dim))
    rope = _rope_concat(f"{P}.rope", layer, d, q_full, kv_full, kv_comb, (heads * rope_dim, rope_dim), (query, key, value),
                        fused=st.apply_rope_fusion)
    ops.append(rope.with_(output=query, also_outputs=(key, value), input=(*rope.input, *table)))

    out = (f"{P}.attn.out", d.act(heads * v_dim))
    if st.use_math_sdp:
        core = attention.math_attention(f"{P}.attn", layer, d, query, key, value, qk_dim=q_dim, v_dim=v_dim, dropout=st.enable_dropout,
                                        fused_softmax=attention.softmax_kernel_available(d, st.masked_softmax_fusion))
    else:
        core = attention.flash_attention(f"{P}.attn", layer, d, query, key, value, out, qk_dim=q_dim, v_dim=v_dim, kv_heads=heads)
    ops.append(core.with_(output=out))
    ops.append(linears.row_linear(f"{P}.attn_proj", "attn_proj", layer, d, out, heads * v_dim, d.h, bias=model.add_bias_linear,
                                  keep_original=d.keeps_original_input))
    ops.append(blocks.dropout_add(f"{P}.attn_add", "attn_add", layer, d, dropout=st.enable_dropout))
    return ops
