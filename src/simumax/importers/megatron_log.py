"""A Megatron-LM training log read as a measured run: the step time and peak memory its
``training_log`` and ``report_memory`` lines print (megatron/training/training.py and
megatron/training/utils/common_utils.py, Megatron-LM 0.19; the same formats since 2021):

    [2026-...] iteration       20/     100 | consumed samples: ... | elapsed time per iteration (ms): 1234.5 | ...
    [Rank 3] (after 10 iterations) memory (MB) | allocated: ... | max allocated: 40123.45 | reserved: ... | max reserved: ...

Each ``elapsed time per iteration`` is the mean over one logging interval; the first interval
holds the start-up (compilation, allocator warm-up, the first data), so the step time is the
median of the intervals after it. ``report_memory`` prints on data-parallel rank 0 of every
tensor / pipeline rank, in MiB (2^20 bytes): the peak is the largest ``max allocated`` over
them, the convention of the validation files (``torch.cuda.max_memory_allocated``, max over
ranks)."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from simumax.errors import ConfigError

_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")
_MEM = re.compile(r"\[Rank (\d+)\][^|\n]*memory \(MB\)\s*\|\s*allocated:\s*[0-9.]+\s*\|\s*max allocated:\s*([0-9.]+)"
                  r"\s*\|\s*reserved:\s*[0-9.]+\s*\|\s*max reserved:\s*([0-9.]+)")
MIB = 2**20


@dataclass(frozen=True)
class MegatronLog:
    intervals: tuple[tuple[int, float], ...]  # (iteration, mean ms over the interval ending there), as logged
    max_allocated: float | None  # bytes, the largest over the ranks that reported
    max_reserved: float | None

    @property
    def step_ms(self) -> float:
        """Median of the logged intervals after the first (start-up); the only one if one."""
        times = [ms for _, ms in self.intervals]
        return statistics.median(times[1:] if len(times) > 1 else times)


def parse_megatron_log(text: str, source: str = "log") -> tuple[MegatronLog, list[str]]:
    """The log's step times and memory peaks, and notes on what it lacked."""
    intervals = tuple((int(m[1]), float(m[2])) for m in _ITER.finditer(text))
    if not intervals:
        raise ConfigError("log", "no 'iteration N/M | ... elapsed time per iteration (ms): X' line: is it a Megatron-LM "
                          "training log (rank 0's or the last rank's output)?", source)
    mem = [(float(m[2]) * MIB, float(m[3]) * MIB) for m in _MEM.finditer(text)]
    notes = []
    if len(intervals) == 1:
        notes.append(f"{source}: one logged interval, start-up included: the step time reads slow; log more iterations")
    if not mem:
        notes.append(f"{source}: no 'memory (MB)' report (Megatron prints one after the first iterations, on "
                     "data-parallel rank 0 of each stage): no peak memory recorded")
    return MegatronLog(intervals, max((a for a, _ in mem), default=None), max((r for _, r in mem), default=None)), notes
