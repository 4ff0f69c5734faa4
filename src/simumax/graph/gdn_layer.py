"""Gated DeltaNet linear attention (megatron-core 0.19 ``ssm/gated_delta_net``: GatedDeltaNet,
_GDNBase; Qwen3-Next's linear-attention layers), as a transformer layer's attention
(``experimental_attention_variant`` gated_delta_net) or a hybrid stack's G block.

Per TP rank (Hk key heads of dk, Hv value heads of dv, all split over TP):

* ``in_proj`` (TELayerNormColumnParallelLinear: the input norm fused in) h -> [q, k, v, z, β, α]
  = 2·Hk·dk + 2·Hv·dv + 2·Hv;
* with context parallelism, one all-to-all of that output to head-sharded full sequences
  (its heads permuted first so one all-to-all serves every section: a copy; the attention
  load balancing undone: a copy), and back after the gated norm (``_context_parallel``);
* FLA's ``causal_conv1d`` over q, k, v (kernel ``linear_conv_kernel_dim``, SiLU);
* the jit-fused input preparation: L2 norm of q and k (FLA ``l2norm``, which keeps its output
  and rstd), q and k repeated to the Hv value heads, v, z, β, α made contiguous; g = −exp(A)·
  softplus(α + dt_bias) in fp32 and sigmoid(β);
* FLA's ``chunk_gated_delta_rule`` (chunks of 64; read in fla-core 0.6.0): ``chunk_local_cumsum``,
  the WY representation (``chunk_gated_delta_rule_fwd_intra``: β·k·kᵀ and its inverse in one
  kernel, then ``recompute_w_u_fwd``), the state recurrence over chunks
  (``chunk_gated_delta_rule_fwd_h``) and the output (``chunk_fwd_o``); it saves q, k, v, g, β and
  the inverted A, and backward recomputes w, u and the states, then runs
  ``chunk_bwd_dv_local``, the reverse recurrence ``chunk_gated_delta_rule_bwd_dhu``,
  ``chunk_bwd_dqkwg`` and ``prepare_wy_repr_bwd``;
* the gated output norm (TENorm over each head's dv, times SiLU(z)), ``out_proj``
  (TERowParallelLinear) Hv·dv -> h, and the bias-dropout-add residual.

The scan's tensor-core work is written as the products it is made of: within a chunk as
batched GEMMs over chunks and heads; the recurrences, which run chunk after chunk on one
CTA per head and block of 64 values, as one long-inner-dimension GEMM per head and value block
(the sum over a sequence's chunks of kᵀ·v: its output tiles are all the parallelism such a
kernel has, so the wave model prices its low occupancy). FLA fuses them into Triton kernels,
so the products move no HBM bytes of their own (``Gemm.fused``); each kernel's reads and
writes are a memory pass of their own (``kernel_traffic``). The op says its sizes are
approximate (``Op.approximate``: the 80 % band counts it as unmeasured).
"""

from __future__ import annotations

import math

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, Gemm, GemmLayout, MemBound, op_label
from simumax.graph.ops import Op, Tensor

FP32 = 4
CHUNK = 64  # FLA chunk_gated_delta_rule's chunk size (fla/ops/gated_delta_rule/chunk.py)
BV = 64  # value block of FLA's state recurrences (fla/ops/common/chunk_delta_h.py autotunes 32 or 64)
APPROXIMATE = "gdn_scan"
MODULES = ("gdn_norm", "gdn_in_proj", "gdn_layout", "gdn_conv", "gdn_prep", "gdn_scan", "gdn_out_norm", "gdn_cp_out",
           "gdn_out_proj", "gdn_add")


def gdn_sizes(model: ModelConfig, tp: int) -> dict[str, int]:
    """One TP rank's widths: key and value heads, the q (= k) and v widths, the conv channels
    (q, k, v) and the in_proj output (q, k, v, z, β, α)."""
    hk, hv = model.linear_num_key_heads // tp, model.linear_num_value_heads // tp
    qk, v = hk * model.linear_key_head_dim, hv * model.linear_value_head_dim
    return {"k_heads": hk, "v_heads": hv, "qk": qk, "v": v, "conv": 2 * qk + v, "in_proj": model.gdn_in_proj_width // tp}


def scan_view(model: ModelConfig, d: Dims) -> dict[str, int]:
    """What one rank's scan runs on: its TP widths over its tokens, or with context
    parallelism 1 / cp of them over the whole sequence (the all-to-all to head-sharded full
    sequences); ``tokens`` of the micro-batch, ``chunks`` of 64 (per packed document: FLA's
    cu_seqlens start a chunk at each document), and ``seqs`` as (length, sequences of it) for
    the recurrences, which run each sequence's chunks in order."""
    z = {k: v // d.cp for k, v in gdn_sizes(model, d.tp).items()}
    seq = d.s * d.cp
    docs = d.docs or ((seq, 1),)
    seqs = tuple((length, d.b * count) for length, count in docs)
    return {**z, "tokens": d.b * seq, "chunks": sum(n * math.ceil(length / CHUNK) for length, n in seqs), "seqs": seqs}


def _recurrence(v: dict, model: ModelConfig) -> list[Gemm]:
    """One product of a state recurrence over all chunks (2·dk·dv FLOPs per token and value
    head): per sequence length, per head and block of 64 values (FLA's grid: one CTA per value
    block, head and sequence, BV 64 where the GPU's shared memory allows it), a GEMM of
    [dk, length] by [length, 64]."""
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    bv = BV if dv % BV == 0 else dv
    return [Gemm(dk, length, bv, "NT", b=n * v["v_heads"] * (dv // bv), fused=True) for length, n in v["seqs"]]


def scan_gemms(v: dict, model: ModelConfig) -> tuple[list[Gemm], list[Gemm]]:
    """(forward, backward) products of ``chunk_gated_delta_rule`` over the micro-batch, per
    chunk c (C = 64 tokens) and value head: FLOPs per token and head 6·C·dk + 4·C·dv + 6·dk·dv
    forward, 16·C·dk + 10·C·dv + 16·dk·dv + 4·C² backward. All inside FLA's fused kernels."""
    c, dk, dv = CHUNK, model.linear_key_head_dim, model.linear_value_head_dim
    n = v["chunks"] * v["v_heads"]

    def per_chunk(m: int, k: int, n_: int, layout: GemmLayout) -> Gemm:
        return Gemm(m, k, n_, layout, b=n, fused=True)

    rec = _recurrence(v, model)
    w_u = [per_chunk(c, c, dk, "NN"), per_chunk(c, c, dv, "NN")]  # recompute_w_u_fwd: w = A·(β·eᵍ·k), u = A·(β·v)
    fwd = [
        # chunk_gated_delta_rule_fwd_kkt_solve_kernel: β·k·kᵀ and (I + A)⁻¹ in one kernel, the
        # inverse stored in bf16 (the 16 x 16 block merges' FLOPs, C²/3 per token, left out)
        per_chunk(c, dk, c, "TN"),
        *w_u,
        *rec, *rec,  # chunk_gated_delta_rule_fwd_h: v_new = u − w·S, S ← eᵍ·S + kᵀ·v_new
        per_chunk(c, dk, dv, "NN"),  # chunk_fwd_o: q·S
        per_chunk(c, dk, c, "TN"),  # q·kᵀ (masked, decayed)
        per_chunk(c, c, dv, "NN"),  # its product with v_new
    ]
    bwd = [
        *w_u, *rec, *rec,  # w, u and the states recomputed
        per_chunk(c, dk, c, "TN"), per_chunk(c, c, dv, "NT"),  # chunk_bwd_dv_local: dv = (q·kᵀ)ᵀ·do
        *rec, *rec, *rec,  # chunk_gated_delta_rule_bwd_dhu: dS ← eᵍ·dS + qᵀ·do − wᵀ·dv, dv += k·dS
        # chunk_bwd_dqkwg: dq, dk, dw against the states; dA = do·v_newᵀ and its products with k and q
        *[per_chunk(c, dv, dk, "TN")] * 3, per_chunk(c, dv, c, "TN"), *[per_chunk(c, c, dk, "NN")] * 2,
        # prepare_wy_repr_bwd: dA from dw and du, d(β·k) and d(β·v) through A, dA through the
        # inverse, dk from k·kᵀ
        per_chunk(c, dk, c, "TN"), per_chunk(c, dv, c, "TN"), per_chunk(c, c, dk, "NT"), per_chunk(c, c, dv, "NT"),
        *[per_chunk(c, c, c, "NN")] * 2, *[per_chunk(c, c, dk, "NN")] * 2,
    ]
    return fwd, bwd


def _context_parallel(label: str, d: Dims, z: dict[str, int]) -> tuple[list, list, list, list]:
    """GatedDeltaNet's context parallelism, per rank: the in_proj output's heads permuted so one
    all-to-all moves every section (``_build_head_perm_for_split_sections``: an index_select,
    a copy), the all-to-all to head-sharded full sequences, the attention load balancing undone
    (a copy); after the gated norm, the balancing redone and the all-to-all back. Backward
    mirrors both. Returns (before, after, after's backward, before's backward)."""
    x = float(d.tokens * z["in_proj"] * d.act_bytes)
    out = float(d.tokens * z["v"] * d.act_bytes)
    before = [MemBound(f"{label}.cp_head_perm", 2 * x), Collective("all2all", x, "cp"), MemBound(f"{label}.cp_reorder", 2 * x)]
    after = [MemBound(f"{label}.cp_reorder", 2 * out), Collective("all2all", out, "cp")]
    return before, after, list(reversed(after)), list(reversed(before))


def kernel_traffic(v: dict, model: ModelConfig, ab: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(forward, backward) HBM bytes of each of FLA's kernels (fla-core 0.6.0,
    ``ops/gated_delta_rule/chunk.py``): what each reads and writes, per token and value head
    (the per-chunk states h and their gradients dh: dk x dv per chunk of 64 tokens), times the
    tokens x heads of the micro-batch; the products inside them move nothing of their own."""
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    heads_t = float(v["tokens"] * v["v_heads"])
    q = k = w = dk * ab
    val = dv * ab  # v, u, v_new, o, do, dv: value-wide
    A, g, beta = CHUNK * ab, FP32, ab
    h = v["chunks"] * dk * dv * ab / v["tokens"]  # the states (and dh) per token
    w_u = k + val + beta + g + A + w + val
    fwd_h = k + w + val + g + h + val
    fwd = [("cumsum", 2 * g), ("kkt_solve", k + beta + g + A), ("w_u", w_u), ("fwd_h", fwd_h),
           ("fwd_o", q + k + val + h + g + val)]
    bwd = [("w_u", w_u), ("fwd_h", fwd_h), ("dv_local", q + k + g + val + val),
           ("bwd_dhu", q + k + w + g + 2 * val + h + val), ("dqkwg", q + k + val + w + g + h + 2 * val + h + q + k + w + g),
           ("wy_bwd", k + val + beta + g + A + w + val + k + val + beta + g), ("add_dk_dg", 3 * k + 3 * g), ("cumsum_bwd", 2 * g)]
    return [(n, b * heads_t) for n, b in fwd], [(n, b * heads_t) for n, b in bwd]


def scan_op(P: str, layer: int, d: Dims, model: ModelConfig, v: dict, qkv: Tensor, out: Tensor) -> Op:
    """FLA's ``chunk_gated_delta_rule`` of one layer: each of its kernels as its products'
    tensor-core time (``fused``: their operands stay on chip) and its own HBM traffic
    (``kernel_traffic``), the two added (no overlap assumed inside a kernel). It saves q and k
    (at Hv heads), v, g (fp32), β and the inverted A (bf16). ``v`` (as for the other builders
    here): the rank's ``scan_view``, made once per layer by ``gdn_ops``."""
    ab, t, hv = d.act_bytes, v["tokens"], v["v_heads"]
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    heads_t = float(t * hv)
    states = float(v["chunks"] * hv * dk * dv * ab)
    fwd_gemms, bwd_gemms = scan_gemms(v, model)
    label = op_label(f"{P}.gdn_scan")
    fwd_io, bwd_io = kernel_traffic(v, model, ab)
    name = f"{P}.gdn_scan"
    saved = (
        (f"{name}.q", heads_t * dk * ab), (f"{name}.k", heads_t * dk * ab), (f"{name}.v", heads_t * dv * ab),
        (f"{name}.g", heads_t * FP32), (f"{name}.beta", heads_t * ab), (f"{name}.A", heads_t * CHUNK * ab),
    )
    return Op(
        name=name, module="gdn_scan", layer=layer,
        fwd=(*fwd_gemms, *(MemBound(f"{label}.{n}", b) for n, b in fwd_io)),
        bwd_input=(*bwd_gemms, *(MemBound(f"{label}.{n}", b) for n, b in bwd_io)),
        saved=saved, input=(qkv,), output=out, fwd_transient=2 * states, bwd_transient=3 * states,
        approximate=APPROXIMATE,
    )


def _prepare(P: str, layer: int, d: Dims, model: ModelConfig, v: dict, conv_out: Tensor) -> Op:
    """The jit-fused ``_prepare_input_for_gated_delta_rule`` and ``_compute_g_and_beta``: L2 norm
    of q and k (FLA's l2norm keeps its output and an fp32 rstd per head), q and k repeated to
    the value heads where there are fewer key heads (and made contiguous), v, z, β, α made
    contiguous; g in fp32 and sigmoid(β). Saves what it keeps for backward (the norm's
    output and rstd, α for softplus' gradient, sigmoid(β)) and z for the gated norm."""
    ab, t, hk, hv = d.act_bytes, v["tokens"], v["k_heads"], v["v_heads"]
    dk = model.linear_key_head_dim
    qk = float(t * v["qk"] * ab)
    rep = float(2 * t * hv * dk * ab) if hv > hk else 0.0
    vz = float(2 * t * v["v"] * ab)
    gates = float(t * hv * ab)
    # l2norm reads and writes q, k; the repeat (or the contiguous copy) reads them and writes
    # q, k at Hv heads; v, z, β, α copied; g and sigmoid(β) read α, β and write g (fp32), β
    fwd = 2 * 2 * qk + 2 * qk + (rep or 2 * qk) + 2 * vz + 4 * gates + 2 * gates + t * hv * FP32 + gates
    # the l2norm's gradient (its output, rstd and the gradient read, the input's written), the
    # repeat's (summed back to Hk heads), the sections' gradients into in_proj's, g's and β's
    bwd = 3 * 2 * qk + (rep + 2 * qk if rep else 0.0) + 2 * vz + t * hv * FP32 + 5 * gates
    name = f"{P}.gdn_prep"
    saved = ((f"{name}.l2norm", 2 * qk), (f"{name}.rstd", float(2 * t * hk * FP32)), (f"{name}.alpha", gates),
             (f"{name}.z", vz / 2))
    return Op(
        name=name, module="gdn_prep", layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", fwd, launches=3),),
        bwd_input=(MemBound(f"{op_label(name)}.bwd", bwd, launches=3),),
        saved=saved, input=(conv_out,), bwd_transient=2 * qk + rep,
        params=2 * gdn_sizes(model, d.tp)["v_heads"],  # dt_bias, A_log (per value head, split over TP)
    )


def _conv(P: str, layer: int, d: Dims, model: ModelConfig, v: dict, qkvzba: Tensor) -> Op:
    """FLA's ``causal_conv1d`` over q, k, v with SiLU: reads and writes them, keeps its input
    (a view of the in_proj output, or of its all-to-all's, which the whole buffer stays for);
    backward reads the input and the gradient and writes the input gradient."""
    io = float(v["tokens"] * v["conv"] * d.act_bytes)
    name = f"{P}.gdn_conv"
    out = (f"{name}.out", io)
    return Op(
        name=name, module="gdn_conv", layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", 2 * io),), bwd_input=(MemBound(f"{op_label(name)}.bwd", 3 * io),),
        saved=(qkvzba,), input=(qkvzba,), output=out, bwd_transient=io,
        params=gdn_sizes(model, d.tp)["conv"] * model.linear_conv_kernel_dim,
    )


def _gated_norm(P: str, layer: int, d: Dims, model: ModelConfig, v: dict, o: Tensor, z: Tensor) -> Op:
    """``_apply_gated_norm``: TENorm over each value head's dv (one weight shared by the heads,
    the same on every TP rank), then times SiLU(z) in fp32, cast back; keeps its input, the
    fp32 rstd per token and head, the norm's output and z. Backward reads them and the
    gradient, writes the gradients of both inputs."""
    x = float(v["tokens"] * v["v"] * d.act_bytes)
    name = f"{P}.gdn_out_norm"
    normed = (f"{name}.normed", x)
    dv = model.linear_value_head_dim
    return Op(
        name=name, module="gdn_out_norm", layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", 2 * x + 3 * x, launches=2),),
        bwd_input=(MemBound(f"{op_label(name)}.bwd", 5 * x + 3 * x, launches=2),),
        saved=(o, (f"{name}.rstd", float(v["tokens"] * v["v_heads"] * FP32)), normed, z), input=(o, z),
        bwd_transient=2 * x, params=dv, tp_replicated_params=dv,
    )


def gdn_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_in: Tensor) -> list[Op]:
    """One Gated DeltaNet block: the norm fused into in_proj, the conv, the input preparation,
    the chunked delta rule, the gated norm, out_proj, the residual add (with the all-to-alls of
    context parallelism around the middle)."""
    P = f"L{layer}"
    z = gdn_sizes(model, d.tp)
    v = scan_view(model, d)
    ab, t = d.act_bytes, v["tokens"]
    rms = model.norm_type == "rmsnorm"
    ln_out = (f"{P}.gdn_norm.out", d.act(d.h, local=True))
    in_proj = (f"{P}.in_proj.out", d.act(z["in_proj"]))
    qkvzba = in_proj if d.cp == 1 else (f"{P}.gdn.in_cp", float(t * v["in_proj"] * ab))
    conv_out = (f"{P}.gdn_conv.out", float(t * v["conv"] * ab))
    o = (f"{P}.gdn_scan.out", float(t * v["v"] * ab))
    gated = (f"{P}.gdn_out_norm.out", d.act(z["v"]))
    gate = (f"{P}.gdn_prep.z", float(t * v["v"] * ab))
    ops = [
        blocks.norm(f"{P}.gdn_norm", "gdn_norm", layer, d, x_in, rms=rms, save_rstd=not st.recompute_variance,
                    residual=True).with_(output=ln_out),
        linears.column_linear(f"{P}.in_proj", "gdn_in_proj", layer, d, ln_out, d.h, z["in_proj"]).with_(output=in_proj),
    ]
    label = op_label(f"{P}.gdn")
    if d.cp > 1:
        before, after, after_bwd, before_bwd = _context_parallel(label, d, z)
        ops.append(Op(name=f"{P}.gdn_cp_in", module="gdn_layout", layer=layer, fwd=tuple(before),
                      bwd_input=tuple(before_bwd), input=(in_proj,), output=qkvzba, fwd_transient=2 * in_proj[1]))
    if d.b > 1:  # the s b -> b s transposes: copies only for a batch of more than one
        ops.append(Op(name=f"{P}.gdn_layout", module="gdn_layout", layer=layer,
                      fwd=(MemBound(f"{label}.layout", 2 * qkvzba[1] + 2 * o[1], launches=2),),
                      bwd_input=(MemBound(f"{label}.layout", 2 * qkvzba[1] + 2 * o[1], launches=2),)))
    ops += [
        _conv(P, layer, d, model, v, qkvzba),
        _prepare(P, layer, d, model, v, conv_out),
        scan_op(P, layer, d, model, v, conv_out, o),
        _gated_norm(P, layer, d, model, v, o, gate).with_(output=gated if d.cp == 1 else (f"{P}.gdn_out_norm.hp", o[1])),
    ]
    if d.cp > 1:
        # in _gated_norm_and_a2a with the norm: --recompute-modules gdn_norm_out remakes both
        ops.append(Op(name=f"{P}.gdn_cp_out", module="gdn_cp_out", layer=layer, fwd=tuple(after),
                      bwd_input=tuple(after_bwd), output=gated, fwd_transient=o[1]))
    ops += [
        linears.row_linear(f"{P}.out_proj", "gdn_out_proj", layer, d, gated, z["v"], d.h),
        blocks.dropout_add(f"{P}.gdn_add", "gdn_add", layer, d, dropout=st.enable_dropout),
    ]
    return ops
