"""Where an estimate's kernel time came from, per estimate and in seconds: each kernel of
one micro-batch through every model chunk, by family and source (compute: measured table
entry, fitted from the table, default curve; memory-bound: the family's own bandwidth line
or the default HBM line; collectives by group). Layer kinds are summed once and reused
(profiles.LayerProfiles), so a search pays a few dictionary additions per estimate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simumax.cost.efficiency import SOURCES, ComputeModel
from simumax.cost.network import NetworkModel
from simumax.graph.kernels import Collective, MemBound
from simumax.graph.ops import Op


@dataclass(slots=True)
class KernelSources:
    # plain dicts: Counter and defaultdict make each empty one and each new key a Python call
    counts: dict[str, int] = field(default_factory=dict)  # "family/source" -> kernels
    seconds: dict[str, float] = field(default_factory=dict)  # "family/source" -> s
    misses: dict[str, int] = field(default_factory=dict)  # "family: key" -> kernels not measured
    # "<mechanism>/compute", "<mechanism>/comm" or "<mechanism>/other" -> s: compute and
    # collective seconds of ops whose sizes rest on a mechanism the configs do not fix
    # (Op.approximate): measured compute, measured collectives (which the band counts as
    # unmeasured, simumax/uncertainty.py) and the rest
    approximate: dict[str, float] = field(default_factory=dict)

    def add(self, other: "KernelSources", times: int = 1) -> None:
        """Add ``other`` ``times`` times (seconds one addition after another: what adding
        it per layer gives, to the last bit)."""
        for mine, theirs in ((self.counts, other.counts), (self.misses, other.misses)):
            for k, n in theirs.items():
                mine[k] = mine.get(k, 0) + n * times
        for mine_s, theirs_s in ((self.seconds, other.seconds), (self.approximate, other.approximate)):
            for k, v in theirs_s.items():
                x = mine_s.get(k, 0.0)
                for _ in range(times):
                    x += v
                mine_s[k] = x

    def to_dict(self) -> dict[str, Any]:
        """``CostResult.efficiency_lookups``: hits (measured kernels by family), misses (every
        shape not measured, with its count), sources (kernels by family and source) and
        seconds (the same in seconds; collectives as ``comm/<group>``, measured or default:
        a tier from a datasheet) and approximate (compute and collective seconds per mechanism
        the configs do not fix, ``Op.approximate``)."""
        sources: dict[str, dict[str, int]] = {}
        seconds: dict[str, dict[str, float]] = {}
        for key in sorted(set(self.counts) | set(self.seconds)):
            fam, src = key.rsplit("/", 1)
            if src in SOURCES:
                sources.setdefault(fam, dict.fromkeys(SOURCES, 0))[src] += self.counts.get(key, 0)
                seconds.setdefault(fam, dict.fromkeys(SOURCES, 0.0))[src] += self.seconds.get(key, 0.0)
            else:
                seconds.setdefault(fam, {})[src] = self.seconds.get(key, 0.0)
        hits = {fam: n["measured"] for fam, n in sources.items() if n["measured"] and not fam.startswith(("memory/", "comm/"))}
        approximate: dict[str, float] = {}
        for key, t in sorted(self.approximate.items()):
            mech = key.rsplit("/", 1)[0]
            approximate[mech] = approximate.get(mech, 0.0) + t
        return {"hits": hits, "misses": dict(sorted(self.misses.items())), "sources": sources, "seconds": seconds,
                "approximate": approximate}


def of_ops(ops: list[Op], compute: ComputeModel, network: NetworkModel) -> KernelSources:
    out = KernelSources()
    counts, seconds, misses, approx = out.counts, out.seconds, out.misses, out.approximate
    comm_keys: dict[str, str] = {}  # group -> "comm/<group>/<source>"
    for op in ops:
        mech = op.approximate
        for phase in op.phase_kernels():
            for k in phase:
                kind = type(k)
                if kind is Collective:
                    key = comm_keys.get(k.group)
                    if key is None:  # default: a datasheet tier
                        key = comm_keys[k.group] = f"comm/{k.group}/{'measured' if network.measured(k.group) else 'default'}"
                    t = network.time(k)
                elif kind is MemBound:
                    key, t = compute.membound_source(k)
                else:
                    t, key, miss = compute.attributed(k)
                    if miss is not None:
                        misses[miss] = misses.get(miss, 0) + 1
                counts[key] = counts.get(key, 0) + 1
                seconds[key] = seconds.get(key, 0.0) + t
                if mech and kind is not MemBound:  # the band's u counts compute and collectives only
                    part = ("comm" if kind is Collective else "compute") if key.endswith("/measured") else "other"
                    a = f"{mech}/{part}"
                    approx[a] = approx.get(a, 0.0) + t
    return out
