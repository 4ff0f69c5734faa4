"""Compute-kernel time: peak x efficiency.

Efficiency of a shape, in order (cost/efficiency_fit.py): (a) the measured table entry;
(b) a fit over the family's measured entries (nearest shapes in log space around a
wave-quantisation / saturation baseline); (c) the default curve: the family's configured
``efficient_factor`` as the asymptote of that baseline. Each kernel's source is kept with
its time; cost/sources.py sums them per estimate (in seconds, every shape not measured
listed with its key), so a report says which kernels were measured, fitted or defaulted.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from simumax.config.base import snapshot, snapshot_field
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.cost.efficiency_fit import MIN_FIT_ENTRIES, TableFit, default_curve, parse_key, wave_fraction
from simumax.graph.kernels import HOST_SYNC, TF32_PREFIX, Attention, Gemm, GroupGemm, MemBound

ComputeKernel = Gemm | GroupGemm | Attention

# TF32 tensor-core peak over the dense BF16 one: 1/2 on every datasheet since Ampere (A100
# 156 / 312, H100 SXM 495 / 989, B200 1.1 / 2.25 PFLOP/s, MI300X 654 / 1307 TFLOP/s). A
# system without a TF32 family of its own runs TF32 GEMMs at its bf16 family's efficiency
# for the shape against this share of the bf16 peak (measured on an H100, router shapes:
# docs/calibration.md, "Router GEMMs in fp32").
TF32_OF_BF16_PEAK = 0.5


SOURCES = ("measured", "fitted", "default")


class KernelCost(NamedTuple):
    """What a GEMM / attention kernel costs on one accelerator (ComputeModel keeps one per
    kernel): its time, the efficiency achieved on model FLOPs, the family and source its
    efficiency came from, their "family/source" key and, when not measured, the
    "family: shape key" text (the band's attribution, cost/sources.py)."""

    seconds: float
    efficiency: float
    family: str
    source: str
    source_key: str
    miss: str | None


class ComputeModel:
    """Time of Gemm / Attention / MemBound kernels on one accelerator."""

    def __init__(self, system: SystemConfig, system_snapshot: Any = None) -> None:
        self.acc = system.accelerator
        # what every shared derivation below depends on (taken from the system's snapshot
        # when the caller made one: PerfLLM's change check)
        self._contents = snapshot(self.acc) if system_snapshot is None else snapshot_field(system_snapshot, "accelerator")
        # kernel -> KernelCost: a kernel's cost is the accelerator's alone, so every estimate
        # of this accelerator config shares it while the config's contents stay the same
        # (an edit in place starts afresh)
        self._cache: dict[object, KernelCost] = self.acc.derived("kernel costs", self._contents, dict)
        self._fits: dict[str, TableFit] = {}
        self._parsed: dict[str, dict[str, float]] = {}  # shape key -> sizes
        self._mem_lines: dict[str, tuple[str, float, float]] = {}  # family -> (source key, s/byte, latency)
        # a host wait idles the GPU for the host's round trip (graph/kernels.HOST_SYNC)
        self._mem_lines[HOST_SYNC] = (f"memory/{HOST_SYNC}/default", 0.0, system.host_sync_us * 1e-6)
        hbm = self.acc.bandwidth["default"]
        self._hbm_seconds_per_byte = 1.0 / (hbm.gbps * 1e9 * hbm.efficient_factor)

    def _family(self, name: str) -> str:
        """The configured family a kernel uses: its own, else (fp8, TF32) its bf16 twin, else default."""
        ops = self.acc.op
        for candidate in (name, name.removeprefix("fp8_").removeprefix("fp4_").removeprefix(TF32_PREFIX)):
            if candidate in ops:
                return candidate
        return "default"

    def _fit(self, name: str) -> TableFit:
        fit = self._fits.get(name)
        if fit is None:
            # fitting parses every table key: shared by every estimate of this accelerator
            # config while its contents stay the same (an edit in place refits)
            table, sm = self.acc.op[name].accurate_efficient_factor, self.acc.sm_count
            fit = self._fits[name] = self.acc.derived(f"fit/{name}", self._contents, lambda: TableFit(table, sm))
        return fit

    def _efficiency(self, name: str, key: str) -> tuple[float, str]:
        """(efficiency, source) for a configured family and shape key.

        An fp8 family without a table of its own derives its shape's efficiency from the
        bf16 family's (``_fp8_from_bf16``); with no default of its own either (SimuMax files
        give 0) the bf16 efficiency of the same shape applies against the fp8 peak."""
        ops = self.acc.op
        spec = ops[name]
        eff = spec.accurate_efficient_factor.get(key)
        if eff is not None:
            return eff, "measured"
        if name.startswith(("fp8_", "fp4_")) and not spec.accurate_efficient_factor:
            base = self._family(name[4:])
            eff, _ = self._efficiency(base, key)
            if spec.efficient_factor > 0 and base != "default":
                eff = self._fp8_from_bf16(spec.tflops, spec.efficient_factor, ops[base].tflops,
                                          ops[base].efficient_factor, eff, key)
            # the shape's bf16 efficiency stands in, at a low-precision rate no table of this
            # device measured (a default asymptote): "default" in the band's attribution
            return eff, "default"
        if len(spec.accurate_efficient_factor) >= MIN_FIT_ENTRIES:
            fitted = self._fit(name).predict(key)  # None when the table has too little to fit
            if fitted is not None:
                return fitted, "fitted"
        return default_curve(self._sizes(key), spec.efficient_factor, self.acc.sm_count), "default"

    def _sizes(self, key: str) -> dict[str, float]:
        """The sizes of a shape key, parsed once (an fp8 kernel reads its bf16 twin's)."""
        got = self._parsed.get(key)
        if got is None:
            got = self._parsed[key] = parse_key(key)[1]
        return got

    def efficiency(self, family: str, key: str) -> tuple[float, str, str]:
        """(efficiency, family used, measured / fitted / default) of a shape key in the
        table convention, for a kernel family name as configured (``matmul``, ``sdp_fwd`` ...)."""
        name = self._family(family)
        eff, source = self._efficiency(name, key)
        return eff, name, source

    def _fp8_from_bf16(self, p8: float, e8: float, p16: float, e16_asym: float, e16: float, key: str) -> float:
        """An fp8 GEMM's efficiency (against the fp8 peak ``p8``) from the bf16 one of the
        same shape: the bf16 time splits into the math a full wave of tiles runs at the bf16
        asymptote, F / (p16 · e16_asym · wave), and the rest (fill and drain, prologue,
        epilogue, launch: what small problems pay); fp8 runs the math at its own sustained
        rate, F / (p8 · e8 · wave), and pays the rest unchanged. So small N or K gain little
        over bf16 and large GEMMs gain p8·e8 / (p16·e16_asym)."""
        if e16 <= 0 or e16_asym <= 0:
            return e16
        wave = wave_fraction(self._sizes(key), self.acc.sm_count)
        per_flop16 = 1.0 / (p16 * e16)
        math16 = min(per_flop16, 1.0 / (p16 * e16_asym * wave))
        per_flop8 = 1.0 / (p8 * e8 * wave) + (per_flop16 - math16)
        return 1.0 / (p8 * per_flop8)

    def _lookup(self, k: ComputeKernel) -> KernelCost:
        cached = self._cache.get(k)
        if cached is None:
            cached = self._cache[k] = self._cost(k)
        return cached

    def compute(self, k: ComputeKernel) -> tuple[float, float]:
        """(seconds, achieved efficiency on model FLOPs) of one GEMM or attention kernel."""
        c = self._lookup(k)
        return c.seconds, c.efficiency

    def seconds_and_source(self, k: ComputeKernel) -> tuple[float, str, str]:
        """(seconds, family used, measured / fitted / default) of a kernel."""
        c = self._lookup(k)
        return c.seconds, c.family, c.source

    def attributed(self, k: ComputeKernel) -> tuple[float, str, str | None]:
        """(seconds, "family/source", "family: shape key" when not measured): what
        cost/sources.py sums per estimate."""
        c = self._lookup(k)
        return c.seconds, c.source_key, c.miss

    def membound_source(self, k: MemBound) -> tuple[str, float]:
        """("memory/<family>/<measured|default>", seconds) of a bandwidth-bound kernel."""
        key, per_byte, latency = self._mem_line(k.family)
        if k.table_bytes is not None and key.endswith("/measured"):
            return key, k.table_bytes * per_byte + latency  # the unit the line was measured on
        return key, k.bytes * per_byte + k.launches * latency

    def _cost(self, k: ComputeKernel) -> KernelCost:
        name = self._family(k.family)
        spec = self.acc.op[name]
        key = k.key
        eff, source = self._efficiency(name, key)
        # a table's efficiencies are in the FLOP convention it was measured with
        table_flops = k.table_flops(spec.sdp_bwd_ratio) if isinstance(k, Attention) else k.flops
        peak = spec.tflops * 1e12
        if k.family.startswith(TF32_PREFIX) and not name.startswith(TF32_PREFIX):
            # the bf16 twin's shape efficiency at the TF32 rate no table of this device holds
            peak *= TF32_OF_BF16_PEAK
            source = "default"
        if eff <= 0 or peak <= 0:
            raise ConfigError(
                f"accelerator.op.{name}", f"peak {spec.tflops} TFLOP/s at efficiency {eff:g} for a kernel this job runs "
                f"({key}): its time would be infinite",
            )
        t = table_flops / (peak * eff)
        if not isinstance(k, Attention):
            # roofline floor: no GEMM runs faster than its operands and output cross HBM
            # (batched attention GEMMs with head_dim <= 128 on A100 are memory-bound)
            t = max(t, k.bytes * self._hbm_seconds_per_byte)
        return KernelCost(t, k.flops / (t * peak) if t > 0 else 0.0, name, source, f"{name}/{source}",
                          None if source == "measured" else f"{name}: {key}")

    def membound(self, k: MemBound) -> float:
        """Bandwidth-bound kernel: the family's line (bytes / (gbps · eff) + latency, as
        calibrate fits it) when the system has the family, else the default HBM line."""
        return self.membound_source(k)[1]

    def _mem_line(self, family: str) -> tuple[str, float, float]:
        """(source key, seconds per byte, latency) of a memory-bound family."""
        line = self._mem_lines.get(family)
        if line is None:
            bw = self.acc.bandwidth.get(family)
            src = "measured" if bw is not None else "default"
            bw = bw or self.acc.bandwidth["default"]
            line = self._mem_lines[family] = (f"memory/{family}/{src}", 1.0 / (bw.gbps * 1e9 * bw.efficient_factor), bw.latency_us * 1e-6)
        return line

