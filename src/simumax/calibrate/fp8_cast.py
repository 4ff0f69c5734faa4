"""TransformerEngine's fp8 cast-transpose, as a tiled Triton kernel (torch where there is none).

TE quantizes every fp8 GEMM input and output gradient into both layouts in one kernel
(``transformer_engine/common/transpose/cast_transpose.cu``): a tile of the bf16 tensor is
read once, scaled, written row-wise and, through on-chip memory, transposed (the column-wise
copy Hopper's TN-only fp8 GEMMs need for the weight gradient); with delayed scaling the
tile's amax is reduced in the same pass. TE itself cannot travel to the lent GPUs, so this
kernel has the same structure: one read, two 1-byte writes, the amax fused. It is the cast
``check-step --fp8`` runs on a GPU. It moves its bytes 1.13-1.15x slower than a copy of as
many bytes on an H100 and 1.25x on an H200 (large Llama shapes; docs/calibration.md, "An fp8
step"): the transposed store is what costs. The op IR prices a cast on the device's
memory-bound line (graph/fp8.py), which on the derived H100 preset is already at or below
that rate.
"""

from __future__ import annotations

from typing import Callable

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
TILE = (64, 64, 4)  # rows, columns, warps: the fastest of 64/128 x 64/128 tiles on the H200

_KERNEL: list[Callable | None] = []  # built on first use (triton imported then)


def _build() -> Callable | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(x_ptr, q_ptr, qt_ptr, s_ptr, amax_ptr, M, N, FMAX: tl.constexpr, E5M2: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr):
        # 64-bit offsets: rows x columns passes 2^31 elements at long sequences or vocabularies
        rm = (tl.program_id(0) * BM + tl.arange(0, BM)).to(tl.int64)
        rn = (tl.program_id(1) * BN + tl.arange(0, BN)).to(tl.int64)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
        y = tl.clamp(x * tl.load(s_ptr), -FMAX, FMAX)
        if E5M2:
            y = y.to(tl.float8e5)
        else:
            y = y.to(tl.float8e4nv)
        tl.store(q_ptr + rm[:, None] * N + rn[None, :], y, mask=mask)
        tl.store(qt_ptr + rn[None, :] * M + rm[:, None], y, mask=mask)

    def run(x: torch.Tensor, scale: torch.Tensor, q: torch.Tensor, qt: torch.Tensor, amax: torch.Tensor) -> None:
        m, n = x.shape
        bm, bn, warps = TILE
        kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
            x, q, qt, scale, amax, m, n, FMAX=FP8_MAX[q.dtype], E5M2=q.dtype == torch.float8_e5m2, BM=bm, BN=bn,
            num_warps=warps)

    return run


def triton_kernel() -> Callable | None:
    if not _KERNEL:
        _KERNEL.append(_build())
    return _KERNEL[0]


def amax(x: torch.Tensor) -> torch.Tensor:
    """The tensor's largest magnitude, fp32 (current scaling's pass of its own)."""
    return x.abs().amax().float()


def cast_transpose(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 data, its transposed copy, amax of x) of a contiguous 2-D bf16 tensor scaled by
    ``scale``: one Triton kernel on a GPU, torch elsewhere."""
    run = triton_kernel() if x.is_cuda else None
    if run is None:
        fmax = FP8_MAX[dtype]
        xs = torch.clamp(x.float() * scale, -fmax, fmax)
        return xs.to(dtype), xs.t().contiguous().to(dtype), amax(x)
    q = torch.empty(x.shape, device=x.device, dtype=dtype)
    qt = torch.empty((x.shape[1], x.shape[0]), device=x.device, dtype=dtype)
    largest = torch.zeros((), device=x.device, dtype=torch.float32)  # the kernel's atomic max
    run(x, scale, q, qt, largest)
    return q, qt, largest
