"""Where a time error lives: per micro-batch or per iteration.

An iteration's time is, to a good approximation, a fixed part (the pipeline's fill and drain,
the data-parallel collectives left exposed, the optimizer step) plus one steady-state
micro-batch time per micro-batch. Runs of one job that differ only in the micro-batch count
(and with it the data-parallel size, as in a strong-scaling table) separate the two: a least
squares line through (micro-batches, time) gives the per-micro-batch time as its slope and the
fixed time as its intercept, for the measured and for the predicted times alike. A prediction
whose slope agrees but whose intercept does not misses a per-iteration cost (a bubble, an
exposed collective); one whose slope is off misses something in every micro-batch.
``simumax validate`` reports it for every such group of cases (docs/validation.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simumax.validate import CaseResult

# strategy fields that may differ inside a group: the micro-batch count, and the GPU count
# (hence the data-parallel size) that a strong-scaling table changes with it
_FREE_FIELDS = ("micro_batch_num", "world_size")


def step_group(case: dict[str, Any]) -> str:
    """The job a case runs with its micro-batch count and GPU count left out: model (with
    its overrides), system and every other strategy field."""
    st = {k: v for k, v in (case.get("strategy") or {}).items() if k not in _FREE_FIELDS}
    return json.dumps([case.get("model"), case.get("model_overrides") or {}, case.get("system"), st], sort_keys=True)


@dataclass(frozen=True, slots=True)
class Line:
    """time = fixed + per_micro_batch x micro-batches, least squares (seconds)."""

    fixed: float
    per_micro_batch: float
    max_residual: float  # largest |time - line| / time over the points

    def at(self, micro_batches: float) -> float:
        return self.fixed + self.per_micro_batch * micro_batches


def fit_line(xs: list[float], ys: list[float]) -> Line:
    """Least squares line through (xs, ys); needs two distinct xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a line needs two distinct micro-batch counts")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    fixed = my - slope * mx
    resid = max(abs(y - (fixed + slope * x)) / y for x, y in zip(xs, ys))
    return Line(fixed, slope, resid)


def step_split(results: list[CaseResult]) -> list[dict[str, Any]]:
    """One row per group of timed cases that share everything but the micro-batch and GPU
    counts and hold at least two micro-batch counts: the measured and predicted lines, the
    per-micro-batch error (predicted slope over measured, minus 1) and the fixed-time
    difference (predicted minus measured intercept, seconds)."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        if r.time_error is not None and r.micro_batches > 0 and r.step_group:
            groups.setdefault(r.step_group, []).append(r)
    rows = []
    for rs in groups.values():
        xs = [float(r.micro_batches) for r in rs]
        if len(set(xs)) < 2:
            continue
        real = fit_line(xs, [r.measured_time for r in rs])  # type: ignore[misc]
        pred = fit_line(xs, [r.predicted_time for r in rs])  # type: ignore[misc]
        rows.append({
            "cases": [r.id for r in rs],
            "micro_batches": sorted(set(r.micro_batches for r in rs)),
            "real": {"fixed": real.fixed, "per_micro_batch": real.per_micro_batch, "max_residual": real.max_residual},
            "predicted": {"fixed": pred.fixed, "per_micro_batch": pred.per_micro_batch, "max_residual": pred.max_residual},
            "per_micro_batch_error": pred.per_micro_batch / real.per_micro_batch - 1.0 if real.per_micro_batch > 0 else None,
            "fixed_difference": pred.fixed - real.fixed,
        })
    return sorted(rows, key=lambda g: g["cases"][0])
