"""Where an estimate's kernel time came from, per estimate and in seconds: each kernel of
one micro-batch through every model chunk, by family and source (compute: measured table
entry, fitted from the table, default curve; memory-bound: the family's own bandwidth line
or the default HBM line; collectives by group). Layer kinds are summed once and reused
(profiles.LayerProfiles), so a search pays a few dictionary additions per estimate."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from simumax.cost.efficiency import SOURCES, ComputeModel
from simumax.cost.network import NetworkModel
from simumax.graph.kernels import Collective, MemBound
from simumax.graph.ops import PHASES, Op


@dataclass(slots=True)
class KernelSources:
    counts: Counter[str] = field(default_factory=Counter)  # "family/source" -> kernels
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # "family/source" -> s
    misses: Counter[str] = field(default_factory=Counter)  # "family: key" -> kernels not measured

    def add(self, other: "KernelSources", times: int = 1) -> None:
        """Add ``other`` ``times`` times (seconds one addition after another: what adding
        it per layer gives, to the last bit)."""
        # plain loops: Counter.update is a Python-level loop with more steps per key
        for mine, theirs in ((self.counts, other.counts), (self.misses, other.misses)):
            for k, n in theirs.items():
                mine[k] += n * times
        seconds = self.seconds
        for k, v in other.seconds.items():
            x = seconds[k]
            for _ in range(times):
                x += v
            seconds[k] = x

    def to_dict(self) -> dict[str, Any]:
        """``CostResult.efficiency_lookups``: hits (measured kernels by family), misses (every
        shape not measured, with its count), sources (kernels by family and source) and
        seconds (the same in seconds; collectives as ``comm/<group>``, measured or default:
        a tier from a datasheet)."""
        sources: dict[str, dict[str, int]] = {}
        seconds: dict[str, dict[str, float]] = {}
        for key in sorted(set(self.counts) | set(self.seconds)):
            fam, src = key.rsplit("/", 1)
            if src in SOURCES:
                sources.setdefault(fam, dict.fromkeys(SOURCES, 0))[src] += self.counts[key]
                seconds.setdefault(fam, dict.fromkeys(SOURCES, 0.0))[src] += self.seconds[key]
            else:
                seconds.setdefault(fam, {})[src] = self.seconds[key]
        hits = {fam: n["measured"] for fam, n in sources.items() if n["measured"] and not fam.startswith(("memory/", "comm/"))}
        return {"hits": hits, "misses": dict(sorted(self.misses.items())), "sources": sources, "seconds": seconds}


def of_ops(ops: list[Op], compute: ComputeModel, network: NetworkModel) -> KernelSources:
    out = KernelSources()
    for op in ops:
        for ph in PHASES:
            for k in op.kernels(ph):
                if isinstance(k, Collective):
                    src = "measured" if network.measured(k.group) else "default"  # default: a datasheet tier
                    key, t = f"comm/{k.group}/{src}", network.time(k)
                elif isinstance(k, MemBound):
                    key, t = compute.membound_source(k)
                else:
                    t, fam, src = compute.seconds_and_source(k)
                    key = f"{fam}/{src}"
                    if src != "measured":
                        out.misses[f"{fam}: {k.key}"] += 1
                out.counts[key] += 1
                out.seconds[key] += t
    return out
