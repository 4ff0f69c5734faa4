"""Compute-kernel time: peak x efficiency, efficiency from the measured shape table.

Lookups are counted: a hit uses the measured entry; a miss uses the family's configured
``efficient_factor`` and is recorded (with its key) so reports show which shapes were
not measured.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from simumax.config.system import SystemConfig
from simumax.graph.kernels import Attention, Gemm, GroupGemm, MemBound

ComputeKernel = Gemm | GroupGemm | Attention


@dataclass(slots=True)
class LookupLog:
    hits: Counter[str] = field(default_factory=Counter)  # family -> count
    misses: Counter[str] = field(default_factory=Counter)  # "family: key" -> count

    def to_dict(self) -> dict[str, object]:
        return {
            "hits": dict(sorted(self.hits.items())),
            "misses": dict(sorted(self.misses.items())),
        }


class ComputeModel:
    """Time of Gemm / Attention / MemBound kernels on one accelerator."""

    def __init__(self, system: SystemConfig) -> None:
        self.acc = system.accelerator
        self.log = LookupLog()
        # kernel -> (seconds, achieved efficiency, family used, table hit)
        self._cache: dict[object, tuple[float, float, str, bool]] = {}

    def _family(self, name: str) -> str:
        """The configured family a kernel uses: its own, else (fp8) its bf16 twin, else default."""
        ops = self.acc.op
        for candidate in (name, name.removeprefix("fp8_")):
            if candidate in ops:
                return candidate
        return "default"

    def _efficiency(self, name: str, key: str) -> tuple[float, bool]:
        """(efficiency, measured) for a configured family and shape key. An fp8 family with
        neither a measured entry nor its own default (SimuMax files give 0) uses the bf16
        family's efficiency for the same shape, against the fp8 peak."""
        ops = self.acc.op
        spec = ops[name]
        eff = spec.accurate_efficient_factor.get(key)
        if eff is not None:
            return eff, True
        if name.startswith("fp8_") and spec.efficient_factor <= 0:
            base = ops[self._family(name[4:])]
            return base.accurate_efficient_factor.get(key, base.efficient_factor), False
        return spec.efficient_factor, False

    def compute(self, k: ComputeKernel) -> tuple[float, float]:
        """(seconds, achieved efficiency on model FLOPs) of one GEMM or attention kernel."""
        cached = self._cache.get(k)
        if cached is None:
            cached = self._cache[k] = self._cost(k)
        t, eff, name, hit = cached
        if hit:
            self.log.hits[name] += 1
        else:
            self.log.misses[f"{name}: {k.key}"] += 1
        return t, eff

    def _cost(self, k: ComputeKernel) -> tuple[float, float, str, bool]:
        name = self._family(k.family)
        spec = self.acc.op[name]
        eff, hit = self._efficiency(name, k.key)
        table_flops = k.table_flops if isinstance(k, Attention) else k.flops
        peak = spec.tflops * 1e12
        t = table_flops / (peak * eff) if eff > 0 else float("inf")
        return t, (k.flops / (t * peak) if t > 0 else 0.0), name, hit

    def membound(self, k: MemBound) -> float:
        bw = self.acc.bandwidth.get(k.family) or self.acc.bandwidth["default"]
        return k.bytes / (bw.gbps * 1e9 * bw.efficient_factor) + bw.latency_us * 1e-6

