"""DSA's lightning indexer (megatron-core ``DSAIndexer``, dsa.py) with the TileLang kernels, for
one layer that runs it, and its KL loss.

The indexer reads the detached hidden state and q latent, all-gathered over TP: every TP rank
runs it whole on the whole sequence (its projections are "duplicated" linears). Its wq_b / wk /
weights_proj GEMMs, RoPE and the concatenation on q and k, k's LayerNorm, the Hadamard rotation,
the weights' scaling and fp32 copies, then per block of 8192 query rows TileLang's indexer
kernel (``ops/tilelang_indexer_fwd.py``: q·k over each query block's causal keys, ReLU, weighted
sum over the indexer heads, fp32 logits of [rows, all keys]; ``clean_logits`` sets the rest to
-inf) and ``torch.topk`` over each row, the int32 copy, the bounds check and the copy into the
[b, s, k] result.

Without its loss (``dsa_indexer_loss_coeff`` null or 0) all of it runs under ``torch.no_grad``:
forward only, nothing kept. With the sparse loss (``dsa_indexer_use_sparse_loss``, TileLang's
``fused_qk_topk_lighting_with_streaming_sparse_kl``) the indexer runs with gradients: its
projections keep their inputs for the weight gradients (no data gradient: the inputs are
detached), k's LayerNorm its input and statistics, ``IndexerFunction`` (ops/indexer.py) its q,
k, fp32 weights and the block's top-k indices, and the top-k scores go on to the loss: per
chunk of 512 query rows the query copied out, TileLang's target kernel (the attention
probabilities over the top-k keys summed over the rank's heads), the target all-reduced over
TP (asynchronously, under the next chunk's kernel), and the fused KL kernel, which keeps the
logits' gradient. Backward: that gradient scaled, TileLang's indexer backward (the scores at
the top-k keys again, then dq and dk: three products of 2·Hi·Di per (query, key)), and the
element-wise chain and the weight gradients back.
"""

from __future__ import annotations

from simumax.config.dsa_rules import dsa_topk
from simumax.config.model import ModelConfig
from simumax.graph import linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, Gemm, MemBound, op_label
from simumax.graph.mla import rope_passes
from simumax.graph.ops import Op, Tensor

FP32, INT32, INT64 = 4, 4, 8
INDEXER_BLOCK_ROWS = 8192  # DSAttention's fused_indexer_block_size: query rows of logits at a time
LOSS_CHUNK_ROWS = 512  # the streaming loss's seq_chunk_size
KL_FUSED_TOPK = 256  # the fused KL kernel takes top-k in multiples of this (else the torch chain)
SCORES_APPROXIMATE = ("the indexer kernel (q·k with K = the indexer head dim, ReLU and the weighted head sum in "
                      "registers) costed at the GEMM rate of its shape; no measurement of the kernel exists")
# torch.topk over thousands of long rows takes PyTorch's multi-block radix select
# (aten/src/ATen/native/cuda/TensorTopK.cu, should_use_multiblock; RADIX_BITS 8): one counting
# pass over the rows per 8-bit digit of the fp32 key, then the pass that gathers the result
TOPK_PASSES = 32 // 8 + 1
TOPK_APPROXIMATE = ("torch.topk over each row of indexer logits: PyTorch's multi-block radix select taken as four "
                    "counting passes and one gathering pass over the logits from HBM, no early exit, no L2 reuse")
LOSS_APPROXIMATE = ("the indexer loss's TileLang kernels (target, KL, backward) costed at the GEMM rate of their "
                    "products and the least traffic of their tensors; the target's TP all-reduce taken as hidden "
                    "under the next chunk's kernel but for the last chunk's")


def topk_tensor(model: ModelConfig, d: Dims, layer: int) -> Tensor:
    """The int32 top-k key indices [b, s, k] a layer's indexer writes (SparseMLA keeps them)."""
    return (f"L{layer}.dsa.topk", float(d.b * d.s * dsa_topk(model, d.s * d.cp) * INT32))


def _indexer_blocks(d: Dims) -> int:
    """The blocks of query rows the indexer's logits and top-k run in."""
    return d.b * -(-d.s // INDEXER_BLOCK_ROWS)


def indexer_ops(model: ModelConfig, d: Dims, layer: int, x: Tensor, qr: Tensor,
                query: Tensor, key: Tensor) -> list[Op]:
    """The indexer of one layer that runs it (module docstring), and its loss when on; ``x``
    and ``qr`` the hidden state and the normed q latent it reads, ``query`` / ``key``
    attention's, which the loss's target reads."""
    name = f"L{layer}.dsa"
    label = op_label(name)
    loss = bool(model.dsa_indexer_loss_coeff)
    Hi, Di, rope = model.dsa_indexer_n_heads, model.dsa_indexer_head_dim, model.qk_pos_emb_head_dim
    q_in = model.q_lora_rank
    T, ab, b, s = d.tokens, d.act_bytes, d.b, d.s
    full = s * d.cp  # keys: the whole sequence (gathered over CP)
    k = dsa_topk(model, full)
    xg, qg = (f"{name}.x", d.act(d.h)), (f"{name}.qr", d.act(q_in))
    ops: list[Op] = []
    if d.sp:  # detached inputs: no gradient goes back through these gathers
        ops.append(Op(name=f"{name}.gather", module="core_attn", layer=layer,
                      fwd=(Collective("all_gather", xg[1], "tp"), Collective("all_gather", qg[1], "tp")), input=(x, qr),
                      fwd_transient=xg[1] + qg[1]))
    else:
        xg, qg = x, qr
    build = linears.wgrad_only_linear if loss else linears.no_grad_linear
    # the gathered inputs live through the projections (kept by them under the loss)
    alive = xg[1] + qg[1] if d.sp and not loss else 0.0
    for lin_name, src, k_in, n in (("wq_b", qg, q_in, Hi * Di), ("wk", xg, d.h, Di), ("weights_proj", xg, d.h, Hi)):
        op = build(f"{name}.{lin_name}", "core_attn", layer, d, src, k_in, n)
        ops.append(op.with_(fwd_transient=op.fwd_transient + alive))
    # k's LayerNorm: weight and bias, duplicated over TP like the projections
    ops[-2] = ops[-2].with_(params=ops[-2].params + 2 * Di, tp_replicated_params=ops[-2].tp_replicated_params + 2 * Di)

    q_elems, k_elems = T * Hi * Di, T * Di
    passes = rope_passes(fused=False)  # torch's RoPE: Megatron refuses RoPE fusion with DSA
    elementwise = [
        MemBound(f"{label}.rope_q", passes * T * Hi * rope * ab), MemBound(f"{label}.cat_q", 2 * q_elems * ab),
        MemBound(f"{label}.k_norm", 2 * k_elems * ab), MemBound(f"{label}.rope_k", passes * T * rope * ab),
        MemBound(f"{label}.cat_k", 2 * k_elems * ab),
        # weights * n_heads^-0.5 * softmax_scale (two products), then the fp32 copies the kernel takes
        MemBound(f"{label}.weights_scale", 4 * T * Hi * ab + 2 * T * Hi * (ab + FP32), launches=4),
    ]
    if model.dsa_indexer_rotate_activation:  # fast Hadamard transform of q and k (read and write each)
        elementwise.append(MemBound(f"{label}.rotate", 2 * (q_elems + k_elems) * ab, launches=2))
    if d.cp > 1:  # k gathered over CP and put back in sequence order (index_select)
        gathered = float(b * full * Di * ab)
        elementwise += [Collective("all_gather", gathered, "cp"), MemBound(f"{label}.k_reorder", 2 * gathered)]
    if b > 1:  # q[:, bi].contiguous(), k[:, bi].contiguous() per sequence of the micro-batch
        elementwise.append(MemBound(f"{label}.per_sequence", 2 * (q_elems + k_elems * d.cp) * ab, launches=2 * b))
    rows = min(s, INDEXER_BLOCK_ROWS)
    blocks_n = _indexer_blocks(d)
    logits = float(b * s * full * FP32)
    # keys per query row on average: the causal half of the sequence (with CP the rank's two
    # load-balanced chunks), or with packed documents the causal part of each row's document
    # (the kernel reads each row's [start, end) bounds; its logits still span the sequence)
    keys = sum(n * l * (l + 1) // 2 for l, n in d.docs) // s if d.docs else (full + 1) // 2
    scores = [
        # q·k over those keys per indexer head, ReLU and the weighted head sum in one kernel:
        # its products as a GEMM of the tensor cores (the fp32 logits it writes are the next kernel's)
        Gemm(s * Hi, Di, keys, "TN", b=b, out_dtype="fp32", fused=True),
        MemBound(f"{label}.logits_write", logits / 2, launches=blocks_n),  # the kernel's causal half
        MemBound(f"{label}.clean_logits", logits / 2, launches=blocks_n),  # the other half set to -inf
    ]
    topk_kernels = [
        MemBound(f"{label}.topk", TOPK_PASSES * logits + b * s * k * (FP32 + INT64), launches=TOPK_PASSES * blocks_n),
        MemBound(f"{label}.topk_int32", b * s * k * (INT64 + INT32), launches=blocks_n),
        MemBound(f"{label}.topk_sanitize", 2 * b * s * k * INT32, launches=blocks_n),  # bounds check of the indices
        MemBound(f"{label}.topk_copy", 2 * b * s * k * INT32, launches=blocks_n),  # into topk_out
    ]
    block_logits = float(rows * full * FP32)
    scores_op = Op(name=f"{name}.scores", module="core_attn", layer=layer, fwd=(*elementwise, *scores),
                   input=(xg, qg), fwd_transient=float((q_elems + k_elems) * ab * 2) + block_logits,
                   approximate=SCORES_APPROXIMATE)
    topk_op = Op(name=f"{name}.topk", module="core_attn", layer=layer, fwd=tuple(topk_kernels),
                 output=topk_tensor(model, d, layer),
                 fwd_transient=block_logits + rows * k * (FP32 + INT64 + INT32), approximate=TOPK_APPROXIMATE)
    if not loss:
        return [*ops, scores_op, topk_op]
    return [*ops, *_with_loss(model, d, name, scores_op, topk_op, query, key)]


def _with_loss(model: ModelConfig, d: Dims, name: str, scores_op: Op, topk_op: Op,
               query: Tensor, key: Tensor) -> list[Op]:
    """The scores and top-k ops with what the indexer keeps and runs backward under the sparse
    loss, and the loss op itself (module docstring)."""
    label = op_label(name)
    Hi, Di, rope = model.dsa_indexer_n_heads, model.dsa_indexer_head_dim, model.qk_pos_emb_head_dim
    T, ab, b, s, H = d.tokens, d.act_bytes, d.b, d.s, d.heads
    k = dsa_topk(model, s * d.cp)
    k_pad = 1 << (k - 1).bit_length()  # the backward kernel takes a power of two (_canonical_topk)
    q_elems, k_elems = T * Hi * Di, T * Di
    scored = float(T * k * FP32)  # one fp32 per (query, chosen key)
    saved: list[Tensor] = [
        (f"{name}.k_norm_in", float(k_elems * ab)), (f"{name}.k_norm_stats", float(2 * T * FP32)),
        (f"{name}.q", float(q_elems * ab)), (f"{name}.k", float(k_elems * d.cp * ab)),  # k gathered over CP
        (f"{name}.weights_fp32", float(T * Hi * FP32)), (f"{name}.block_topk", float(T * k * INT32)),
    ]
    # the torch RoPE's cos / sin, q's and k's (DSA runs without RoPE fusion: config/dsa_rules.py)
    saved += [(f"{name}.rope_{t}", float(d.s * rope * ab)) for t in ("q_cos", "q_sin", "k_cos", "k_sin")]
    passes = rope_passes(fused=False)
    bwd: list = []
    if k_pad != k:  # top-k indices and score gradients padded to the power of two
        bwd.append(MemBound(f"{label}.topk_pad", 2 * T * k_pad * (INT32 + FP32), launches=4))
    bwd += [
        MemBound(f"{label}.grad_k_zero", k_elems * d.cp * FP32),
        # the scores at the chosen keys again, dq and dk: three products of 2·Hi'·Di per pair
        Gemm(T * max(Hi, 16), Di, k_pad, "NN", b=3, out_dtype="fp32", fused=True),
        MemBound(f"{label}.bwd_out", q_elems * ab + T * Hi * FP32 + 2 * k_elems * d.cp * FP32),  # dq, dw, dk (atomic)
        MemBound(f"{label}.grad_casts", k_elems * d.cp * (FP32 + ab) + T * Hi * (FP32 + ab), launches=2),
        MemBound(f"{label}.weights_scale_bwd", 4 * T * Hi * ab, launches=2),
    ]
    if model.dsa_indexer_rotate_activation:
        bwd.append(MemBound(f"{label}.rotate_bwd", 2 * (q_elems + k_elems) * ab, launches=2))
    bwd += [
        MemBound(f"{label}.rope_bwd", passes * T * (Hi + 1) * rope * ab, launches=2),
        MemBound(f"{label}.grad_cat", 2 * (q_elems + k_elems) * ab, launches=2),  # [x_pe, x_nope] grads re-joined
        MemBound(f"{label}.k_norm_bwd", 3 * k_elems * ab + 2 * T * FP32),
    ]
    if d.cp > 1:  # dk of the gathered k re-ordered (index_add) and reduce-scattered over CP
        gathered = float(b * s * d.cp * Di * ab)
        bwd += [MemBound(f"{label}.dk_reorder", 3 * gathered, launches=2), Collective("reduce_scatter", gathered, "cp")]
    scores_op = scores_op.with_(saved=tuple(saved), bwd_input=tuple(bwd),
                                bwd_transient=float(q_elems * ab + 2 * k_elems * FP32 + T * Hi * FP32 + T * k_pad * FP32))
    tp_sort: list = []
    if d.tp > 1:  # _canonicalize_topk_scores_for_tp_reduce: each row's slots sorted by key index
        tp_sort = [MemBound(f"{label}.topk_sort", 4 * T * k * (INT32 + FP32), launches=_indexer_blocks(d))]
    topk_op = topk_op.with_(fwd=(*topk_op.fwd, *tp_sort), bwd_input=tuple(
        MemBound(f"{label}.topk_sort_bwd", 2 * scored) for _ in tp_sort))

    chunks = b * -(-s // LOSS_CHUNK_ROWS)
    qk = model.kv_lora_rank + model.qk_pos_emb_head_dim  # the absorbed query's width
    fwd: list = [
        MemBound(f"{label}.loss_indices", T * k * (2 * INT32 + 2), launches=2 * chunks),  # valid mask, masked copy
        MemBound(f"{label}.loss_query", 2 * query[1], launches=chunks),  # each chunk's query made contiguous
        # the target: attention logits at the chosen keys, softmax, summed over the rank's heads
        Gemm(T * H, qk, k, "TN", out_dtype="fp32", fused=True),
        MemBound(f"{label}.loss_target", 3 * scored, launches=2 * chunks),  # written, copied to its scratch slot
    ]
    if d.tp > 1:  # each chunk's all-reduce runs under the next chunk's kernel: the last one's is exposed
        fwd.append(Collective("all_reduce", scored / chunks, "tp"))
    if k % KL_FUSED_TOPK == 0:  # SparseIndexerKLLoss: reads target, logits, mask; writes the gradient
        fwd.append(MemBound(f"{label}.kl", scored * 3 + T * k, launches=chunks))
    else:  # the torch chain: normalise, log-softmax, exp, KL sum, the gradient and its surrogate
        fwd.append(MemBound(f"{label}.kl", scored * 14 + T * k * 3, launches=10 * chunks))
    loss_op = Op(name=f"{name}.loss", module="core_attn", layer=scores_op.layer, fwd=tuple(fwd),
                 bwd_input=(MemBound(f"{label}.kl_bwd", 2 * scored),),
                 saved=((f"{name}.kl_grad", scored),), input=(query, key, topk_op.output),  # type: ignore[arg-type]
                 fwd_transient=3 * scored / chunks + query[1] / chunks, bwd_transient=scored,
                 approximate=LOSS_APPROXIMATE)
    return [scores_op, topk_op, loss_op]
