"""How much a collective slows the compute beside it: a network tier's ``processor_usage``.

The cost model adds u x the overlapped compute time to a rank's compute when
communication runs beside it (gradient reduce-scatters and parameter gathers under
``overlap_grad_reduce`` / ``overlap_param_gather``, ZeRO-2/3's per-layer collectives, the
EP all-to-alls of the 1F1B overlap, TE's bulk TP overlap): NCCL's kernels hold SMs (one
CTA per channel) and HBM bandwidth the GEMMs would use. Nothing in a datasheet gives u, so
``calibrate-comm`` measures it: a loop of GEMMs timed alone, then beside a run of the
collective on another stream (a thread on CPU), each at full clock (idle first, at most
~20 ms of work, as the compute calibration times kernels); u is the GEMMs' extra time per
second of overlap, the median over the ops measured.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from simumax.calibrate.timing import FULL_CLOCK_COOLDOWN_SECONDS, FULL_CLOCK_LOAD_SECONDS, synchronize

GEMM_SIZE = {"cuda": 8192, "cpu": 512}  # square GEMM of the loop: tensor-core bound on a GPU


@dataclass(frozen=True, slots=True)
class ContentionPoint:
    op: str
    group_size: int
    nbytes: int  # one collective's logical buffer
    gemm_alone: float  # seconds of the GEMM loop alone
    gemm_beside: float  # the same loop while the collectives ran
    comm_beside: float  # seconds the collectives took beside it

    @property
    def usage(self) -> float:
        """Extra GEMM seconds per second of compute under the collectives: the overlapped
        compute is the shorter of the two runs (the loop alone, when the collectives
        outlast it), as the cost model counts it (simulate/iteration.py)."""
        overlap = min(self.comm_beside, self.gemm_alone)
        if overlap <= 0:
            return 0.0
        return min(1.0, max(0.0, (self.gemm_beside - self.gemm_alone) / overlap))


def tier_usage(points: list[ContentionPoint]) -> float | None:
    """The tier's processor_usage: the median over the measured points (None: none)."""
    return round(statistics.median(p.usage for p in points), 4) if points else None


def _loop(fn: Callable[[], object], count: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(count):
            fn()
    return run


def _timed(run: Callable[[], None], device: torch.device) -> float:
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) * 1e-3
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def _together(gemms: Callable[[], None], comms: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """(GEMM loop seconds, collectives' seconds) with both running at once: the collectives
    on a side stream (a thread on CPU: gloo and torch.mm release the GIL)."""
    synchronize(device)
    if device.type == "cuda":
        side = torch.cuda.Stream(device)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            ev[2].record(side)
            comms()  # NCCL's stream waits on ``side``, and ``side`` on its result: no host wait
            ev[3].record(side)
        ev[0].record()
        gemms()
        ev[1].record()
        torch.cuda.synchronize(device)
        return ev[0].elapsed_time(ev[1]) * 1e-3, ev[2].elapsed_time(ev[3]) * 1e-3
    took: list[float] = []

    def comm_thread() -> None:
        t0 = time.perf_counter()
        comms()
        took.append(time.perf_counter() - t0)

    th = threading.Thread(target=comm_thread)
    t0 = time.perf_counter()
    th.start()
    gemms()
    gemm_s = time.perf_counter() - t0
    th.join()
    return gemm_s, took[0]


def measure(op: str, group_size: int, nbytes: int, coll: Callable[[], object], agree: Callable[[float], float],
            device: torch.device, repeats: int = 3) -> ContentionPoint:
    """One point: the GEMM loop alone and beside ``coll`` repeated for as long. Call on every
    rank at once; ``agree(x)`` returns the largest x over the ranks (an all-reduce, which
    also lines them up): the ranks run the same number of collectives, and each time is
    the slowest rank's."""
    n = GEMM_SIZE["cuda" if device.type == "cuda" else "cpu"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    c = torch.empty(n, n, dtype=dtype, device=device)

    def gemm() -> None:
        torch.mm(a, b, out=c)

    cooldown = FULL_CLOCK_COOLDOWN_SECONDS if device.type == "cuda" else 0.0
    for fn in (gemm, coll):  # warm up: kernels chosen, communicators built
        fn()
    per_gemm = max(_timed(_loop(gemm, 3), device) / 3, 1e-7)
    agree(0.0)
    per_coll = max(_timed(_loop(coll, 3), device) / 3, 1e-7)
    gemms = _loop(gemm, max(1, round(FULL_CLOCK_LOAD_SECONDS / per_gemm)))
    comms = _loop(coll, int(agree(max(1, round(FULL_CLOCK_LOAD_SECONDS / per_coll)))))  # the same count on every rank
    alone, beside, comm = [], [], []
    for _ in range(repeats):
        time.sleep(cooldown)
        alone.append(_timed(gemms, device))
        time.sleep(cooldown)
        agree(0.0)
        g, t = _together(gemms, comms, device)
        beside.append(g)
        comm.append(t)
    return ContentionPoint(op, group_size, nbytes, agree(statistics.median(alone)), agree(statistics.median(beside)),
                           agree(statistics.median(comm)))
