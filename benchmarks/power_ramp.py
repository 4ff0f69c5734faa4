"""In what power state does `simumax calibrate` time a GEMM?

Two readings on one GEMM shape (default bf16 8192^3):
1. the ramp: from an idle GPU, GEMMs back to back, each timed with CUDA events: how many
   milliseconds of full tensor-core load before the power limiter lowers the clock;
2. calibrate's pattern: `median_seconds` over a sequence of other large GEMMs (as a
   calibration of a job's shapes runs them), then the shape itself the same way.
Set beside the idle burst and the sustained rate of benchmarks/sustained_gemm.py, this says
whether a calibrated table holds burst or power-limited rates (docs/calibration.md).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    import torch

    from simumax.calibrate.timing import median_seconds

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192,8192,8192")
    ap.add_argument("--ramp-seconds", type=float, default=1.5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    m, k, n = (int(x) for x in a.shape.split(","))
    dev = torch.device("cuda", 0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    flops = 2.0 * m * k * n
    x @ w.t()
    torch.cuda.synchronize()
    time.sleep(5)
    one = (x @ w.t()).shape  # noqa: F841 - a first call outside the ramp
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    evs = []
    t0.record()
    t_end = time.perf_counter() + a.ramp_seconds
    while time.perf_counter() < t_end:
        for _ in range(10):
            x @ w.t()
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            evs.append(e)
        evs[-1].synchronize()
    ends = [t0.elapsed_time(e) for e in evs]  # ms since the ramp began
    per = [ends[0]] + [b - a_ for a_, b in zip(ends, ends[1:])]
    ramp = [{"t_ms": round(ends[i], 2), "tflops": round(flops / (per[i] * 1e-3) / 1e12, 1)}
            for i in (0, 1, 2, 4, 9, 19, 49, 99, 199, 399, len(per) - 1) if i < len(per)]
    print("ramp from idle:", ramp, flush=True)
    # calibrate's pattern: other large GEMMs timed one after another, then this shape
    time.sleep(5)
    others = [(4096, 4096, 14336), (4096, 14336, 4096), (4096, 4096, 6144), (4096, 8192, 28672), (4096, 28672, 8192),
              (4096, 8192, 10240), (4096, 4096, 128256), (8192, 4096, 14336)]

    def rate(mm: int, kk: int, nn: int, idle: float = 0.0) -> float:
        """TFLOP/s of one shape as calibrate times it, after ``idle`` seconds."""
        xa = torch.randn(mm, kk, device=dev, dtype=torch.bfloat16)
        wa = torch.randn(nn, kk, device=dev, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        time.sleep(idle)
        return round(2.0 * mm * kk * nn / median_seconds(lambda: xa @ wa.t(), dev) / 1e12, 1)

    rates = {f"{mm}x{kk}x{nn}": rate(mm, kk, nn) for mm, kk, nn in others}
    t = median_seconds(lambda: x @ w.t(), dev)
    calib = flops / t / 1e12
    time.sleep(5)
    t = median_seconds(lambda: x @ w.t(), dev)
    idle = flops / t / 1e12
    # the same shapes, each from a GPU idle for 2 s
    idle_rates = {f"{mm}x{kk}x{nn}": rate(mm, kk, nn, idle=2.0) for mm, kk, nn in others}
    out = {"device": torch.cuda.get_device_name(dev), "shape": [m, k, n], "ramp": ramp,
           "calibrate_pattern_tflops": calib, "idle_burst_tflops": idle, "others_tflops": rates,
           "others_idle_tflops": idle_rates}
    print(f"calibrate's pattern: {calib:.0f} TFLOP/s after {len(others)} other shapes; from idle: {idle:.0f}", flush=True)
    print("others, calibrate's pattern:", rates)
    print("others, each from idle:     ", idle_rates)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
