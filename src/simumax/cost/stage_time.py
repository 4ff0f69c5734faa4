"""Per-op, per-phase time from kernel costs, and a stage's per-micro-batch totals.

Kernels in a phase run one after another (no overlap: what the validation runs did),
except the context-parallel ring's transfers, which TransformerEngine runs under the
attention kernel before them, and with ``tp_comm_overlap``: TE's userbuffers split a GEMM
around the all-gather feeding it or the reduce-scatter it feeds (cost/userbuffers.py), and
run the column-parallel backward's all-gather /
reduce-scatter under its own GEMM, so per op and phase the pair costs
max(G, C) + u * min(G, C) (u: the TP tier's ``processor_usage``, the slowdown of
compute sharing the GPU with communication). Overlap across passes (gradient reduce,
P2P, EP all-to-all between micro-batches) belongs to the event simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from simumax.cost import userbuffers
from simumax.cost.efficiency import ComputeModel
from simumax.cost.network import NetworkModel
from simumax.graph.kernels import Attention, Collective, Gemm, GroupGemm, Kernel, MemBound
from simumax.graph.ops import PHASES, Op


@dataclass(slots=True)
class PhaseTime:
    total: float = 0.0
    compute: float = 0.0  # GEMM + attention
    membound: float = 0.0
    comm: dict[str, float] = field(default_factory=dict)  # exposed, by group
    flops: float = 0.0
    bytes: float = 0.0  # moved by memory-bound kernels and collectives

    def add(self, other: "PhaseTime", times: int = 1) -> None:
        """Add ``other`` ``times`` times, one addition after another (what adding it per
        layer gives, to the last bit)."""
        if times == 1:
            self.total += other.total
            self.compute += other.compute
            self.membound += other.membound
            self.flops += other.flops
            self.bytes += other.bytes
            comm = self.comm
            for g, t in other.comm.items():
                comm[g] = comm.get(g, 0.0) + t
            return
        total, compute, membound, flops, nbytes = self.total, self.compute, self.membound, self.flops, self.bytes
        o_total, o_compute, o_membound, o_flops, o_bytes = other.total, other.compute, other.membound, other.flops, other.bytes
        for _ in range(times):
            total += o_total
            compute += o_compute
            membound += o_membound
            flops += o_flops
            nbytes += o_bytes
        self.total, self.compute, self.membound, self.flops, self.bytes = total, compute, membound, flops, nbytes
        for g, t in other.comm.items():
            x = self.comm.get(g, 0.0)
            for _ in range(times):
                x += t
            self.comm[g] = x


class Coster:
    """Turns kernel sequences into PhaseTime using one compute and one network model."""

    def __init__(self, compute: ComputeModel, network: NetworkModel, tp_comm_overlap: bool = False) -> None:
        self.compute = compute
        self.network = network
        self.tp_comm_overlap = tp_comm_overlap

    def kernel(self, k: Kernel) -> float:
        if isinstance(k, Collective):
            return self.network.time(k)
        if isinstance(k, MemBound):
            return self.compute.membound(k)
        return self.compute.compute(k)[0]

    def sequence(self, kernels: tuple[Kernel, ...], userbuffers_op: bool = True) -> PhaseTime:
        """The phase's time; ``userbuffers_op``: the op is a TransformerEngine linear, whose
        TP collectives ``tp_comm_overlap`` puts on userbuffers (Megatron's own layers, the
        output layer's ``ColumnParallelLinear``, keep theirs as they are)."""
        if not kernels:
            return PhaseTime()
        ub = self.tp_comm_overlap and userbuffers_op
        if ub and self.network.groups["tp"].size > 1:
            method = userbuffers.overlap_method(kernels)
            if method in ("ring", "pipeline"):
                return self._userbuffers(kernels, method)
        out = PhaseTime()
        gemm = 0.0
        cover = 0.0  # attention time left to hide context-parallel ring transfers under
        prev_attention = False
        for k in kernels:
            t = self.kernel(k)
            if isinstance(k, Collective):
                if k.group in ("cp", "cp_p2p") and k.op == "p2p" and cover > 0:
                    # TE's ring: the next step's KV (and this step's dKV) move while the
                    # attention kernel before them computes
                    hidden = min(t, cover)
                    cover -= hidden
                    slow = self.network.compute_usage(k.group) * hidden
                    out.total += slow
                    out.compute += slow
                    t -= hidden
                self._comm(out, k, t)
            else:
                self._compute(out, k, t)
                if isinstance(k, (Gemm, GroupGemm)):
                    gemm += t
                elif isinstance(k, Attention):
                    # a ring step's kernels (one per packed document length) run back to back
                    cover = cover + t if prev_attention else t
            prev_attention = isinstance(k, Attention)
        if ub and out.comm.get("tp") and gemm > 0:
            # userbuffers' bulk overlap: the GEMMs on the SMs the TP kernels leave them, the
            # collectives under them (cost/userbuffers.py)
            extra = gemm * (userbuffers.margin_factor(self.compute.acc.sm_count) - 1.0)
            out.compute += extra
            out.total += extra
            hidden = min(out.comm["tp"], gemm + extra)
            out.comm["tp"] -= hidden
            out.total -= hidden
        return out

    def _userbuffers(self, kernels: tuple[Kernel, ...], method: str) -> PhaseTime:
        """A phase whose GEMM TE splits around its TP all-gather (ring exchange) or
        reduce-scatter (pipeline): cost/userbuffers.py."""
        out = PhaseTime()
        kind = "all_gather" if method == "ring" else "reduce_scatter"
        gemm = next(k for k in kernels if isinstance(k, Gemm))
        overlapped = [k for k in kernels if isinstance(k, Collective) and k.group == "tp" and k.op == kind]
        comm = sum(self.kernel(c) for c in overlapped)
        if method == "ring":
            both, exposed = userbuffers.ring_time(gemm, comm, self.network.groups["tp"].size, self.kernel)
        else:
            both, exposed = userbuffers.pipeline_time(gemm, comm, self.compute.acc.sm_count, self.kernel)
        for k in kernels:
            if k is gemm:
                self._compute(out, k, both - exposed)
            elif any(k is c for c in overlapped):
                continue
            elif isinstance(k, Collective):
                self._comm(out, k, self.kernel(k))
            else:
                self._compute(out, k, self.kernel(k))
        for c in overlapped:
            out.bytes += c.bytes
        out.total += exposed
        out.comm["tp"] = out.comm.get("tp", 0.0) + exposed
        return out

    @staticmethod
    def _comm(out: PhaseTime, c: Collective, t: float) -> None:
        out.total += t
        out.comm[c.group] = out.comm.get(c.group, 0.0) + t
        out.bytes += c.bytes

    @staticmethod
    def _compute(out: PhaseTime, k: Gemm | GroupGemm | Attention | MemBound, t: float) -> None:
        out.total += t
        out.flops += k.flops
        if isinstance(k, MemBound):
            out.membound += t
            out.bytes += k.bytes
        else:
            out.compute += t

    def op(self, o: Op) -> dict[str, PhaseTime]:
        """One PhaseTime per phase: fwd, bwd_input, bwd_weight, recompute (a checkpointed
        op's forward again: the same kernels, the same costs, computed once)."""
        te = bool(o.weight_shapes)  # a TE linear (graph/linears.py): userbuffers can take its TP collectives
        fwd = self.sequence(o.fwd, te)
        again = PhaseTime(fwd.total, fwd.compute, fwd.membound, dict(fwd.comm), fwd.flops, fwd.bytes) \
            if o.recompute_group else PhaseTime()
        return {"fwd": fwd, "bwd_input": self.sequence(o.bwd_input, te), "bwd_weight": self.sequence(o.bwd_weight, te),
                "recompute": again}


OpTime = tuple[Op, dict[str, PhaseTime]]
# ops (or what makes them: a layer's ops under its own names) and their times, in order
OpTimeSegment = tuple[list[Op] | Callable[[], list[Op]], list[dict[str, PhaseTime]]]


@dataclass(slots=True)
class StageTime:
    """One micro-batch on one stage (or one model chunk of it)."""

    fwd: PhaseTime
    bwd_input: PhaseTime
    bwd_weight: PhaseTime
    recompute: PhaseTime
    p2p: float  # one send of the activation (or its gradient) to a neighbour
    _segments: list[OpTimeSegment] = field(default_factory=list, repr=False)
    _op_times: list[OpTime] | None = field(default=None, repr=False)

    @property
    def op_times(self) -> list[OpTime]:
        """Each op with its times per phase, in order (traces, op tables), made on first
        use: a chunk's layers of one kind carry that kind's times under their own op names,
        which an estimate never needs to make."""
        if self._op_times is None:
            out: list[OpTime] = []
            for ops, phases in self._segments:
                out.extend(zip(ops() if callable(ops) else ops, phases, strict=True))
            self._op_times = out
        return self._op_times

    def phases(self) -> list[dict[str, PhaseTime]]:
        """The ops' per-phase times in order, without making the ops."""
        return [ph for _, phases in self._segments for ph in phases]

    def ends(self) -> tuple[list[dict[str, PhaseTime]], list[dict[str, PhaseTime]]]:
        """A model chunk's per-op times of its ops before its layers (embedding) and after
        them (head, loss): ``LayerProfiles.chunk_time`` adds them first and last."""
        return self._segments[0][1], self._segments[-1][1]

    def add_op_times(self, ops: list[Op] | Callable[[], list[Op]], phases: list[dict[str, PhaseTime]]) -> None:
        """Append ops (or a function making them) with their per-phase times."""
        self._segments.append((ops, phases))
        self._op_times = None

    @property
    def bwd(self) -> PhaseTime:
        """Input and weight gradients together (schedules that do not split them)."""
        out = PhaseTime()
        out.add(self.bwd_input)
        out.add(self.bwd_weight)
        return out

    @property
    def total(self) -> float:
        return self.fwd.total + self.bwd_input.total + self.bwd_weight.total + self.recompute.total

    def add(self, other: "StageTime", times: int = 1, op_times: bool = True) -> None:
        """Add ``other`` ``times`` times (its op times once per time, unless ``op_times`` is
        off: a caller naming them itself)."""
        for ph in PHASES:
            getattr(self, ph).add(getattr(other, ph), times)
        self.p2p = max(self.p2p, other.p2p)
        if op_times:
            self._segments.extend(other._segments * times)
            self._op_times = None

