"""Timed collectives as points, and the cost model's line through them (pure Python, no
torch): what ``simumax calibrate-comm`` measures under torchrun and what ``simumax import
nccl-tests`` reads from nccl-tests' output, fitted alike (calibrate/system_writer.py
``merge_collectives`` writes the fits into a tier)."""

from __future__ import annotations

from dataclasses import dataclass

from simumax.calibrate.fit import AlphaBeta, fit_alpha_beta
from simumax.cost.network import DEFAULT_SPECS, ring_bytes

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all2all", "p2p")


@dataclass(frozen=True, slots=True)
class CommPoint:
    op: str
    group_size: int
    nbytes: int  # the cost model's logical buffer (kernels.Collective.bytes; nccl-tests' "size")
    seconds: float


def _fit(op: str, pts: list[CommPoint]) -> AlphaBeta:
    """The cost model's line through the points: seconds against ring bytes."""
    spec = DEFAULT_SPECS[op]
    return fit_alpha_beta([ring_bytes(p.nbytes, p.group_size, spec.scale, spec.offset) for p in pts], [p.seconds for p in pts])


def fit_points(points: list[CommPoint]) -> dict[str, AlphaBeta]:
    """One α-β line per op over all group sizes (the config has one entry per op and tier)."""
    return {op: _fit(op, pts) for op in OPS if (pts := [p for p in points if p.op == op])}


def fit_points_by_size(points: list[CommPoint]) -> dict[str, dict[int, AlphaBeta]]:
    """One α-β line per op and group size."""
    sizes: dict[str, dict[int, list[CommPoint]]] = {}
    for p in points:
        sizes.setdefault(p.op, {}).setdefault(p.group_size, []).append(p)
    return {op: {n: _fit(op, by_n[n]) for n in sorted(by_n)} for op, by_n in sizes.items()}


def points_report(points: list[CommPoint]) -> dict:
    """The points and per-size fits as the calibration reports write them."""
    return {
        "points": [{"op": p.op, "group_size": p.group_size, "bytes": p.nbytes, "seconds": p.seconds} for p in points],
        "fits_by_group_size": {op: {str(n): {"seconds_per_byte": f.seconds_per_byte, "latency": f.latency,
                                             "max_rel_residual": f.max_rel_residual} for n, f in by.items()}
                               for op, by in fit_points_by_size(points).items()},
    }
