"""Compute beside a kernel that holds SMs, as ``accelerator.sm_contention``.

Communication kernels that overlap compute keep their SMs while they run (DeepEP /
HybridEP's dispatch and combine: Megatron's ``--moe-flex-dispatcher-num-sms``; NCCL: one CTA
per channel). A GEMM launched beside them was planned for every SM, so it loses more than
the share they hold: the tiles that find no free SM run as a tail. This times a loop of
bf16 GEMMs (~20 ms, from idle, so at full clock) alone and beside a persistent kernel of c
CTAs (calibrate/sm_hold_kernels.py) launched first on its own stream and sized to outlast
the loop, spinning on registers or streaming a buffer; a point is (c, the median over GEMMs
and side kernels of the extra GEMM time per second of overlap). docs/calibration.md,
"Compute beside a kernel holding SMs".
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Iterable

import torch

SM_HOLD_CTAS = (8, 16, 20, 24, 32, 48)
SM_HOLD_GEMMS = ((8192, 8192, 8192), (4096, 4096, 14336), (4096, 14336, 4096), (16384, 7168, 2048))
LOOP_SECONDS = 0.02  # each GEMM loop: long enough to time, short enough to stay at full clock
IDLE_SECONDS = 0.3


def contention_curve(rows: Iterable[dict[str, Any]]) -> list[list[float]]:
    """``accelerator.sm_contention`` from measured rows: per SM count, the median slowdown
    (3 decimals) of the runs whose side kernel outlasted the GEMM loop."""
    by: dict[int, list[float]] = {}
    for row in rows:
        for b in row["beside"]:
            if b["side_outlasted"]:
                by.setdefault(int(b["ctas"]), []).append(b["u"])
    return [[float(c), round(statistics.median(us), 3)] for c, us in sorted(by.items())]


def _timed(fn, stream: torch.cuda.Stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        fn()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3


def measure_sm_contention(device: torch.device, ctas: tuple[int, ...] = SM_HOLD_CTAS,
                          gemms: tuple[tuple[int, int, int], ...] = SM_HOLD_GEMMS) -> list[dict[str, Any]]:
    """One row per GEMM shape: its time alone and, per SM count and side kernel, beside it."""
    from simumax.calibrate import sm_hold_kernels as kern

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    main_s, side_s = torch.cuda.Stream(device), torch.cuda.Stream(device)
    sink = torch.empty(max(ctas) * 1024, device=device)
    buf = 1 << 26  # 256 MiB of fp32 per buffer: beyond L2
    src, dst = torch.empty(buf, device=device), torch.empty(buf, device=device)
    per = {c: buf // c // 1024 * 1024 for c in ctas}

    def side(kind: str, c: int, amount: int) -> None:
        if kind == "spin":
            kern.spin[(c,)](sink, amount, BLOCK=1024, num_warps=kern.THREADS_WARPS)
        else:
            kern.copy[(c,)](src, dst, per[c], amount, BLOCK=1024, num_warps=kern.THREADS_WARPS)

    spin_iters = 200_000
    side("spin", 1, spin_iters)  # compile and warm
    t_spin = _timed(lambda: side("spin", 1, spin_iters), side_s)
    t_copy = {}
    for c in ctas:
        side("copy", c, 1)
        t_copy[c] = _timed(lambda: side("copy", c, 1), side_s)
    rows = []
    for m, k, n in gemms:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)

        def loop(count: int) -> None:
            for _ in range(count):
                torch.mm(a, b)

        one = _timed(lambda: loop(3), main_s) / 3
        count = max(3, int(LOOP_SECONDS / one))
        time.sleep(IDLE_SECONDS)
        alone = _timed(lambda: loop(count), main_s) / count
        target = 3 * count * alone  # the side kernel runs ~3x the loop alone
        row: dict[str, Any] = {"gemm": [m, k, n], "count": count, "alone_s": alone, "beside": []}
        for c in ctas:
            for kind in ("spin", "copy"):
                time.sleep(IDLE_SECONDS)
                with torch.cuda.stream(side_s):  # first, on its own (non-default) stream
                    side(kind, c, max(1, int(spin_iters * target / t_spin)) if kind == "spin" else int(target / t_copy[c]) + 1)
                beside = _timed(lambda: loop(count), main_s) / count
                outlasted = not side_s.query()
                torch.cuda.synchronize(device)
                row["beside"].append({"ctas": c, "kind": kind, "beside_s": beside, "side_outlasted": outlasted,
                                      "u": beside / alone - 1, "share": c / sms, "sm_model": c / (sms - c)})
        rows.append(row)
    return rows
