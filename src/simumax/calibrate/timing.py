"""Timers for the calibration benchmarks (torch imported by the caller's module)."""

from __future__ import annotations

import logging
import statistics
import time
from typing import Callable

import torch

log = logging.getLogger(__name__)


# Timing a kernel at full clock (docs/calibration.md, "Power-limited clocks"): idle this long
# first (an H100 SXM's limiter lets the clock back to full within it; benchmarks/power_ramp.py
# ran from 2-5 s idle at full clock), then at most this much work, within the ~30 ms an H100
# SXM runs tensor-core kernels at full clock before its power limiter acts
FULL_CLOCK_COOLDOWN_SECONDS = 0.3
FULL_CLOCK_LOAD_SECONDS = 0.02


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 10,
                   min_sample: float = 1e-3, cooldown: float = 0.0, max_load: float | None = None) -> float:
    """Median time of one call, calls issued back to back as a training step issues them.

    Each sample times ``inner`` consecutive calls (enough to last ``min_sample`` seconds)
    and divides: for a large kernel that is its device time; for a tiny one it is the
    rate the host can launch it, which is what bounds it in eager training too. CUDA
    events on a GPU, a synchronised perf_counter on CPU.

    ``cooldown`` seconds of idle first and at most ``max_load`` seconds of timed work
    (fewer samples, at least three) time the kernel at the clock of a GPU under its power
    limit: a power-capped GPU (H100 SXM, 700 W) runs tensor-core kernels at full clock for
    ~30 ms, then lowers it (docs/calibration.md, "Power-limited clocks")."""
    if cooldown > 0:
        synchronize(device)
        time.sleep(cooldown)
    for _ in range(max(warmup, 1)):
        fn()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(1000, int(min_sample / one)))
    if max_load is not None:
        repeats = max(3, min(repeats, int(max_load / (inner * one))))
    samples: list[float] = []
    if device.type == "cuda":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in pairs:
            start.record()
            for _ in range(inner):
                fn()
            end.record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) * 1e-3 / inner for s, e in pairs]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def graphed(fn: Callable[[], object], device: torch.device,
            stream: "torch.cuda.Stream | None" = None) -> Callable[[], object]:
    """``fn`` replayed from a CUDA graph captured on ``stream`` (unchanged off a GPU, or
    where capture fails). A backward must be captured on the stream its forward ran on:
    autograd waits on the forward's stream, which a capture may not touch.

    For calls whose host cost is a harness's, not a training step's: one
    ``torch.autograd.grad`` costs ~0.14 ms of host time (graph traversal, Python) where a
    step's autograd engine launches the same kernels for ~10 us each while earlier work
    runs, so a small attention backward timed eagerly reads the host (measured on an H100:
    a 128-token, 1-head backward 0.139 ms per call against 0.014 ms of device time;
    docs/calibration.md, "Attention shapes"). Replayed, the call costs its kernels."""
    if device.type != "cuda":
        return fn
    side = stream or torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # capture needs the call run once before, off the default stream
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=side):
            fn()
    except RuntimeError as exc:  # a kernel that cannot be captured: time it eagerly (a failed
        # capture can leave torch's CUDA generator unusable; none failed on the H100, 57 kernels)
        log.info("timing eagerly, CUDA graph capture failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
        return fn
    return graph.replay


def pick_device(name: str | None = None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def compute_capability(device: torch.device) -> tuple[int, int]:
    """CUDA compute capability, (0, 0) off a CUDA device."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"


_FUSED_ACCUM: list[bool] = []  # probed on first use: can this torch accumulate a x b into fp32 in place?


def accumulate_fp32_(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """c (fp32) += a @ b in one fp32-accumulating GEMM where torch offers it (addmm with
    out_dtype, in place: TE's weight-gradient accumulation into the main grad, beta = 1),
    else the product in the inputs' dtype added."""
    if not _FUSED_ACCUM:
        try:
            torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
            _FUSED_ACCUM.append(True)
            return
        except (TypeError, RuntimeError, NotImplementedError):
            _FUSED_ACCUM.append(False)
    if _FUSED_ACCUM[0]:
        torch.addmm(c, a, b, out_dtype=torch.float32, out=c)
    else:
        c.add_(torch.matmul(a, b))


def fp32_accumulation_fused() -> bool:
    """Whether accumulate_fp32_ ran as one fused GEMM (False before its first call)."""
    return bool(_FUSED_ACCUM and _FUSED_ACCUM[0])
