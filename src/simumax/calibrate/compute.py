"""Time the job's compute and memory-bound kernels on the local accelerator.

Each kernel of the op IR gets a torch stand-in of the same shape and dtype (bf16 inputs
drawn from a normal distribution, so the tensor cores see realistic bit patterns):

- Gemm: ``a @ b`` with the operand storage of its layout (TN: weight stored [n, k]; NT:
  the gradient stored [k, m]); fp32-accumulating weight-gradient GEMMs write fp32. fp8
  GEMMs (``fp8_matmul``): ``torch._scaled_mm`` with TransformerEngine's formats and
  accumulation per GEMM (``fp8_gemm_fn``); grouped fp8 GEMMs are not measured.
- GroupGemm: ``torch.bmm`` over ``ng`` experts of equal rows (balanced routing: a grouped
  GEMM of equal groups is a batched GEMM).
- Attention: ``scaled_dot_product_attention`` (torch picks its backend: cuDNN's flash
  kernels on Hopper, TransformerEngine's choice there too), the backward timed alone from a
  saved forward graph; on a GPU both replayed from a CUDA graph (``timing.graphed``): the
  kernels' device time, not the harness's host time.
- MemBound families: a kernel with the IR's own byte accounting: ``default`` an add
  (reads 2, writes 1 element), ``permute_*`` a row ``index_select``, ``ce`` Megatron's
  unfused cross-entropy chain on bf16 logits (``megatron_loss``; sized in the table
  convention, ``graph.blocks.LOSS_FWD_PASSES``), ``ce_fusion`` torch's cross-entropy on
  bf16 logits.

Efficiency = table FLOPs / (seconds * peak), the convention of the SimuMax tables (causal
attention counted without halving, so its entries may exceed 1).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from simumax.calibrate.fit import AlphaBeta, fit_alpha_beta
from simumax.calibrate.megatron_loss import megatron_cross_entropy
from simumax.calibrate.shapes import JobKernels
from simumax.calibrate.timing import FULL_CLOCK_LOAD_SECONDS, accumulate_fp32_, graphed, median_seconds
from simumax.config.hardware import datasheet
from simumax.graph.blocks import LOSS_FWD_PASSES, loss_fwd_bytes_per_logit
from simumax.graph.kernels import MODEL_SDP_BWD_RATIO, TF32_PREFIX, Attention, Gemm, GroupGemm

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class KernelTiming:
    family: str
    key: str
    flops: float
    seconds: float
    efficiency: float


def _randn(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, device=device)


def gemm_fn(k: Gemm, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    if k.layout == "TN":
        a, b = _randn((k.b, k.m, k.k), dtype, device), _randn((k.b, k.n, k.k), dtype, device).transpose(1, 2)
    elif k.layout == "NT":
        a, b = _randn((k.b, k.k, k.m), dtype, device).transpose(1, 2), _randn((k.b, k.k, k.n), dtype, device)
    else:
        a, b = _randn((k.b, k.m, k.k), dtype, device), _randn((k.b, k.k, k.n), dtype, device)
    if k.b == 1:
        a, b = a[0], b[0]
    if k.accumulate and k.out_dtype == "fp32" and k.b == 1:
        # TE's weight-gradient GEMM accumulates into the fp32 main grad (beta = 1), in place:
        # an out-of-place addmm would first copy c, an extra pass training does not make
        c = torch.zeros((k.m, k.n), dtype=torch.float32, device=device)
        if dtype == torch.float32:  # Muon's TF32 addmm: scaled input and product (cuBLAS's path for them)
            return lambda: torch.addmm(c, a, b, beta=0.5, alpha=0.5, out=c)
        return lambda: accumulate_fp32_(c, a, b)
    return lambda: torch.matmul(a, b)


def tf32_gemm_fn(k: Gemm, device: torch.device):
    """A GEMM on fp32 operands with TF32 allowed while it runs, as TransformerEngine's GEMM
    runs fp32 inputs (the fp32 router's gradient GEMMs, ``tf32_matmul``)."""
    inner = gemm_fn(k, device, torch.float32)

    def run():
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return inner()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    return run


# TransformerEngine's fp8 linears (transformer_engine/pytorch/module/base.py): the forward GEMM
# with cuBLASLt's fast accumulation, the data- and weight-gradient GEMMs with split
# accumulation (_2X_ACC_FPROP False, _2X_ACC_DGRAD / _2X_ACC_WGRAD True), which on Hopper
# promotes partial sums to FP32 on the CUDA cores; every fp8 GEMM runs in cuBLAS's TN form
# (TE keeps transposed fp8 copies). Formats as Megatron's --fp8-format hybrid: E4M3
# activations and weights, E5M2 gradients.
TE_FAST_ACCUMULATION = {"TN": True, "NN": False, "NT": False}
_FP8_OPERANDS = {"TN": ("e4m3", "e4m3"), "NN": ("e5m2", "e4m3"), "NT": ("e5m2", "e4m3")}  # (A, B) by layout


def fp8_gemm_fn(k: Gemm, device: torch.device):
    """An fp8 GEMM of ``k``'s shape as TE runs it (``torch._scaled_mm``, per-tensor scales,
    bf16 out; fp32 out for the weight gradient, which TE also accumulates into the main
    grad: that read of C is not timed), or None where the device or torch has none."""
    if k.b != 1 or not hasattr(torch, "_scaled_mm"):
        return None
    kinds = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    a_kind, b_kind = _FP8_OPERANDS[k.layout]
    a = _randn((k.m, k.k), torch.float32, device).to(kinds[a_kind])  # row-major
    b = _randn((k.n, k.k), torch.float32, device).to(kinds[b_kind]).t()  # column-major
    one = torch.ones((), dtype=torch.float32, device=device)
    out = torch.float32 if k.out_dtype == "fp32" else torch.bfloat16
    fast = TE_FAST_ACCUMULATION[k.layout]

    def fn():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out, use_fast_accum=fast)

    try:
        fn()  # cuBLAS runs fp8 GEMMs from sm_89 on, and wants dimensions in multiples of 16
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        log.info("no fp8 GEMM of %s on %s: %s", k.key, device, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    return fn


def group_gemm_fn(k: GroupGemm, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    if k.stage == "fwd":
        a, b = _randn((k.ng, k.M, k.K), dtype, device), _randn((k.ng, k.K, k.N), dtype, device)
    elif k.stage == "bwd_grad_act":
        a, b = _randn((k.ng, k.M, k.N), dtype, device), _randn((k.ng, k.N, k.K), dtype, device)
    else:
        a, b = _randn((k.ng, k.M, k.K), dtype, device).transpose(1, 2), _randn((k.ng, k.M, k.N), dtype, device)
    return lambda: torch.bmm(a, b)


def attention_fn(k: Attention, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """A call running the kernel ``k`` once. On a GPU it is replayed from a CUDA graph
    (``timing.graphed``), so it costs the kernels' device time: one eager
    ``torch.autograd.grad`` costs ~0.14 ms of host time and one SDPA call ~0.04 ms, which
    would set the time of every small kernel, where a training step launches them while
    earlier work runs (measured on an H100: docs/calibration.md, "Attention shapes")."""
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    with torch.cuda.stream(stream):  # None (off a GPU): no stream change
        # the forward on the stream the call is captured on: autograd waits on its stream
        kv = k.kv_seq_len or k.seq_len
        q = _randn((k.batch, k.head_num, k.seq_len, k.qk_head_dim), dtype, device)
        key = _randn((k.batch, k.kv_head_num, kv, k.qk_head_dim), dtype, device)
        v = _randn((k.batch, k.kv_head_num, kv, k.v_head_dim), dtype, device)
        gqa = k.kv_head_num != k.head_num
        causal = k.causal and kv == k.seq_len

        def fwd():
            return F.scaled_dot_product_attention(q, key, v, is_causal=causal, enable_gqa=gqa)

        if k.phase == "fwd":
            fn = fwd
        else:
            for t in (q, key, v):
                t.requires_grad_(True)
            out = fwd()
            grad = torch.randn_like(out)
            fn = lambda: torch.autograd.grad(out, (q, key, v), grad, retain_graph=True)  # noqa: E731
    if stream is not None:
        torch.cuda.current_stream(device).wait_stream(stream)
    return graphed(fn, device, stream)


PERMUTE_HIDDEN = 4096  # bf16 rows of the permute stand-in
CE_VOCAB = 32768  # logits width of the cross-entropy stand-in
CE_BYTES_PER_LOGIT = {f: loss_fwd_bytes_per_logit(f, 2) for f in LOSS_FWD_PASSES}  # the IR's loss.fwd, bf16 logits


def _membound_size(family: str, nbytes: float) -> tuple[int, float]:
    """(rows, or elements, of the stand-in for ``nbytes``; the bytes it really moves):
    sizes round down to whole rows / elements."""
    if family.startswith("permute"):
        row = 2 * PERMUTE_HIDDEN * 2  # read + write one bf16 row
        rows = max(1, int(nbytes // row))
        return rows, rows * float(row)
    if family in CE_BYTES_PER_LOGIT:
        per_elem = CE_BYTES_PER_LOGIT[family]
        rows = max(1, int(nbytes / per_elem // CE_VOCAB))
        return rows, rows * CE_VOCAB * per_elem
    n = max(1, int(nbytes // 6))  # bf16 add: read 2 elements, write 1
    return n, n * 6.0


def membound_fn(family: str, nbytes: float, device: torch.device):
    """(a kernel moving ``nbytes`` by the IR's accounting for ``family``, the bytes it
    really moves)."""
    size, actual = _membound_size(family, nbytes)
    if family.startswith("permute"):
        x = _randn((size, PERMUTE_HIDDEN), torch.bfloat16, device)
        idx = torch.randperm(size, device=device)
        return (lambda: x.index_select(0, idx)), actual
    if family in CE_BYTES_PER_LOGIT:
        logits = _randn((size, CE_VOCAB), torch.bfloat16, device)
        target = torch.randint(0, CE_VOCAB, (size,), device=device)
        if family == "ce":
            return (lambda: megatron_cross_entropy(logits, target)), actual
        return (lambda: F.cross_entropy(logits, target)), actual
    a, b = _randn((size,), torch.bfloat16, device), _randn((size,), torch.bfloat16, device)
    c = torch.empty_like(a)
    return (lambda: torch.add(a, b, out=c)), actual


@dataclass
class ComputeCalibration:
    device_name: str
    peak_tflops: float
    hbm_gbps: float
    peak_source: str  # datasheet | option | base | measured
    timings: list[KernelTiming]
    bandwidth: dict[str, AlphaBeta]  # memory-bound family -> fit
    bandwidth_points: dict[str, list[tuple[float, float]]]  # family -> (bytes, seconds)


def measure_peak_tflops(device: torch.device, size: int) -> float:
    """Best achieved bf16 GEMM rate on a square product (peak of last resort)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = _randn((size, size), dtype, device), _randn((size, size), dtype, device)
    t = median_seconds(lambda: a @ b, device, warmup=2, repeats=5)
    return 2.0 * size**3 / t / 1e12


def measure_hbm_gbps(device: torch.device, nbytes: int) -> float:
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    y = torch.empty_like(x)
    t = median_seconds(lambda: y.copy_(x), device, warmup=2, repeats=5)
    return 2.0 * x.numel() * 2 / t / 1e9


def calibrate_compute(
    kernels: JobKernels,
    device: torch.device,
    device_name: str,
    peak_tflops: float | None = None,
    hbm_gbps: float | None = None,
    peak_source: str = "option",
    warmup: int = 3,
    repeats: int = 10,
    progress=None,
    cooldown: float = 0.0,
) -> ComputeCalibration:
    """Time every kernel of ``kernels``; efficiencies against ``peak_tflops`` (datasheet
    by device name when None; measured when unknown: then efficiencies are relative to
    the best GEMM rate seen, which the result records)."""
    if peak_tflops is None or hbm_gbps is None:
        sheet = datasheet(device_name) if device.type == "cuda" else None
        if sheet:
            peak_tflops = peak_tflops or sheet.bf16_tflops
            hbm_gbps = hbm_gbps or sheet.hbm_gbps
            peak_source = "datasheet"
        else:
            big = 8192 if device.type == "cuda" else 256
            peak_tflops = peak_tflops or measure_peak_tflops(device, big)
            hbm_gbps = hbm_gbps or measure_hbm_gbps(device, 2**30 if device.type == "cuda" else 2**24)
            peak_source = "measured"
    peak = peak_tflops * 1e12
    timings: list[KernelTiming] = []
    todo: list[tuple[str, object]] = [(f, k) for f, ks in kernels.gemms.items() for k in ks]
    todo += [(f, k) for f, ks in kernels.group_gemms.items() for k in ks]
    todo += [(k.family, k) for k in kernels.attentions]
    total = kernels.count
    done = 0
    for family, k in todo:
        if family.startswith("fp8_"):
            fn = fp8_gemm_fn(k, device) if isinstance(k, Gemm) else None
            if fn is None:  # grouped fp8 GEMMs are TransformerEngine's own kernels
                log.info("skipping %s (no fp8 kernel for it here): %s", family, k.key)
                done += 1
                continue
        elif isinstance(k, Gemm) and family.startswith(TF32_PREFIX):
            fn = tf32_gemm_fn(k, device)
        elif isinstance(k, Gemm):
            fn = gemm_fn(k, device)
        elif isinstance(k, GroupGemm):
            fn = group_gemm_fn(k, device)
        else:
            fn = attention_fn(k, device)
        if cooldown > 0:  # each kernel at the clock of a GPU under its power limit
            seconds = median_seconds(fn, device, 1, repeats, cooldown=cooldown, max_load=FULL_CLOCK_LOAD_SECONDS)
        else:
            seconds = median_seconds(fn, device, warmup, repeats)
        flops = k.table_flops(MODEL_SDP_BWD_RATIO) if isinstance(k, Attention) else k.flops
        timings.append(KernelTiming(family, k.key, flops, seconds, flops / (seconds * peak)))
        del fn
        done += 1
        if progress:
            progress(done, total)
    bandwidth: dict[str, AlphaBeta] = {}
    points: dict[str, list[tuple[float, float]]] = {}
    for family, sizes in kernels.membound.items():
        pts = []
        for nbytes in sorted(sizes):
            fn, actual = membound_fn(family, nbytes, device)
            pts.append((actual, median_seconds(fn, device, warmup, repeats)))
            del fn
            done += 1
            if progress:
                progress(done, total)
        points[family] = pts
        bandwidth[family] = fit_alpha_beta([b for b, _ in pts], [t for _, t in pts])
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ComputeCalibration(device_name, peak_tflops, hbm_gbps, peak_source, timings, bandwidth, points)
