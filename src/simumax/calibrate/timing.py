"""Timers for the calibration benchmarks (torch imported by the caller's module)."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, warmup: int = 3, repeats: int = 10) -> float:
    """Median wall time of one call: CUDA events around each call on a GPU (device-side
    time, launch queued behind the previous call as in a training step), a synchronised
    perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples: list[float] = []
    if device.type == "cuda":
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) * 1e-3 for s, e in pairs]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def pick_device(name: str | None = None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform

    return f"cpu ({platform.processor() or platform.machine()})"
