"""How much a GEMM slows beside a kernel that holds c SMs (docs/calibration.md, "Compute beside
a kernel holding SMs").

Communication kernels that run beside compute (DeepEP / HybridEP's dispatch and combine,
which Megatron gives ``--moe-flex-dispatcher-num-sms`` SMs, 20 by default; NCCL's collectives,
one CTA per channel) keep their SMs for as long as they run. The model charges the compute
beside them the share c / SMs (``cost/moe_fanout.ep_compute_usage``). One GPU cannot run
DeepEP or a collective, so this times what sets that share: a loop of bf16 GEMMs alone, and
beside a persistent kernel of c CTAs, each CTA big enough (1024 threads, so no GEMM CTA fits
beside it on its SM) and either spinning on registers ("spin": the SMs alone) or streaming
a buffer ("copy": the SMs and HBM traffic, at what c SMs can move). The side kernel is
launched first on its own stream and outlasts the loop; u = (beside - alone) / alone is the
extra GEMM time per second of overlap, as ``processor_usage`` is defined
(calibrate/contention.py). Prints and writes ``$OUT/sm_share_contention.json``.
"""

from __future__ import annotations

import json
import os
import time

import torch
import triton
import triton.language as tl

GEMMS = [(8192, 8192, 8192), (4096, 4096, 14336), (4096, 14336, 4096), (16384, 7168, 2048)]
CTAS = [8, 16, 20, 24, 32, 48]


@triton.jit
def _spin(out_ptr, iters, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x = tl.arange(0, BLOCK).to(tl.float32) + pid
    for _ in range(iters):
        x = x * 0.999999 + 0.000001
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), x)


@triton.jit
def _copy(src_ptr, dst_ptr, n_per_cta, rounds, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per_cta
    for _ in range(rounds):
        for off in range(0, n_per_cta, BLOCK):
            idx = base + off + tl.arange(0, BLOCK)
            tl.store(dst_ptr + idx, tl.load(src_ptr + idx))


def _gemm_loop(a: torch.Tensor, b: torch.Tensor, count: int) -> None:
    for _ in range(count):
        torch.mm(a, b)


def _timed(fn, stream: torch.cuda.Stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        fn()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def main() -> None:
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    main_s, side_s = torch.cuda.Stream(), torch.cuda.Stream()
    sink = torch.empty(max(CTAS) * 1024, device=dev)
    buf_elems = 1 << 28  # 1 GiB of fp32 per buffer: far beyond L2
    src, dst = torch.empty(buf_elems, device=dev), torch.empty(buf_elems, device=dev)
    # side-kernel durations alone, to size each run to outlast the GEMM loop
    spin_iters = 200_000
    t_spin = _timed(lambda: _spin[(1,)](sink, spin_iters, BLOCK=1024, num_warps=32), side_s)
    t_spin = _timed(lambda: _spin[(1,)](sink, spin_iters, BLOCK=1024, num_warps=32), side_s)
    per = {c: buf_elems // c // 1024 * 1024 for c in CTAS}
    t_copy = {}
    for c in CTAS:
        _timed(lambda: _copy[(c,)](src, dst, per[c], 1, BLOCK=1024, num_warps=32), side_s)
        t_copy[c] = _timed(lambda: _copy[(c,)](src, dst, per[c], 1, BLOCK=1024, num_warps=32), side_s)
        print(f"copy alone c={c}: {2 * per[c] * c * 4 / t_copy[c] / 1e9:.0f} GB/s")
    rows = []
    for m, k, n in GEMMS:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        one = _timed(lambda: _gemm_loop(a, b, 3), main_s) / 3
        count = max(3, int(0.02 / one))  # a ~20 ms loop: full clock (idle before each run)
        time.sleep(0.3)
        alone = _timed(lambda: _gemm_loop(a, b, count), main_s) / count
        target = 3 * count * alone  # the side kernel runs ~3x the loop alone
        row = {"gemm": [m, k, n], "count": count, "alone_s": alone, "beside": []}
        for c in CTAS:
            for kind in ("spin", "copy"):
                time.sleep(0.3)
                # the side kernel first on its own stream (both streams non-default), then the loop
                with torch.cuda.stream(side_s):
                    if kind == "spin":
                        _spin[(c,)](sink, max(1, int(spin_iters * target / t_spin)), BLOCK=1024, num_warps=32)
                    else:
                        _copy[(c,)](src, dst, per[c], max(1, int(target / t_copy[c]) + 1), BLOCK=1024, num_warps=32)
                beside = _timed(lambda: _gemm_loop(a, b, count), main_s) / count
                side_done = side_s.query()
                torch.cuda.synchronize()
                row["beside"].append({"ctas": c, "kind": kind, "beside_s": beside, "side_outlasted": not side_done,
                                      "u": beside / alone - 1, "share": c / sms, "sm_model": c / (sms - c)})
                print(f"{m}x{k}x{n} {kind:4s} c={c:3d}: alone {alone*1e3:.3f} ms beside {beside*1e3:.3f} ms "
                      f"u={beside/alone-1:+.3f} (c/SMs {c/sms:.3f}, c/(SMs-c) {c/(sms-c):.3f}) outlasted={not side_done}")
        rows.append(row)
    meta = {"device": torch.cuda.get_device_name(), "sms": sms, "torch": torch.__version__, "cuda": torch.version.cuda}
    with open(os.path.join(out_dir, "sm_share_contention.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
