"""DeepSeek sparse attention (DSA, DeepSeek-V3.2) as Megatron-Core 0.19 runs it with the
TileLang kernels, for one micro-batch on one TP rank.

The layer is ``AbsorbedMLASelfAttention`` (experimental_attention_variant/absorbed_mla.py)
around ``DSAttention`` (dsa.py):

* MLA's input norm, down-projections and norms as usual (graph/mla.latent_ops); with SP the
  normed kv latent and k_pe are all-gathered over TP.
* Matrix absorption: the q up-projection runs, but the kv up-projection's weight is never a
  linear: its K part multiplies each head's q_nope into the latent space (a batched GEMM per
  head, ``einsum("...nd,ndk->...nk")``), its V part the attention output back out of it; the
  query is [q_absorbed, q_pe] (kv_lora + rope wide), the key the single latent kv head
  [kv, k_pe] (MQA). Both weights' gradients are written into the kv up-projection's grad and
  DDP's hook adds it to the main grad (no gradient-accumulation fusion: no TE linear runs).
* The lightning indexer (``DSAIndexer``), and its loss when on: graph/dsa_indexer.py. A layer
  that shares an earlier layer's top-k (``dsa_indexer_topk_freq``) runs neither.
* SparseMLA (``ops/sparse_mla.py``): flash attention over the top-k keys of each query, heads
  padded to 16; it keeps q, kv, the indices and a valid-head mask, and its backward runs the
  forward kernel again for the output and log-sum-exp before the delta and backward kernels.
"""

from __future__ import annotations

from simumax.config.dsa_rules import dsa_topk, sparse_mla_heads
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.dsa_indexer import FP32, INT32, indexer_ops, topk_tensor
from simumax.graph.kernels import Attention, Collective, Gemm, MemBound, op_label
from simumax.graph.mla import latent_ops, rope_passes
from simumax.graph.ops import Op, Tensor


def dsa_attention_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_in: Tensor) -> list[Op]:
    P = f"L{layer}"
    H, T = d.heads, d.tokens
    nope, rope, v_dim, C = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim, model.kv_lora_rank
    qk = C + rope
    ops, lat = latent_ops(model, st, d, layer, x_in)
    ab = d.act_bytes

    q_full = (f"{P}.q_up.out", d.act(H * (nope + rope)))
    q_rank = model.q_lora_rank  # DSA has a q latent (ModelConfig's check, as megatron-core)
    assert q_rank and lat.q_c_norm is not None
    ops.append(linears.column_linear(f"{P}.q_up", "mla_up_proj", layer, d, lat.q_c_norm, q_rank,
                                     H * (nope + rope)).with_(output=q_full))
    query = (f"{P}.query", float(T * H * qk * ab))
    key = (f"{P}.key", float(T * qk * ab))
    kv: tuple[Tensor, ...] = (lat.kv_c_norm, lat.kv_comb)  # k_pe a view of the kv down-projection's output
    if d.sp:  # the normed kv latent and k_pe gathered over TP before the up-projections' checkpoint
        gathered = (f"{P}.kv_gathered", d.act(C + rope))
        ops.append(Op(name=f"{P}.kv_gather", module="mla_kv_gather", layer=layer,
                      fwd=(Collective("all_gather", d.act(C), "tp"), Collective("all_gather", d.act(rope), "tp")),
                      bwd_input=(Collective("reduce_scatter", d.act(C), "tp"), Collective("reduce_scatter", d.act(rope), "tp")),
                      input=kv, output=gathered))
        kv = (gathered,)
    ops.append(_absorb(P, layer, d, q_full, kv, (query, key), (nope, rope, C), lat.table))

    topk = None  # a layer sharing an earlier one's top-k keeps none of its own (kept by that layer)
    if model.dsa_computes_topk(layer):
        ops += indexer_ops(model, d, layer, lat.ln_out, lat.q_c_norm, query, key)
        topk = topk_tensor(model, d, layer)
    latent_out = (f"{P}.attn.latent", float(T * H * C * ab))
    ops.append(_sparse_mla(P, layer, d, model, query, key, topk, latent_out))
    out = (f"{P}.attn.out", d.act(H * v_dim))
    ops.append(_v_up(P, layer, d, latent_out, (H, v_dim, nope, C)).with_(output=out))
    ops.append(linears.row_linear(f"{P}.attn_proj", "attn_proj", layer, d, out, H * v_dim, d.h,
                                  keep_original=d.keeps_original_input))
    ops.append(blocks.dropout_add(f"{P}.attn_add", "attn_add", layer, d, dropout=st.enable_dropout))
    return ops


def _absorb(P: str, layer: int, d: Dims, q_full: Tensor, kv_in: tuple[Tensor, ...], outs: tuple[Tensor, Tensor],
            dims: tuple[int, int, int], table: tuple[Tensor, ...]) -> Op:
    """``qkv_up_proj_and_rope_apply`` after the q up-projection: each head's q_nope times the
    K part of the kv up-projection (batched GEMM, then ``.contiguous()``), the concatenations
    into query [q_absorbed, q_pe] and key [kv, k_pe]; torch's RoPE on the positional parts
    before the concatenations (Megatron refuses RoPE fusion with DSA: config/dsa_rules.py),
    which keeps its cos / sin tables for q and k. Backward: the RoPE backward, the data and weight gradients of
    the absorption (the weight's written, as the einsum's autograd does), and q's gradient
    re-assembled from its two parts. The absorption keeps q_nope, i.e. the q up-projection's
    output it is a view of."""
    nope, rope, C = dims
    H, T, ab = d.heads, d.tokens, d.act_bytes
    label = op_label(f"{P}.q_absorb")
    query, key = outs
    q_pe, k_pe = float(T * H * rope * ab), float(T * rope * ab)
    absorbed = float(T * H * C * ab)
    passes = rope_passes(fused=False)
    fwd = (Gemm(T, nope, C, "TN", b=H), MemBound(f"{label}.contiguous", 2 * absorbed),
           MemBound(f"{label}.rope_q", passes * q_pe), MemBound(f"{label}.rope_k", passes * k_pe),
           MemBound(f"{label}.cat_query", 2 * query[1]), MemBound(f"{label}.cat_key", 2 * key[1]))
    rope_bwd = [MemBound(f"{label}.rope_q_bwd", passes * q_pe), MemBound(f"{label}.rope_k_bwd", passes * k_pe)]
    table_bytes = float(d.s * rope * ab)
    saved: tuple[Tensor, ...] = (q_full, *((f"{P}.q_absorb.{t}_{f}", table_bytes) for t in ("q", "k") for f in ("cos", "sin")))
    bwd = [*rope_bwd, Gemm(T, C, nope, "NN", b=H), MemBound(f"{label}.q_grad", 2 * q_full[1])]
    k_up_grad = Gemm(nope, T, C, "NT", b=H)
    return Op(
        name=f"{P}.q_absorb", module="mla_rope", layer=layer, fwd=fwd, bwd_input=tuple(bwd),
        bwd_weight=(linears.written_wgrad(k_up_grad, ab),), saved=saved, input=(q_full, *kv_in, *table),
        output=query, also_outputs=(key,), fwd_transient=absorbed,
        bwd_transient=absorbed + q_full[1] + query[1] + key[1],
    )


def _sparse_mla(P: str, layer: int, d: Dims, model: ModelConfig, query: Tensor, key: Tensor, topk: Tensor | None,
                latent_out: Tensor) -> Op:
    """SparseMLA over the top-k keys (``fused_sparse_mla_absorbed``): per sequence the query
    and key as [b, s, heads, dim] (copies when b > 1), heads padded to 16, the valid-head mask
    from the indices; the forward kernel, the invalid heads' output zeroed, the latent output
    sliced back to the rank's heads and made contiguous. Keeps q (its padded copy), kv, the
    indices (a layer that shares them keeps the computing layer's tensor, counted there) and
    the mask. Backward: dO made contiguous and masked, the forward kernel again (output and
    log-sum-exp), the masked output, the delta kernel, the backward kernel, dq masked. With
    context parallelism (all-gather only: DSAttention asserts it) the rank's query rows (two
    load-balanced chunks) attend the key gathered over CP, which it keeps."""
    H, T, ab, b, s = d.heads, d.tokens, d.act_bytes, d.b, d.s
    C, qk = model.kv_lora_rank, model.kv_lora_rank + model.qk_pos_emb_head_dim
    Hk = sparse_mla_heads(H)
    k = dsa_topk(model, s * d.cp)
    label = op_label(f"{P}.sparse_attn")
    shape = dict(batch=b, seq_len=s, kv_seq_len=k, head_num=Hk, kv_head_num=1, qk_head_dim=qk, v_head_dim=C, causal=False)
    padded_q = float(T * Hk * qk * ab)
    out_k = float(T * Hk * C * ab)  # the kernel's output over the padded heads
    lse = float(T * Hk * FP32)
    mask = float(T * Hk)  # valid_heads, bool
    fwd: list = []
    bwd_cp: list = []
    local_key = key
    if d.cp > 1:
        # all-gather CP: the key (the one latent head) gathered over CP and put back in sequence
        # order (index_select); backward its gradient re-ordered (index_add) and reduce-scattered
        gathered = key[1] * d.cp
        fwd += [Collective("all_gather", 8.0 * d.cp, "cp"),  # _validate_nonpacked_cp_uniform_length
                Collective("all_gather", gathered, "cp"), MemBound(f"{label}.kv_reorder", 2 * gathered)]
        bwd_cp = [MemBound(f"{label}.dkv_reorder", 3 * gathered, launches=2), Collective("reduce_scatter", gathered, "cp")]
        key = (f"{P}.sparse_attn.kv_gathered", gathered)
    saved_q = query
    if b > 1 or Hk > H:  # the [s, b] -> [b, s] permute is a copy for b > 1; the head pad writes a new tensor
        saved_q = (f"{P}.sparse_attn.q", padded_q)
        fwd.append(MemBound(f"{label}.q_layout", query[1] + padded_q))
    saved_kv = key
    if b > 1:
        saved_kv = (f"{P}.sparse_attn.kv", key[1])
        fwd.append(MemBound(f"{label}.kv_layout", 2 * key[1]))
    fwd += [MemBound(f"{label}.valid_heads", b * s * k * (INT32 + 1) + 2 * mask, launches=3),
            Attention("fwd", **shape),  # type: ignore[arg-type]
            MemBound(f"{label}.zero_invalid", 2 * out_k + mask + 2 * lse, launches=2)]
    fwd.append(MemBound(f"{label}.out_contiguous", out_k + latent_out[1]))
    bwd = [MemBound(f"{label}.dout_layout", out_k + latent_out[1]), MemBound(f"{label}.zero_invalid_dout", 2 * out_k + mask),
           Attention("fwd", **shape, rerun=True),  # type: ignore[arg-type]
           MemBound(f"{label}.zero_invalid_out", 2 * out_k + mask + 2 * lse, launches=2),
           MemBound(f"{label}.delta", 2 * out_k + T * Hk * FP32),
           Attention("bwd", **shape),  # type: ignore[arg-type]
           MemBound(f"{label}.zero_invalid_dq", 2 * padded_q + mask)]
    if b > 1 or Hk > H:
        bwd.append(MemBound(f"{label}.dq_layout", padded_q + query[1]))
    bwd += bwd_cp
    saved = (saved_q, saved_kv, *((topk,) if topk else ()), (f"{P}.sparse_attn.valid_heads", mask))
    return Op(
        name=f"{P}.sparse_attn", module="core_attn", layer=layer, fwd=tuple(fwd), bwd_input=tuple(bwd),
        saved=saved, input=(query, local_key, *((topk,) if topk else ())), output=latent_out,
        fwd_transient=out_k + lse + (padded_q if saved_q is not query else 0.0),
        bwd_transient=2 * out_k + lse + T * Hk * FP32 + padded_q + key[1],
    )


def _v_up(P: str, layer: int, d: Dims, latent_out: Tensor, dims: tuple[int, int, int, int]) -> Op:
    """The V part of the kv up-projection on the latent output (``einsum("sbhc,hdc->sbhd")``
    inside DSAttention, then ``.contiguous()``): a batched GEMM per head, keeping the latent
    output; backward its data gradient and the written weight gradient, which autograd adds to
    the K part's in the kv up-projection's grad and DDP's hook adds to the main grad. The kv
    up-projection's parameters are counted here."""
    H, v_dim, nope, C = dims
    T, ab = d.tokens, d.act_bytes
    label = op_label(f"{P}.v_up")
    out = float(T * H * v_dim * ab)
    kv_up = C * H * (nope + v_dim)
    add, held = linears.wgrad_hook_add(op_label(f"{P}.kv_up"), kv_up, ab, d.main_grad_bytes, d.grad_hook)
    return Op(
        name=f"{P}.v_up", module="core_attn", layer=layer,
        fwd=(Gemm(T, C, v_dim, "TN", b=H), MemBound(f"{label}.contiguous", 2 * out)),
        bwd_input=(Gemm(T, v_dim, C, "NN", b=H),),
        bwd_weight=(linears.written_wgrad(Gemm(v_dim, T, C, "NT", b=H), ab),
                    MemBound(f"{label}.kv_up_grad", 3 * kv_up * ab, launches=2), *add),  # the two slices into one grad
        saved=(latent_out,), input=(latent_out,), params=kv_up,
        fwd_transient=out, bwd_transient=float(T * H * C * ab) + held,
    )
