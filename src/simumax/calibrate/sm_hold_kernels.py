"""Triton side kernels for calibrate/sm_hold.py: c CTAs of 1024 threads each (no GEMM CTA
fits beside one on its SM), spinning on registers or streaming a buffer."""

from __future__ import annotations

import triton
import triton.language as tl

THREADS_WARPS = 32  # 1024 threads per CTA


@triton.jit
def spin(out_ptr, iters, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    x = tl.arange(0, BLOCK).to(tl.float32) + pid
    for _ in range(iters):
        x = x * 0.999999 + 0.000001
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), x)


@triton.jit
def copy(src_ptr, dst_ptr, n_per_cta, rounds, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * n_per_cta
    for _ in range(rounds):
        for off in range(0, n_per_cta, BLOCK):
            idx = base + off + tl.arange(0, BLOCK)
            tl.store(dst_ptr + idx, tl.load(src_ptr + idx))
