"""The accelerator's clock response to its power limit, as ``accelerator.power_curve``.

A calibration timed at full clock (``calibrate --cooldown``) holds tensor-core rates a
power-capped GPU only keeps while memory-bound work shares the device with them
(cost/power.py). This measures how much: one bf16 GEMM alternated with r memory-bound
copies (r = 0: GEMMs back to back), each mix run long enough for the limiter to settle,
the GEMM timed with CUDA events. A point is (the GEMM's share of device time, its rate
over its full-clock rate).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from simumax.calibrate.timing import FULL_CLOCK_LOAD_SECONDS, median_seconds

POWER_CURVE_RATIOS = (8, 4, 2, 1, 0)  # copies per GEMM: shares ~0.3 to 1 on an H100


def duty_cycle_rows(device: torch.device, seconds: float = 6.0, size: int = 8192, copy_bytes: int = 2**29,
                    ratios: tuple[int, ...] = POWER_CURVE_RATIOS,
                    reading: Callable[[], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One row per mix: the GEMM's share of device time and its rate over its full-clock
    rate (the second half of the mix's samples: the first lets the limiter settle), the
    copies' GB/s, and what ``reading`` (e.g. NVML clocks and power) returned at its end."""
    x = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    w = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    src = torch.randn(copy_bytes // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    torch.cuda.synchronize(device)
    time.sleep(2.0)
    full_clock = median_seconds(lambda: x @ w.t(), device, warmup=1, repeats=5, max_load=FULL_CLOCK_LOAD_SECONDS)
    rows = []
    for r in ratios:
        gemm_t: list[float] = []
        copy_t: list[float] = []
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            events = []
            for _ in range(20):
                e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                e0.record()
                x @ w.t()
                e1.record()
                for _ in range(r):
                    dst.copy_(src)
                e2.record()
                events.append((e0, e1, e2))
            events[-1][2].synchronize()
            gemm_t += [a.elapsed_time(b) * 1e-3 for a, b, _ in events]
            copy_t += [b.elapsed_time(c) * 1e-3 for _, b, c in events]
        g = statistics.median(gemm_t[len(gemm_t) // 2:])
        c = statistics.median(copy_t[len(copy_t) // 2:])
        rows.append({"copies_per_gemm": r, "gemm_share": g / (g + c), "rate": min(1.0, full_clock / g),
                     "gemm_tflops": 2.0 * size**3 / g / 1e12, "full_clock_tflops": 2.0 * size**3 / full_clock / 1e12,
                     "copy_gbps": 2 * copy_bytes * r / c / 1e9 if r else None, **(reading() if reading else {})})
        torch.cuda.synchronize(device)
        time.sleep(1.0)
    return rows


def measure_power_curve(device: torch.device, seconds: float = 6.0) -> list[list[float]]:
    """``accelerator.power_curve``: [[share, rate], ...] by increasing share."""
    rows = duty_cycle_rows(device, seconds)
    return sorted([round(r["gemm_share"], 3), round(r["rate"], 3)] for r in rows)
