"""Core attention as Megatron-Core / TransformerEngine run it: flash attention (with the
context-parallel schemes, their all-to-alls, gathers and ring transfers) and the unfused
math path (QK^T, softmax, dropout, PV as batched GEMMs and memory-bound kernels)."""

from __future__ import annotations

from simumax.graph.dims import Dims
from simumax.graph.kernels import Attention, Collective, Gemm, MemBound, op_label
from simumax.graph.ops import Op, Tensor

FP32 = 4


def _a2a_relayout(name: str, nbytes: float, group: str = "cp") -> list:
    """TransformerEngine's ``flash_attn_a2a_communicate`` for one tensor: a layout copy
    (reshape + movedim + contiguous: read and write) before the all-to-all over CP (or its
    a2a+p2p all-to-all group) and one after it."""
    return [MemBound(f"{op_label(name)}.a2a_layout", 2 * nbytes), Collective("all2all", nbytes, group),
            MemBound(f"{op_label(name)}.a2a_layout", 2 * nbytes)]


def _to_heads(name: str, qkv_bytes: tuple[float, float, float], out_bytes: float, group: str) -> tuple[list, list, list, list]:
    """The all-to-alls around attention (Ulysses): q, k, v to heads before the forward and
    the output back after it; O and dO to heads before the backward and dq, dk, dv back."""
    q_b, k_b, v_b = qkv_bytes
    to_heads = [k for part, b in (("q", q_b), ("k", k_b), ("v", v_b)) for k in _a2a_relayout(f"{name}.{part}", b, group)]
    back = _a2a_relayout(f"{name}.out", out_bytes, group)
    d_out = _a2a_relayout(f"{name}.o", out_bytes, group) + _a2a_relayout(f"{name}.dout", out_bytes, group)
    d_qkv = [k for part, b in (("dq", q_b), ("dk", k_b), ("dv", v_b)) for k in _a2a_relayout(f"{name}.{part}", b, group)]
    return to_heads, back, d_out, d_qkv


def _kernels(phase: str, shapes: list[dict]) -> list[Attention]:
    return [Attention(phase, **sh) for sh in shapes]  # type: ignore[arg-type]


def _ring(name: str, shapes: list[dict], n: int, q_b: float, kv_bytes: float, out_bytes: float, group: str) -> tuple[list, list]:
    """The load-balanced KV ring over ``n`` ranks of ``group`` (see p2p below), on the
    attention ``shapes`` of one rank (one per length of packed document: TE splits each
    document into 2·cp chunks, so every step attends each document's chunks)."""
    if n == 1:
        return _kernels("fwd", shapes), _kernels("bwd", shapes)
    steps = [dict(sh, kv_seq_len=sh["seq_len"] // 2, causal=False) for sh in shapes]
    send = Collective("p2p", kv_bytes, group)
    ring = ring_elementwise(name, n, q_b, kv_bytes, out_bytes)
    fwd = ([ring["kv_buffer"], *_kernels("fwd", shapes)]
           + [send, ring["fwd_half"], *_kernels("fwd", steps)] * (n - 1)
           + [ring["out_correction"]])
    bwd = ([ring["kv_buffer"], *_kernels("bwd", shapes), ring["grad_init"]]
           + [send, Collective("p2p", kv_bytes, group), ring["bwd_half"], *_kernels("bwd", steps), ring["grad_accumulate"]] * (n - 1))
    return fwd, bwd


def document_shapes(d: Dims, shape: dict, window: int | None) -> list[dict]:
    """The attention shapes of one rank: ``shape`` (a sliding window shorter than the
    sequence kept), or with documents packed into the sequence (``d.docs``, THD attention
    over cu_seqlens) one per document length, its documents as the batch: attention stays
    inside each document, so n documents of length l cost what a batch of n sequences of
    l does (FLOPs, and the kernel's efficiency at that length); with CP each rank holds
    l / cp tokens of each (two of its 2·cp chunks)."""
    out = []
    for length, count in d.docs or ((d.s * d.cp, 1),):
        sh = dict(shape, batch=shape["batch"] * count, seq_len=length // d.cp)
        if window is not None and window < length:  # a window past the document is full attention
            sh["window"] = window
        out.append(sh)
    return out


def _to_heads_shape(shape: dict, n: int) -> dict:
    """One rank's attention after an all-to-all over ``n`` CP ranks: n times the sequence,
    1/n of the heads."""
    return dict(shape, seq_len=shape["seq_len"] * n, head_num=shape["head_num"] // n, kv_head_num=max(shape["kv_head_num"] // n, 1))


def _all_gather_parts(shape: dict, cp: int) -> list[dict]:
    """The attention blocks of one rank under the all-gather scheme. Causal: the two local
    query chunks over the keys up to their ends, one non-causal block of s x s·cp/2 on
    average (every rank the same work: the load balancing). With a sliding window of w keys
    TE slices each chunk's keys to the window before it
    (``get_kv_seq_info_after_all_gather``: the chunk's s/2 rows over at most s/2 + w - 1
    keys, bottom-right aligned): the chunks are not balanced then, and the rank holding the
    two middle chunks (cp - 1 and cp of 2·cp), the one that sees the most keys, sets the time."""
    s = shape["seq_len"]
    w = shape.get("window")
    if w is None:
        return [dict(shape, kv_seq_len=s * cp // 2, causal=False)]
    c = s // 2
    return [dict(shape, seq_len=c, kv_seq_len=c + min(w - 1, chunk * c)) for chunk in (cp - 1, cp)]


def _cp_attention_kernels(d: Dims, shapes: list[dict], name: str, qkv_bytes: tuple[float, float, float],
                          out_bytes: float) -> tuple[list, list]:
    """Attention kernels and CP collectives of one rank (TransformerEngine's schemes,
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``).

    * a2a (Ulysses, ``AttnFuncWithCPAndQKVOA2A``): q, k and v each go through their own
      all-to-all (sequence- to head-sharded) with a layout copy before and after; attention
      runs on the full sequence with heads / cp; its output comes back the same way and is
      what attention keeps (the projection's input). In backward O and dO go to heads the
      same way and dq, dk, dv come back.
    * all_gather (``AttnFuncWithCPAndKVAllGather``): K and V all-gathered over CP before
      any attention runs (not overlapped), reordered into sequence order (index_select: a
      read and a write of the gathered K, V); the two local query chunks attend the causal
      part of the full sequence (one non-causal block of s/cp x s/2 on average; a sliding
      window: ``_all_gather_parts``), and their outputs are copied into place. Backward
      gathers again, reorders, and reorders dK, dV before reduce-scattering them.
      TE runs a sliding window with context parallelism in this scheme and a2a only.
    * a2a+p2p (hierarchical, ``AttnFuncWithCPAndKVP2P`` given the all-to-all group too): the
      all-to-alls of a2a inside the first level of ``hierarchical_context_parallel_sizes``,
      then the ring below over the second level, on the all-to-all's longer sequence and
      fewer heads.
    * p2p (``AttnFuncWithCPAndKVP2P``, ring over load-balanced chunks: the sequence in 2·cp
      chunks, rank i holding chunks i and 2cp-1-i): cp steps, the first causal on the local
      chunks, the others non-causal against half of them (kernels at that chunk length);
      step i+1's KV is sent and received while step i computes (``Coster`` hides a CP P2P
      under the attention kernel before it), and in backward each step's dKV travels on
      under the next step.
    """
    cp = d.cp
    if cp == 1:
        return _kernels("fwd", shapes), _kernels("bwd", shapes)
    q_b, k_b, v_b = qkv_bytes
    if d.cp_comm == "a2a":
        full = [_to_heads_shape(sh, cp) for sh in shapes]
        to_heads, back, d_out, d_qkv = _to_heads(name, qkv_bytes, out_bytes, "cp")
        return [*to_heads, *_kernels("fwd", full), *back], [*d_out, *_kernels("bwd", full), *d_qkv]
    kv_bytes = k_b + v_b
    if d.cp_comm == "a2a+p2p":
        # AttnFuncWithCPAndKVP2P with [cp_group_a2a, cp_group]: q, k, v to heads over the
        # all-to-all group first, the ring over the other level on the longer sequence, the
        # output back (and the mirror in backward)
        fwd, bwd = _ring(name, [_to_heads_shape(sh, d.cp_a2a) for sh in shapes], d.cp_p2p, q_b, kv_bytes, out_bytes, "cp_p2p")
        if d.cp_a2a == 1:
            return fwd, bwd
        to_heads, back, d_out, d_qkv = _to_heads(name, qkv_bytes, out_bytes, "cp_a2a")
        return [*to_heads, *fwd, *back], [*d_out, *bwd, *d_qkv]
    if d.cp_comm == "all_gather":
        gathered = kv_bytes * cp
        ag = Collective("all_gather", gathered, "cp")
        reorder = MemBound(f"{op_label(name)}.kv_reorder", 2 * gathered)
        parts = [p for sh in shapes for p in _all_gather_parts(sh, cp)]
        fwd = [ag, reorder, *_kernels("fwd", parts), MemBound(f"{op_label(name)}.out_copy", 2 * out_bytes)]
        bwd = [ag, reorder, *_kernels("bwd", parts), MemBound(f"{op_label(name)}.dkv_reorder", 2 * gathered),
               Collective("reduce_scatter", gathered, "cp")]
        return fwd, bwd
    return _ring(name, shapes, cp, q_b, kv_bytes, out_bytes, "cp")


def ring_elementwise(name: str, cp: int, q_bytes: float, kv_bytes: float, out_bytes: float) -> dict[str, MemBound]:
    """The memory-bound work of TransformerEngine's load-balanced KV ring around its
    attention kernels (``AttnFuncWithCPAndKVP2P`` in
    ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``,
    TE 2.x; TE 1.x's ``AttnFuncWithCP`` does the same work), for a rank in the middle of the
    ring: steps after the first take the full output or only its second half by rank
    (rank r corrects the full output on r of its cp - 1 steps), so each counts the mean of
    both.

    Forward: K and V are concatenated into the ring's send buffer (``torch.cat``: read,
    write); each later step makes the half it attends with contiguous for the fused kernel
    (half of KV or half of Q: read + write of the half, both halves on average); the
    partial outputs are merged after the last step (``flash_attn_fwd_out_correction_init``:
    read O_0, write O; then per step ``out.add_(out_i · exp(lse_i - lse))``: read O_i and O,
    write O, or half of it for ``second_half_out_correction``: 3·O and 1.5·O, 2.25·O on
    average). Backward: KV is copied into the ring buffer again; dQ and dKV start as copies
    of the first step's (read + write) and each later step adds its partial into them
    (``dq.add_``, ``dkv.add_``: 2.25· on average as above); the halves of q, out and dout
    (or of KV) are made contiguous as in forward. The lse merges (fp32, s values a head)
    run on the second stream beside the next step's attention and are not counted."""
    later = cp - 1
    return {
        "kv_buffer": MemBound(f"{op_label(name)}.cp_kv_buffer", 2 * kv_bytes),
        "fwd_half": MemBound(f"{op_label(name)}.cp_half_copy", (kv_bytes + q_bytes) / 2),
        "out_correction": MemBound(f"{op_label(name)}.cp_out_correction", 2 * out_bytes + later * 2.25 * out_bytes,
                                   launches=cp),
        "grad_init": MemBound(f"{op_label(name)}.cp_grad_init", 2 * (q_bytes + kv_bytes), launches=2),
        "bwd_half": MemBound(f"{op_label(name)}.cp_half_copy", (kv_bytes + q_bytes + 2 * out_bytes) / 2, launches=2),
        "grad_accumulate": MemBound(f"{op_label(name)}.cp_grad_accumulate", 2.25 * (q_bytes + kv_bytes), launches=2),
    }


def flash_attention(
    name: str, layer: int, d: Dims, q: Tensor, k: Tensor, v: Tensor, out: Tensor, *, qk_dim: int, v_dim: int, kv_heads: int | None = None,
    window: int | None = None, sink_params: int = 0, copies: dict[str, Tensor] | None = None,
) -> Op:
    """Flash attention: saves q, k, v, the output and the fp32 log-sum-exp (per CP rank).
    ``copies``: which of "q", "k", "v" TE copies into contiguous tensors first (read and
    write), and the copies, which the kernels then take and attention keeps.

    q, k, v may be views of a larger buffer (v of the fused QKV output): keeping them keeps
    that buffer. With CP a2a the attention saves the tensors its all-to-alls produced (each
    exactly its own size) and the sequence-sharded output it returns; the views die with
    the layer."""
    kvh = kv_heads or d.kv_heads
    shape = dict(batch=d.b, seq_len=d.s, head_num=d.heads, kv_head_num=kvh, qk_head_dim=qk_dim, v_head_dim=v_dim)
    own = (float(d.tokens * d.heads * qk_dim * d.act_bytes), float(d.tokens * kvh * qk_dim * d.act_bytes),
           float(d.tokens * kvh * v_dim * d.act_bytes))
    out_bytes = float(d.tokens * d.heads * v_dim * d.act_bytes)
    fwd, bwd = _cp_attention_kernels(d, document_shapes(d, shape, window), name, own, out_bytes)
    copies = copies or {}
    if copies:  # q, k, v made contiguous before the kernels (the caller says which)
        fwd = [MemBound(f"{op_label(name)}.contiguous", 2 * sum(t[1] for t in copies.values())), *fwd]
    lse = (f"{name}.lse", float(d.b * d.heads * d.s * FP32))
    grads = sum(own) + out_bytes
    gathered_kv = (own[1] + own[2]) * (d.cp - 1) if d.cp > 1 and d.cp_comm == "all_gather" else 0.0  # other ranks' K, V
    saved: tuple[Tensor, ...] = (copies.get("q", q), copies.get("k", k), copies.get("v", v), out, lse)
    fwd_transient = bwd_transient = 0.0
    if d.cp > 1 and d.cp_a2a > 1:
        saved = (*((f"{name}.{p}_heads", b) for p, b in zip("qkv", own)), out, lse)
        fwd_transient = sum(own)  # the layout copies in flight around the all-to-alls
        bwd_transient = sum(own) + out_bytes
    if d.cp > 1 and d.cp_p2p > 1:
        kv = own[1] + own[2]
        # the ring's send and receive KV buffers and every step's partial output until the
        # merge; in backward two KV buffers, the second dKV buffer, and a step's dq and dKV
        # (a2a+p2p: before and after the ring the all-to-alls' copies, whichever is more)
        fwd_transient = max(fwd_transient, 2 * kv + d.cp_p2p * out_bytes)
        bwd_transient = max(bwd_transient, 2 * kv + kv + (own[0] + kv))
    return Op(
        name=name,
        module="core_attn",
        layer=layer,
        fwd=tuple(fwd),
        bwd_input=tuple(bwd),
        saved=saved,
        input=(q, k, v),
        fwd_transient=fwd_transient + gathered_kv,
        bwd_transient=bwd_transient + grads + gathered_kv,
        params=sink_params,
        also_outputs=tuple(copies.values()),
    )


def softmax_kernel_available(d: Dims, fusion: bool, sinks: bool = False) -> bool:
    """Whether Megatron's fused scale-mask-softmax kernel runs (megatron-core
    ``fusions/fused_softmax.FusedScaleMaskSoftmax``: ``is_kernel_available`` — fusion asked
    for, fp16 / bf16 scores, 16 < keys <= 4096, queries and keys and batch x heads multiples of
    4 — and no softmax offset, which only the torch path applies)."""
    s, bh = d.s, d.b * d.heads
    return fusion and not sinks and d.act_bytes == 2 and 16 < s <= 4096 and s % 4 == 0 and bh % 4 == 0


def math_attention(
    name: str, layer: int, d: Dims, q: Tensor, k: Tensor, v: Tensor, *, qk_dim: int, v_dim: int, dropout: bool,
    fused_softmax: bool = True, sinks: bool = False, window: bool = False,
) -> Op:
    """Unfused attention (Megatron-Core's DotProductAttention): QK^T, scale-mask-softmax,
    dropout, PV. The fused masked-softmax kernel keeps its bf16 output; the torch path
    (``--no-masked-softmax-fusion``, or what ``softmax_kernel_available`` refuses) upcasts the
    scores, keeps the fp32 softmax for its backward and the bf16 probabilities for PV
    (attention_softmax_in_fp32, Megatron-Core's default). ``sinks`` (a learnable softmax
    offset per head, ``softmax_type`` learnable; the torch path only): ``SoftmaxOne`` appends
    the head's logit as one more key (a copy of the scores) and keeps that softmax, one column
    wider; the offsets are parameters (one per head). ``window`` (sliding-window attention): the
    torch path builds the [s, s] window mask in each layer (``get_sliding_window_causal_mask``),
    which the masked fill keeps (the fused kernel applies no window); the products stay dense."""
    b, a, s = d.b, d.heads, d.s
    elems = float(b * a * s * s)
    scores = elems * d.act_bytes
    t = d.tokens
    # per head-batch GEMMs written as batched Gemm kernels (b = batch * heads)
    bh = b * a
    # attention dropout over the s x s probabilities (torch's fused native dropout): forward
    # reads the probabilities and writes the dropped ones and a 1-byte mask; backward reads
    # the gradient and the mask and writes the gradient. A recompute runs the forward again.
    drop_fwd = [MemBound(f"{op_label(name)}.dropout", 2 * scores + elems)] if dropout else []
    drop_bwd = [MemBound(f"{op_label(name)}.dropout_bwd", 2 * scores + elems)] if dropout else []
    rows = float(b * a * s)  # the sink column
    sink_cat = [MemBound(f"{op_label(name)}.sink_cat", 2 * elems * FP32 + rows * FP32)] if sinks else []
    fwd = (
        Gemm(s, qk_dim, s, "TN", b=bh),
        *sink_cat,
        MemBound(f"{op_label(name)}.softmax", 2 * scores if fused_softmax else 2 * scores + 3 * elems * FP32),
        *drop_fwd,
        Gemm(s, s, v_dim, "TN", b=bh),
    )
    bwd = (
        Gemm(s, v_dim, s, "NN", b=bh),
        Gemm(s, s, v_dim, "NT", b=bh),
        *drop_bwd,
        MemBound(f"{op_label(name)}.softmax_bwd", 3 * scores if fused_softmax else 3 * elems * FP32 + 2 * scores),
        Gemm(s, s, qk_dim, "NN", b=bh),
        Gemm(s, s, qk_dim, "NT", b=bh),
    )
    # the local spec expands K and V to all query heads (GQA) before saving them
    k_full, v_full = k, v
    if d.kv_heads != d.heads:
        k_full = (f"{name}.k_expanded", float(t * a * qk_dim * d.act_bytes))
        v_full = (f"{name}.v_expanded", float(t * a * v_dim * d.act_bytes))
    saved: list[Tensor] = [q, k_full, v_full]
    if fused_softmax:  # the kernel's bf16 output, kept for its own backward (and PV's)
        saved.append((f"{name}.probs", scores))
    else:  # the fp32 softmax for its backward; its bf16 cast is kept by PV unless dropped out
        saved.append((f"{name}.softmax_fp32", (elems + (rows if sinks else 0.0)) * FP32))
        if not dropout:
            saved.append((f"{name}.probs", scores))
        if window:
            saved.append((f"{name}.window_mask", float(s * s)))
    if dropout:  # the mask (1 B) and the dropped probs, kept by PV
        saved += [(f"{name}.dropout_mask", scores / d.act_bytes), (f"{name}.probs_dropped", scores)]
    return Op(
        name=name,
        module="core_attn",
        layer=layer,
        fwd=fwd,
        bwd_input=bwd,
        saved=tuple(saved),
        input=(q, k, v),
        fwd_transient=scores if fused_softmax else elems * FP32,
        bwd_transient=2 * scores if fused_softmax else 2 * elems * FP32,
        params=a if sinks else 0,  # the heads' softmax offsets (this rank's heads)
    )
