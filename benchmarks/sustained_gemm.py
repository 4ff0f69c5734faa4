"""Does a GEMM run as fast under a sustained training-like load as in a calibration burst?

`simumax calibrate` times each kernel for ~10 ms after a few warm-up calls, from a GPU that
was mostly idle; a training step keeps the tensor cores busy for minutes at the board's
power limit, where the SM clock may drop (issue 20, item 5: "sustained clocks under load").
This script times one GEMM shape first as calibrate does (`median_seconds`), then back to back
for `--seconds`, and prints the rate per window with the SM clock, power, temperature and
clock-throttle reasons read through NVML (nvidia-ml-py), so the two rates can be compared on
the same shape and the cause of any drop named.

    python3 benchmarks/sustained_gemm.py --shape 8192,8192,8192 --dtype bf16 --seconds 60 --json out.json

Needs torch with CUDA; NVML readings are skipped when pynvml is absent.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    import torch

    from simumax.calibrate.compute import fp8_gemm_fn
    from simumax.calibrate.nvml import open_device, reading
    from simumax.calibrate.timing import median_seconds
    from simumax.graph.kernels import Gemm

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192,8192,8192", help="m,k,n")
    ap.add_argument("--dtype", choices=["bf16", "fp8", "attn_fwd", "attn_bwd", "add"], default="bf16",
                    help="bf16 / fp8 GEMM of --shape; attn_*: causal flash attention, --shape = batch,seq,heads "
                         "(head dim 128); add: a bf16 add over --shape[0] MiB per operand (rates in TB/s)")
    ap.add_argument("--layout", default="TN", help="fp8 only: TN (fast accumulation) or NN (split, as TE's dgrad)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=2.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    m, k, n = (int(x) for x in a.shape.split(","))
    dev = torch.device("cuda", 0)
    if a.dtype == "bf16":
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)

        def fn():
            return x @ w.t()
        flops = 2.0 * m * k * n
    elif a.dtype == "fp8":
        fn = fp8_gemm_fn(Gemm(m=m, k=k, n=n, layout=a.layout, family="fp8_matmul"), dev)
        if fn is None:
            raise SystemExit("no fp8 GEMM on this device")
        flops = 2.0 * m * k * n
    elif a.dtype.startswith("attn"):
        from simumax.calibrate.compute import attention_fn
        from simumax.graph.kernels import Attention

        phase = a.dtype.split("_")[1]
        fn = attention_fn(Attention(phase=phase, batch=m, seq_len=k, head_num=n, kv_head_num=n, qk_head_dim=128,
                                    v_head_dim=128, causal=True), dev)
        flops = (2.5 if phase == "bwd" else 1.0) * 2 * m * n * k * k * 128  # causal: half of 4·b·h·s²·d
    else:  # memory-bound: the "tflops" columns read TB/s moved
        x = torch.randn(int(m * 2**20 / 2), device=dev, dtype=torch.bfloat16)
        y, z = torch.randn_like(x), torch.empty_like(x)

        def fn():
            return torch.add(x, y, out=z)
        flops = 6.0 * x.numel()  # bytes: read two bf16 operands, write one
    nv, h = open_device()
    burst = median_seconds(fn, dev)  # as calibrate times it
    per_window = max(1, int(a.window / burst))
    windows = []
    t_end = time.perf_counter() + a.seconds
    while time.perf_counter() < t_end:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(per_window):
            fn()
        e.record()
        e.synchronize()
        dt = s.elapsed_time(e) * 1e-3 / per_window
        windows.append({"t": round(a.seconds - (t_end - time.perf_counter()), 2), "tflops": flops / dt / 1e12,
                        **reading(nv, h)})
    after = median_seconds(fn, dev)  # calibrate's timing again, now on a hot GPU
    out = {"device": torch.cuda.get_device_name(dev), "shape": [m, k, n], "dtype": a.dtype, "layout": a.layout,
           "burst_tflops": flops / burst / 1e12, "hot_burst_tflops": flops / after / 1e12, "windows": windows}
    last = windows[len(windows) // 2:]
    out["sustained_tflops"] = sorted(w["tflops"] for w in last)[len(last) // 2]
    print(f"{a.dtype} {m}x{k}x{n} {a.layout}: burst {out['burst_tflops']:.0f}, sustained (median of the 2nd half) "
          f"{out['sustained_tflops']:.0f}, hot burst {out['hot_burst_tflops']:.0f} TFLOP/s "
          f"({out['sustained_tflops'] / out['burst_tflops'] - 1:+.1%})")
    for w in windows[:: max(1, len(windows) // 8)] + windows[-1:]:
        print("  ", {kk: (round(v, 1) if isinstance(v, float) else v) for kk, v in w.items()})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
