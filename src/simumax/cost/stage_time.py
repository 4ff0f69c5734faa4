"""Per-op, per-phase time from kernel costs, and a stage's per-micro-batch totals.

Kernels in a phase run one after another (no overlap: what the validation runs did;
overlap options belong to the event simulator).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from simumax.cost.efficiency import ComputeModel
from simumax.cost.network import NetworkModel
from simumax.graph.kernels import Attention, Collective, Gemm, GroupGemm, Kernel, MemBound
from simumax.graph.ops import Op, Stage


@dataclass(slots=True)
class PhaseTime:
    total: float = 0.0
    compute: float = 0.0  # GEMM + attention
    membound: float = 0.0
    comm: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # exposed, by group
    flops: float = 0.0

    def add(self, other: "PhaseTime") -> None:
        self.total += other.total
        self.compute += other.compute
        self.membound += other.membound
        self.flops += other.flops
        for g, t in other.comm.items():
            self.comm[g] += t


class Coster:
    """Turns kernel sequences into PhaseTime using one compute and one network model."""

    def __init__(self, compute: ComputeModel, network: NetworkModel) -> None:
        self.compute = compute
        self.network = network

    def kernel(self, k: Kernel) -> float:
        if isinstance(k, Collective):
            return self.network.time(k)
        if isinstance(k, MemBound):
            return self.compute.membound(k)
        return self.compute.compute(k)[0]

    def sequence(self, kernels: tuple[Kernel, ...]) -> PhaseTime:
        out = PhaseTime()
        for k in kernels:
            t = self.kernel(k)
            if isinstance(k, Collective):
                self._comm(out, k, t)
            else:
                self._compute(out, k, t)
        return out

    @staticmethod
    def _comm(out: PhaseTime, c: Collective, t: float) -> None:
        out.total += t
        out.comm[c.group] += t

    @staticmethod
    def _compute(out: PhaseTime, k: Gemm | GroupGemm | Attention | MemBound, t: float) -> None:
        out.total += t
        out.flops += k.flops
        if isinstance(k, MemBound):
            out.membound += t
        else:
            out.compute += t

    def op(self, o: Op) -> dict[str, PhaseTime]:
        """fwd, bwd (input then weight gradients, timed as one sequence) and recompute."""
        return {
            "fwd": self.sequence(o.fwd),
            "bwd": self.sequence(o.bwd_input + o.bwd_weight),
            "recompute": self.sequence(o.kernels("recompute")),
        }


@dataclass(slots=True)
class StageTime:
    """One micro-batch on one stage."""

    fwd: PhaseTime
    bwd: PhaseTime
    recompute: PhaseTime
    p2p: float  # one send of the activation (or its gradient) to a neighbour

    @property
    def total(self) -> float:
        return self.fwd.total + self.bwd.total + self.recompute.total


def stage_time(coster: Coster, stage: Stage, p2p_time: float) -> StageTime:
    fwd, bwd, rec = PhaseTime(), PhaseTime(), PhaseTime()
    for o in stage.ops:
        ph = coster.op(o)
        fwd.add(ph["fwd"])
        bwd.add(ph["bwd"])
        rec.add(ph["recompute"])
    return StageTime(fwd, bwd, rec, p2p_time)
