"""Do GEMMs timed back to back read a warm L2 that a training step does not give them?
(docs/calibration.md, "GEMMs after other kernels").

``simumax calibrate`` times each GEMM by repeating it on the same operands, so whatever of
them fits in L2 (50 MB on an H100) is warm from the call before; in a step the kernel before
a GEMM is another one (a norm, a cast, attention) that leaves other data there. This times
Llama-shaped bf16 GEMMs (forward, data- and weight-gradient layouts of 7B/8B/70B-TP8 linears
at 4096 and 8192 tokens) both ways, each call between CUDA events: "warm" back to back,
"cold" after a 256 MiB copy that evicts L2 (the copy outside the events). Each from idle,
~20 ms of timed GEMMs (full clock). Prints and writes ``$OUT/l2_cold_gemm.json``.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

# (m, k, n): forward [tokens, in] @ [in, out]; dgrad [tokens, out] @ [out, in]; wgrad [out, tokens] @ [tokens, in]
LINEARS = [(4096, 4096, 12288), (4096, 4096, 4096), (4096, 4096, 28672), (4096, 14336, 4096),
           (4096, 8192, 1280), (4096, 1024, 8192), (4096, 8192, 7168), (4096, 3584, 8192)]
TOKENS = (4096, 8192)


def shapes() -> list[tuple[str, int, int, int]]:
    out = []
    for t in TOKENS:
        for _, k, n in LINEARS:
            out += [("fwd", t, k, n), ("dgrad", t, n, k), ("wgrad", n, t, k)]
    return out


def timed(fn, count: int, flush=None) -> float:
    times = []
    for _ in range(count):
        if flush is not None:
            flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        times.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e-3 for a, b in times)


def main() -> None:
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    big_src = torch.empty(1 << 27, device=dev, dtype=torch.float16)  # 256 MiB
    big_dst = torch.empty_like(big_src)
    rows = []
    for kind, m, k, n in shapes():
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        fn = lambda: torch.mm(a, b)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        one = timed(fn, 3)
        count = max(5, min(200, int(0.02 / one)))
        time.sleep(0.3)
        warm = timed(fn, count)
        time.sleep(0.3)
        cold = timed(fn, count, flush=lambda: big_dst.copy_(big_src))
        operands_mb = (m * k + k * n) * 2 / 1e6
        rows.append({"kind": kind, "m": m, "k": k, "n": n, "warm_s": warm, "cold_s": cold, "operands_mb": operands_mb})
        print(f"{kind:5s} {m:5d}x{k:5d}x{n:5d} operands {operands_mb:6.1f} MB: warm {warm*1e6:8.1f} us "
              f"cold {cold*1e6:8.1f} us ({cold/warm-1:+.1%})")
    ratios = [r["cold_s"] / r["warm_s"] - 1 for r in rows]
    print(f"cold over warm: median {statistics.median(ratios):+.2%}, max {max(ratios):+.2%}, min {min(ratios):+.2%}")
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    with open(os.path.join(out_dir, "l2_cold_gemm.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
