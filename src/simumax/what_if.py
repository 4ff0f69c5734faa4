"""What a job gains from better hardware: the iteration time with one resource of the
system scaled at a time — tensor-core peak, HBM bandwidth, scale-up links, scale-out links,
latencies, host link — each a copy of the system config estimated as any other
(``simumax what-if``; its table and chart: report/what_if.py). It answers a hardware
designer's "which resource bounds this job, and what is 1.5x of it worth", and a buyer's
"faster NICs or faster GPUs".

A resource scaled by ``f`` means: every compute family's peak x f (the measured efficiencies
stay fractions of it, so each kernel runs f times faster at its shape); every memory-bound
family's bandwidth x f; the node's links (every tier but ``inter_node``) x f, the scale-out
tier x f (and ``nic_gbps`` with it, which sets that tier when given); every per-kernel and
per-call latency / f; the host link and host memory bandwidth x f (activation / optimizer
offload). No time the package predicts comes from elsewhere: every resource x f together
runs any job f times faster (tests/test_what_if.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.estimate import Estimate

Dump = dict[str, Any]
SCALE_OUT = "inter_node"


def _tiers(d: Dump) -> dict[str, Dump]:
    """The network tiers of a system dump (its ``networks`` holds them flat, beside flags)."""
    return {name: t for name, t in d["networks"].items() if isinstance(t, dict)}


def _compute(d: Dump, f: float) -> None:
    for spec in d["accelerator"]["op"].values():
        spec["tflops"] *= f


def _memory(d: Dump, f: float) -> None:
    for spec in d["accelerator"]["bandwidth"].values():
        spec["gbps"] *= f


def _links(tier: Dump, f: float) -> None:
    tier["bandwidth"]["gbps"] *= f
    for op in tier.get("op", {}).values():  # measured bus bandwidths by group size scale with the links
        op["dp_fixed_bw"] = {k: v * f for k, v in op.get("dp_fixed_bw", {}).items()}


def _scale_up(d: Dump, f: float) -> None:
    for name, tier in _tiers(d).items():
        if name != SCALE_OUT:
            _links(tier, f)


def _scale_out(d: Dump, f: float) -> None:
    if SCALE_OUT in _tiers(d):
        _links(d["networks"][SCALE_OUT], f)
    if d.get("nic_gbps") is not None:  # sets the scale-out tier from the NICs' line rate
        d["nic_gbps"] *= f


def _latency(d: Dump, f: float) -> None:
    for spec in d["accelerator"]["bandwidth"].values():
        spec["latency_us"] /= f
    for tier in _tiers(d).values():
        tier["bandwidth"]["latency_us"] /= f
        for op in tier.get("op", {}).values():
            if op.get("latency_us") is not None:
                op["latency_us"] /= f
            op["fixed_latency_us"] = op.get("fixed_latency_us", 0.0) / f
            op["fixed_latency_us_by_comm_num"] = {k: v / f for k, v in op.get("fixed_latency_us_by_comm_num", {}).items()}


def _host(d: Dump, f: float) -> None:
    d["host_link_gbps"] *= f
    d["host_mem_gbps"] *= f


def _host_cpu(d: Dump, f: float) -> None:
    d["host_op_us"] /= f
    d["host_sync_us"] /= f


@dataclass(frozen=True)
class Resource:
    name: str
    fields: str  # what scales, in the system config's terms
    apply: Callable[[Dump, float], None]  # scales a system dump in place


RESOURCES = (
    Resource("tensor-core peak", "accelerator.op.*.tflops", _compute),
    Resource("HBM bandwidth", "accelerator.bandwidth.*.gbps", _memory),
    Resource("scale-up links", "networks.<tiers but inter_node>.bandwidth.gbps", _scale_up),
    Resource("scale-out links", "networks.inter_node.bandwidth.gbps, nic_gbps", _scale_out),
    Resource("latencies", "every latency_us and fixed_latency_us (divided)", _latency),
    Resource("host link and memory", "host_link_gbps, host_mem_gbps", _host),
    Resource("host CPU", "host_op_us, host_sync_us (divided)", _host_cpu),
)


def scaled_by(system: SystemConfig, factors: Iterable[tuple[Resource, float]], source: str,
              name: str | None = None) -> SystemConfig:
    """A copy of ``system`` with each resource times its factor (``name``: the copy's sys_name)."""
    d = system.model_dump()
    for r, f in factors:
        r.apply(d, f)
    if name is not None:
        d["sys_name"] = name
    return SystemConfig.init_from_dict(d, source=source)


def scaled_system(system: SystemConfig, resources: tuple[Resource, ...], factor: float) -> SystemConfig:
    """A copy of ``system`` with some resources ``factor`` times better."""
    names = ", ".join(r.name for r in resources)
    return scaled_by(system, ((r, factor) for r in resources), f"{system.source or system.sys_name} ({names} x{factor:g})")


@dataclass(frozen=True)
class WhatIf:
    resource: str
    fields: str
    factor: float
    time: float  # s per iteration with the resource scaled
    base_time: float  # s per iteration as the system is

    @property
    def change(self) -> float:
        """Relative change of the iteration time (negative: faster)."""
        return self.time / self.base_time - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"resource": self.resource, "fields": self.fields, "factor": self.factor, "time": self.time,
                "base_time": self.base_time, "change": self.change}


def check_factor(factor: float) -> None:
    if not (1.0 < factor <= 10.0):  # NaN fails too; 10x keeps every scaled rate within its field's bound
        raise ConfigError("--factor", f"must lie in (1, 10]: how many times better a resource is made (got {factor})")


def what_if(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig, factor: float = 1.5,
            base: float | None = None) -> list[WhatIf]:
    """The iteration time with each resource ``factor`` times better, one at a time, most
    gain first."""
    return sweep(model, strategy, system, (factor,), base)


def sweep(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig, factors: tuple[float, ...],
          base: float | None = None) -> list[WhatIf]:
    """``what_if`` at each of ``factors`` (ascending), the job as it is estimated once
    (``base``: its iteration time, when the caller has it)."""
    for f in factors:
        check_factor(f)
    if base is None:
        base = Estimate(model, strategy, system).cost().duration_time_per_iter
    out: list[WhatIf] = []
    for f in sorted(set(factors)):
        rows = [WhatIf(r.name, r.fields, f, Estimate(model, strategy, scaled_system(system, (r,), f)).cost()
                       .duration_time_per_iter, base) for r in RESOURCES]
        out += sorted(rows, key=lambda w: w.time)
    return out
