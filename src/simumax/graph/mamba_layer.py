"""A Mamba-2 layer of Megatron's hybrid stack (megatron-core 0.19 ``ssm/mamba_layer.py``,
``ssm/mamba_mixer.py``; the training path, ``use_mamba_mem_eff_path``).

Per TP rank (H heads of P, G groups of state size N, d_inner = H·P, all split over TP; the
sequence-sharded input gathered as any column-parallel linear's):

* ``in_proj`` (TELayerNormColumnParallelLinear: the pre-norm fused in) h -> [z, x, B, C, dt]
  = 2·d_inner + 2·G·N + H;
* mamba_ssm's ``mamba_split_conv1d_scan_combined`` (``ops/triton/ssd_combined.py``,
  MambaSplitConv1dScanCombinedFn): the causal depthwise conv1d over x, B, C (kernel 4, SiLU),
  then the chunked SSD scan (chunks of 128 tokens): ``_chunk_cumsum``, ``_chunk_state``
  (Bᵀ·x per chunk and head), ``_state_passing``, ``_bmm_chunk`` (C·Bᵀ per chunk and group) and
  ``_chunk_scan`` (the intra-chunk (C·Bᵀ ∘ decay)·x and the inter-chunk C·state per head, the
  D skip, the z gate). It saves its input zxBCdt and the ungated scan output; backward
  recomputes the conv, the cumsum, the chunk states and C·Bᵀ, and runs the gradient of each
  product with respect to both its operands;
* with context parallelism, MambaContextParallel's all-to-alls to head-sharded full
  sequences before the scan and back after it (``scan_view``, ``_context_parallel``);
* the grouped RMSNorm (RMSNormGated over d_inner / G, applied to the gated output);
* ``out_proj`` (TERowParallelLinear) d_inner -> h, and the bias-dropout-add residual.

The scan's tensor-core work is written as the batched GEMMs it is made of (at the tables'
efficiency for those shapes); mamba_ssm fuses them into Triton kernels (five forward, fifteen
backward), so they move no HBM bytes of their own (``Gemm.fused``) and each kernel's reads and
writes are a memory pass of their own (``kernel_traffic``). The op says its sizes are
approximate (``Op.approximate``: the 80 % band counts it as unmeasured).
"""

from __future__ import annotations

import math

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, Gemm, MemBound, op_label
from simumax.graph.ops import Op, Tensor

FP32 = 4
CHUNK = 128  # MambaMixer's chunk_size
CONV = 4  # MambaMixer's d_conv
APPROXIMATE = "mamba_ssd"


def mamba_sizes(model: ModelConfig, tp: int) -> dict[str, int]:
    """The mixer's widths on one TP rank: heads, inner width, B / C groups x state, conv
    channels (x, B, C) and the in_proj output (z, x, B, C, dt)."""
    heads, inner, gn = model.mamba_heads // tp, model.mamba_inner // tp, model.mamba_num_groups // tp * model.mamba_state_dim
    return {"heads": heads, "inner": inner, "groups": model.mamba_num_groups // tp, "gn": gn, "conv": inner + 2 * gn,
            "in_proj": 2 * inner + 2 * gn + heads}


def scan_view(model: ModelConfig, d: Dims) -> dict[str, int]:
    """What one rank's scan runs on. Without context parallelism its TP widths over its
    tokens; with it, megatron-core's MambaContextParallel (``ssm/mamba_context_parallel.py``)
    moves the sequence-sharded z, x, B, C, dt to head-sharded full sequences by all-to-all, so
    the scan runs on the whole sequence with 1 / cp of the heads and of the groups (B and C
    repeated cp / G times first where the rank has fewer groups than CP ranks); ``chunks`` of
    the micro-batch, ``q`` tokens each, ``b_tokens`` in all."""
    z = mamba_sizes(model, d.tp)
    cp, n = d.cp, model.mamba_state_dim
    repeat = cp // z["groups"] if z["groups"] < cp else 1
    groups = max(1, z["groups"] // cp)
    heads, inner, seq = z["heads"] // cp, z["inner"] // cp, d.s * cp
    return {"seq": seq, "b_tokens": d.b * seq, "chunks": d.b * math.ceil(seq / CHUNK), "q": min(CHUNK, seq),
            "heads": heads, "inner": inner, "groups": groups, "gn": groups * n, "repeat": repeat,
            "conv": inner + 2 * groups * n, "in_proj": 2 * inner + 2 * groups * n + heads}


def _scan_gemms(v: dict[str, int], model: ModelConfig) -> list[Gemm]:
    """The forward scan's products over all chunks of the micro-batch: C·Bᵀ per chunk and
    group, the chunk states Bᵀ·x, the intra-chunk (C·Bᵀ)·x and the inter-chunk C·state per
    chunk and head."""
    chunks, q = v["chunks"], v["q"]
    n, p = model.mamba_state_dim, model.mamba_head_dim
    heads = chunks * v["heads"]
    return [  # inside mamba_ssm's fused kernels: no HBM bytes of their own (``Gemm.fused``)
        Gemm(q, n, q, "TN", b=chunks * v["groups"], out_dtype="fp32", fused=True),  # _bmm_chunk_fwd
        Gemm(n, q, p, "NN", b=heads, out_dtype="fp32", fused=True),  # _chunk_state_fwd
        Gemm(q, q, p, "NN", b=heads, fused=True),  # _chunk_scan_fwd: intra-chunk
        Gemm(q, n, p, "NN", b=heads, fused=True),  # _chunk_scan_fwd: inter-chunk
    ]


def _grads(g: Gemm) -> list[Gemm]:
    """A product's backward: the gradient with respect to each operand."""
    return [Gemm(g.m, g.n, g.k, "NN", b=g.b, out_dtype="fp32", fused=True),
            Gemm(g.k, g.m, g.n, "NT", b=g.b, out_dtype="fp32", fused=True)]


def kernel_traffic(v: dict[str, int], model: ModelConfig, ab: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(forward, backward) HBM bytes of each of mamba_ssm's scan kernels (2.3.2.post1,
    ``ops/triton/ssd_combined.py``: ``_mamba_chunk_scan_combined_fwd`` / ``_bwd``), what each
    reads and writes per token of the scan view, times its tokens: x, z and the outputs at the
    inner width, B and C at groups x state, dt in and fp32 dt / cumulative decay per head, the
    chunk states at heads x P x N per chunk (fp32 where the kernels keep them so), C·Bᵀ (fp32)
    at groups x chunk length per token."""
    n, p, q = model.mamba_state_dim, model.mamba_head_dim, v["q"]
    t = float(v["b_tokens"])
    x, bc, dt, f = v["inner"] * ab, v["gn"] * ab, v["heads"] * ab, v["heads"] * FP32
    s32, s16 = v["heads"] * p * n * FP32 / q, v["heads"] * p * n * ab / q
    cb = v["groups"] * q * FP32
    cumsum, bmm = dt + 2 * f, 2 * bc + cb
    state, passing = bc + x + 2 * f + s32, s32 + s16
    fwd = [("cumsum", cumsum), ("chunk_state", state), ("state_passing", passing), ("bmm_chunk", bmm),
           ("chunk_scan", cb + x + 2 * f + bc + s16 + x + 2 * x)]
    bwd = [("cumsum", cumsum), ("bmm_chunk", bmm), ("chunk_state", state), ("state_passing", passing),
           ("bwd_dz", 6 * x), ("bwd_dstates", bc + f + x + s32), ("state_passing_bwd", 2 * s32 + 2 * s16 + f),
           ("bwd_dx", 2 * x + 3 * f + bc + cb + s16 + x), ("bwd_db", x + 3 * f + s16 + 2 * bc),
           ("bwd_dc", s16 + 2 * f + x + 2 * bc), ("bwd_dcb", 2 * x + 2 * f + cb), ("bmm_bwd_db", 4 * bc + cb),
           ("bmm_bwd_dc", 4 * bc + cb), ("ddacs", 2 * x + 3 * f + cb), ("cumsum_bwd", 4 * f + dt)]
    return [(k, b * t) for k, b in fwd], [(k, b * t) for k, b in bwd]


def _context_parallel(label: str, d: Dims, z: dict[str, int], v: dict[str, int]) -> tuple[list, list, list, list]:
    """MambaContextParallel's work around the scan, per rank: before it, z, x, B, C and dt each
    through an all-to-all over CP (B and C repeated first where the rank has fewer groups than
    CP ranks), concatenated, and the attention load balancing undone (the 2·cp chunks put back
    in order: a copy); after it, the balancing redone and the output's all-to-all back.
    Backward mirrors both. Returns (before, after, before's backward, after's backward)."""
    ab, t = d.act_bytes, d.tokens
    parts = [t * z["inner"], t * z["inner"], t * z["gn"] * v["repeat"], t * z["gn"] * v["repeat"], t * z["heads"]]
    a2a = [Collective("all2all", float(x * ab), "cp") for x in parts]
    whole = float(sum(parts) * ab)  # the scan's input, as many bytes on either side of the all-to-alls
    out = float(t * z["inner"] * ab)
    repeat = [MemBound(f"{label}.cp_repeat", 2.0 * t * z["gn"] * v["repeat"] * ab)] if v["repeat"] > 1 else []
    before = [*repeat, *a2a, MemBound(f"{label}.cp_concat", 4 * whole, launches=2)]  # cat, then the reorder
    after = [MemBound(f"{label}.cp_reorder", 2 * out), Collective("all2all", out, "cp")]
    return before, after, list(reversed(after)), [MemBound(f"{label}.cp_concat", 4 * whole, launches=2), *a2a, *repeat]


def ssd_op(P: str, layer: int, d: Dims, model: ModelConfig, zxbcdt: Tensor, out: Tensor) -> Op:
    """The fused conv1d + chunked scan + gate of one layer (``mamba_split_conv1d_scan_combined``),
    with MambaContextParallel's all-to-alls around it under context parallelism."""
    z = mamba_sizes(model, d.tp)
    v = scan_view(model, d)
    t, ab = v["b_tokens"], d.act_bytes
    conv_io = 2.0 * t * v["conv"] * ab  # read x, B, C; write them convolved
    fwd_gemms = _scan_gemms(v, model)
    fwd_io, bwd_io = kernel_traffic(v, model, ab)
    label = op_label(f"{P}.ssd")
    before, after, after_bwd, before_bwd = _context_parallel(label, d, z, v) if d.cp > 1 else ([], [], [], [])
    fwd = (*before, MemBound(f"{label}.conv1d", conv_io), *fwd_gemms, *(MemBound(f"{label}.{k}", b) for k, b in fwd_io),
           *after)
    bwd = (
        *after_bwd,
        MemBound(f"{label}.conv1d", conv_io),  # the conv recomputed
        *fwd_gemms[:2],  # the chunk states and C·Bᵀ recomputed
        *(g for f in fwd_gemms for g in _grads(f)),
        *(MemBound(f"{label}.{k}", b) for k, b in bwd_io),  # the scan's kernels, backward
        MemBound(f"{label}.conv1d_bwd", 3.0 * t * v["conv"] * ab, launches=2),  # read xBC and its grad, write dxBC
        *before_bwd,
    )
    # the fused function keeps its input: in_proj's output, or with CP the head-sharded copy
    scan_in = zxbcdt if d.cp == 1 else (f"{P}.ssd.in_cp", float(t * v["in_proj"] * ab))
    saved = (scan_in, (f"{P}.ssd.out_x", float(t * v["inner"] * ab)))
    params = z["conv"] * (CONV + 1) + 3 * z["heads"]  # conv1d weight and bias, dt_bias, A_log, D
    return Op(
        name=f"{P}.ssd", module="mamba_ssd", layer=layer, fwd=fwd, bwd_input=bwd, saved=saved, input=(zxbcdt,),
        output=out, fwd_transient=float(t * v["conv"] * ab), bwd_transient=float(2 * t * v["in_proj"] * ab),
        params=params, approximate=APPROXIMATE,
    )


def mamba_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_in: Tensor) -> list[Op]:
    """One Mamba-2 layer: the norm fused into in_proj, the fused conv + scan + gate, the
    grouped RMSNorm, out_proj, the residual add."""
    P = f"L{layer}"
    z = mamba_sizes(model, d.tp)
    rms = model.norm_type == "rmsnorm"
    ln_out = (f"{P}.mamba_norm.out", d.act(d.h, local=True))
    zxbcdt = (f"{P}.in_proj.out", d.act(z["in_proj"]))
    y = (f"{P}.ssd.out", d.act(z["inner"]))
    normed = (f"{P}.mamba_out_norm.out", d.act(z["inner"]))
    ops = [
        blocks.norm(f"{P}.mamba_norm", "mamba_norm", layer, d, x_in, rms=rms, save_rstd=not st.recompute_variance,
                    residual=True).with_(output=ln_out),
        linears.column_linear(f"{P}.in_proj", "in_proj", layer, d, ln_out, d.h, z["in_proj"]).with_(output=zxbcdt),
    ]
    if d.b > 1:  # "l b d -> b l d" (and back after the scan) copy only a batch of more than one
        ops.append(Op(name=f"{P}.ssd_layout", module="mamba_ssd", layer=layer,
                      fwd=(MemBound(f"{op_label(P)}.ssd_layout", 2 * zxbcdt[1] + 2 * y[1], launches=2),),
                      bwd_input=(MemBound(f"{op_label(P)}.ssd_layout", 2 * zxbcdt[1] + 2 * y[1], launches=2),)))
    ops += [
        ssd_op(P, layer, d, model, zxbcdt, y),
        # RMSNormGated over groups of d_inner / G, on the gated output (its weight split over TP)
        _grouped_norm(P, layer, d, y, z["inner"], z["groups"]).with_(output=normed),
        linears.row_linear(f"{P}.out_proj", "out_proj", layer, d, normed, z["inner"], d.h),
        blocks.dropout_add(f"{P}.mamba_add", "mamba_add", layer, d, dropout=st.enable_dropout),
    ]
    return ops


def _grouped_norm(P: str, layer: int, d: Dims, y: Tensor, inner: int, groups: int) -> Op:
    """The mixer's RMSNormGated (mamba_ssm ``ops/triton/layernorm_gated.py``, group size
    d_inner / G) over the TP rank's d_inner columns of every token — not sequence-sharded: it
    runs between the column- and the row-parallel linear. Reads and writes them, saves its
    input and an fp32 rstd per token and group; backward reads the input and the gradient
    and writes the input gradient. Its weight is split over TP (not replicated)."""
    name = f"{P}.mamba_out_norm"
    label = op_label(name)
    return Op(
        name=name, module="mamba_out_norm", layer=layer,
        fwd=(MemBound(f"{label}.fwd", 2 * y[1]),), bwd_input=(MemBound(f"{label}.bwd", 3 * y[1]),),
        saved=(y, (f"{name}.rstd", float(d.tokens * groups * FP32))), input=(y,), bwd_transient=2 * y[1],
        params=inner,
    )
