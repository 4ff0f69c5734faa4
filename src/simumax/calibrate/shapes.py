"""The kernels one job runs on one rank, read from the op IR (no torch here).

Calibration times exactly these shapes, so the keys it writes are the keys the estimate
of the same job looks up.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.graph.kernels import Attention, Gemm, GroupGemm, Kernel, MemBound


@dataclass
class JobKernels:
    """Unique compute kernels by family, and memory-bound byte sizes by bandwidth family."""

    gemms: dict[str, list[Gemm]] = field(default_factory=lambda: defaultdict(list))  # family -> kernels
    group_gemms: dict[str, list[GroupGemm]] = field(default_factory=lambda: defaultdict(list))
    attentions: list[Attention] = field(default_factory=list)
    membound: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # family -> bytes

    def add(self, other: "JobKernels") -> None:
        """Union with another job's kernels (first-seen order kept)."""
        for mine, theirs in ((self.gemms, other.gemms), (self.group_gemms, other.group_gemms), (self.membound, other.membound)):
            for fam, items in theirs.items():
                mine[fam] += [x for x in items if x not in mine[fam]]
        self.attentions += [x for x in other.attentions if x not in self.attentions]

    @property
    def count(self) -> int:
        return (sum(map(len, self.gemms.values())) + sum(map(len, self.group_gemms.values()))
                + len(self.attentions) + sum(map(len, self.membound.values())))


def job_kernels(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig) -> JobKernels:
    """Every distinct GEMM / grouped GEMM / attention kernel of every pipeline stage of the
    job, in first-seen order, and the distinct byte sizes of its memory-bound kernels."""
    from simumax.estimate import Estimate  # heavy import kept out of module import

    est = Estimate(model, strategy, system)
    out = JobKernels()
    seen: set[object] = set()
    sizes: dict[str, set[float]] = defaultdict(set)
    for k in itertools.chain(itertools.chain.from_iterable(chunk.kernels() for chunk in est.chunks),
                             _optimizer_kernels(est)):
        if isinstance(k, MemBound):
            # a family's line is fitted in its table convention (the cross-entropy chain's)
            size = k.bytes if k.table_bytes is None else k.table_bytes
            if size > 0 and size not in sizes[k.family]:
                sizes[k.family].add(size)
                out.membound[k.family].append(float(size))
            continue
        if not isinstance(k, (Gemm, GroupGemm, Attention)) or k in seen:
            continue
        seen.add(k)
        if isinstance(k, Gemm):
            out.gemms[k.family].append(k)
        elif isinstance(k, GroupGemm):
            out.group_gemms[k.family].append(k)
        else:
            out.attentions.append(k)
    return out


def _optimizer_kernels(est) -> list[Kernel]:
    """Muon's step kernels (its TF32 Newton-Schulz GEMMs, dp/muon.py) per weight shape."""
    if est.strategy.optimizer != "muon":
        return []
    from simumax.dp.muon import stage_matrices, step_kernels

    st = est.strategy
    shapes = {m for stage in est.stages for m, _ in stage_matrices(est.model, st, stage)}
    return [k for m in shapes for k in step_kernels(m, st)]
