"""Power-limited clocks: how much slower tensor-core kernels run in a step than in a table
timed at full clock.

A GPU board holds its power under a limit (H100 SXM: 700 W). At full clock the tensor-core
kernels (GEMMs, attention) draw more than that and the memory-bound ones less (measured on
an H100: ~1.15x and ~0.80x the limit), so the limiter lowers the SM clock by the mix it
sees over a window of tens of milliseconds (the first ~30 ms of load run at full clock;
benchmarks/power_ramp.py). A GEMM back to back runs at 0.87 of its full-clock rate; one that
shares the device with memory-bound kernels half the time at 0.97 (benchmarks/
gemm_duty_cycle.py, docs/calibration.md "Power-limited clocks"). ``accelerator.power_curve``
holds that response as measured points (tensor-core share of the time, rate); each model
chunk's tensor-core time is scaled by the rate at its own share. Memory-bound kernels keep
their time: HBM bandwidth does not follow the SM clock (the copies ran at 3.0 TB/s at every
share).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from simumax.cost.stage_time import PhaseTime, StageTime
from simumax.graph.ops import PHASES


def _knots(points: list[list[float]]) -> list[tuple[float, float]]:
    """(0, 1) and the points, each rate no higher than the one before: measured noise is not
    a mechanism (a clock does not rise with the tensor-core share)."""
    out = [(0.0, 1.0)]
    for s, r in points:
        out.append((s, min(r, out[-1][1])))
    return out


def curve_rate(points: list[list[float]], share: float) -> float:
    """The tensor-core rate at ``share``: piecewise linear through the points from (0, 1),
    flat past the last."""
    knots = _knots(points)
    for (s0, r0), (s1, r1) in zip(knots, knots[1:]):
        if share <= s1:
            return r0 + (r1 - r0) * (share - s0) / (s1 - s0) if s1 > s0 else r1
    return knots[-1][1]


def throttle_rate(points: list[list[float]], compute: float, other: float) -> float:
    """The rate r at which ``compute`` seconds of full-clock tensor-core work run beside
    ``other`` seconds of the rest: the fixed point r = curve(s) with the share s taken at
    the slowed clock, compute / r over compute / r + other, as the curve was measured.

    On a segment where the curve is a + b·s, r = a + b·c / (c + r·o) is the quadratic
    o·r² + (c − a·o)·r − (a + b)·c = 0; the segment whose root puts s inside it is the one
    (unique: r − curve(s(r)) rises with r while the curve's slope is gentler than 4 times its
    lowest rate; measured slopes are under 0.4)."""
    knots = _knots(points)
    if compute <= 0:
        return 1.0
    if other <= 0:
        return knots[-1][1]
    c, o = compute, other
    for (s0, r0), (s1, r1) in zip(knots, knots[1:]):
        if s1 <= s0:
            continue
        b = (r1 - r0) / (s1 - s0)
        a = r0 - b * s0
        lin, q = c - a * o, (a + b) * c
        root = math.sqrt(lin * lin + 4.0 * o * q)
        # the positive root, in the form that does not cancel (o may be tiny beside c)
        r = 2.0 * q / (lin + root) if lin >= 0 else (root - lin) / (2.0 * o)
        if c / (c + r * o) <= s1 + 1e-12:
            return r
    return knots[-1][1]  # past the last point the curve is flat


def _tensor_seconds(t: StageTime) -> float:
    """A chunk's tensor-core (GEMM and attention) seconds over its passes."""
    return sum(getattr(t, ph).compute for ph in PHASES)


def _slowed(p: PhaseTime, f: float) -> PhaseTime:
    extra = (f - 1.0) * p.compute
    return PhaseTime(p.total + extra, p.compute + extra, p.membound, dict(p.comm), p.flops, p.bytes)


class _SlowedPhases(Sequence[dict[str, PhaseTime]]):
    """A layer kind's per-op phases at the slowed clock, made on first use: an estimate
    reads only the chunk's totals; traces, op tables and the simulator's slots read these."""

    def __init__(self, phases: Sequence[dict[str, PhaseTime]], f: float) -> None:
        self._src, self._f, self._made = phases, f, None

    def _all(self) -> list[dict[str, PhaseTime]]:
        if self._made is None:
            self._made = [{ph: _slowed(pt, self._f) for ph, pt in d.items()} for d in self._src]
        return self._made

    def __len__(self) -> int:
        return len(self._src)

    def __getitem__(self, i):  # type: ignore[override]
        return self._all()[i]

    def __iter__(self) -> Iterator[dict[str, PhaseTime]]:
        return iter(self._all())


def throttled(t: StageTime, points: list[list[float]]) -> StageTime:
    """``t`` with its tensor-core time at the rate its own mix allows (a new StageTime; the
    profile cache's is left as it is). The share is over the chunk's passes: compute over
    everything it spends. Exposed communication counts as the memory-bound copies the curve
    was measured beside; it draws less (NCCL kernels on few SMs, or idle), so the rate errs
    low there."""
    compute = _tensor_seconds(t)
    r = throttle_rate(points, compute, t.total - compute)
    if r >= 1.0:
        return t
    f = 1.0 / r
    out = StageTime(*(_slowed(getattr(t, ph), f) for ph in PHASES), t.p2p)
    done: dict[int, _SlowedPhases] = {}  # a layer kind's phase list is shared by its layers
    for ops, phases in t._segments:
        if id(phases) not in done:
            done[id(phases)] = _SlowedPhases(phases, f)
        out.add_op_times(ops, done[id(phases)])  # type: ignore[arg-type]
    return out


def stage_rates(chunks: list[StageTime], ranks: list[int], n_ranks: int, points: list[list[float]] | None) -> list[float]:
    """Per pipeline rank, the tensor-core rate its chunks run at (1 without a curve): each
    chunk's from its slowed times alone (at the fixed point the rate is the curve's at the
    slowed share), weighted by the chunk's tensor-core seconds."""
    if not points:
        return [1.0] * n_ranks
    seconds, weighted = [0.0] * n_ranks, [0.0] * n_ranks
    for t, r in zip(chunks, ranks):
        compute = _tensor_seconds(t)
        if compute > 0 and t.total > 0:
            seconds[r] += compute
            weighted[r] += compute * curve_rate(points, compute / t.total)
    return [w / s if s else 1.0 for w, s in zip(weighted, seconds)]
