"""A system fitted to measured runs of the user's own cluster (``simumax fit-runs``).

Most users have no kernel tables for their cluster but do have a few real iteration times
(a smoke run, last month's job). This fits the resources of a base system — how fast its
tensor cores, HBM, scale-up and scale-out links really run there — to those times, and
writes the system back, so every later estimate, search and what-if on it starts from the
user's own measurements. Nothing here changes a shipped preset.

Model. Each resource r gets a factor f_r (1: as the base says; > 1: the cluster is faster
there), applied as ``what_if`` applies it, except the tensor cores: their *efficiencies*
scale (every compute family's ``efficient_factor`` and table entries), not their peaks, so
MFU still counts against the datasheet. With θ_r = ln f_r, the fit is the maximum a
posteriori estimate of

    ln T_i(θ) = ln t_i + ε_i,   ε_i ~ N(0, noise_sd²),   θ_r ~ N(0, prior_sd²)

over the runs i (t_i measured), solved by Gauss-Newton with the Jacobian
∂ln T_i/∂θ_r taken by finite differences (each resource x1.1 in turn). The prior keeps a
resource the runs cannot see (no run crosses nodes: scale-out) at the base's value and
shrinks resources the runs confound (tensor cores and HBM both set a dense step's time);
``sd`` reports the posterior spread of each factor, so the user sees which ones the runs
pinned down. Defaults: noise_sd 0.04 — what is left of a run's time once its hardware is
right, the scatter of the measured-table validation files (mean |error| 2.4-2.7 %, max 7 %);
prior_sd 0.2 — how far a preset's resources may be from a cluster (presets miss published
runs by up to 10-20 %, issue 20).

Leave-one-out: each run predicted from a fit on the others, linearised at the full fit
(one Gauss-Newton step from it: exact for a model linear in θ, which ln T nearly is over
±20 %), is the error a user should expect on a run the fit has not seen.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simumax.config.loader import load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import MAX_EFFICIENCY, SystemConfig
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.validate import case_model_strategy, case_system, default_reference_root, load_cases, measured_seconds
from simumax.what_if import RESOURCES, Dump, Resource, scaled_by

NOISE_SD = 0.04
PRIOR_SD = 0.2
FITTED_SUFFIX = r" fitted to \d+ runs$"
STEP = math.log(1.1)  # finite-difference step of the Jacobian
FACTOR_RANGE = (1 / 3, 3.0)  # a fitted factor stays within it (beyond: the base is not this cluster's)


def _efficiencies(d: Dump, f: float) -> None:
    """Every compute family's efficiencies x f (peaks kept); 0 (none: the bf16 family's) stays 0."""
    for spec in d["accelerator"]["op"].values():
        spec["efficient_factor"] = min(MAX_EFFICIENCY, spec["efficient_factor"] * f)
        spec["accurate_efficient_factor"] = {k: min(MAX_EFFICIENCY, v * f) for k, v in spec["accurate_efficient_factor"].items()}


def _fit_resources() -> dict[str, Resource]:
    """Tensor cores as efficiencies; the rest as ``simumax what-if`` scales them."""
    by_name = {r.name: r for r in RESOURCES}
    out = {"compute": Resource("tensor cores", "accelerator.op.*: efficient_factor and table entries", _efficiencies)}
    for key, name in (("hbm", "HBM bandwidth"), ("scale_up", "scale-up links"), ("scale_out", "scale-out links"),
                      ("latency", "latencies"), ("host", "host CPU")):
        out[key] = by_name[name]
    return out


FIT_RESOURCES = _fit_resources()
DEFAULT_RESOURCES = ("compute", "hbm", "scale_up", "scale_out")


@dataclass(frozen=True)
class Run:
    id: str
    model: ModelConfig
    strategy: StrategyConfig
    seconds: float  # measured iteration time


@dataclass(frozen=True)
class RunRow:
    id: str
    measured: float  # s
    before: float  # s, on the base system
    after: float  # s, on the fitted system
    loo: float  # s, predicted by a fit on the other runs

    def to_dict(self) -> dict[str, Any]:
        err = lambda t: t / self.measured - 1.0  # noqa: E731
        return {"id": self.id, "measured": self.measured, "before": self.before, "after": self.after, "loo": self.loo,
                "error_before": err(self.before), "error_after": err(self.after), "error_loo": err(self.loo)}


@dataclass(frozen=True)
class FitResult:
    base: str
    resources: tuple[str, ...]
    factors: dict[str, float]  # per resource key: x its base value (tensor cores: x its efficiencies)
    sd: dict[str, float]  # posterior standard deviation of ln factor
    rows: list[RunRow]
    system: SystemConfig
    iterations: int
    noise_sd: float = NOISE_SD
    prior_sd: float = PRIOR_SD
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base, "noise_sd": self.noise_sd, "prior_sd": self.prior_sd, "iterations": self.iterations,
            "resources": [{"key": k, "name": FIT_RESOURCES[k].name, "fields": FIT_RESOURCES[k].fields,
                           "factor": self.factors[k], "sd_log": self.sd[k]} for k in self.resources],
            "runs": [r.to_dict() for r in self.rows], "notes": self.notes,
        }


def runs_from_file(path: str | Path, reference_root: str | Path | None = None) -> tuple[list[Run], list[Any]]:
    """The runs of a case file (the validation schema: shared/validation/README.md; config
    paths relative to ``reference_root``, by default as ``simumax validate`` reads them) that
    give an ``iter_time_ms`` (or a ``tflops_per_gpu``, read as validate reads it), and the
    system each names."""
    p = Path(path)
    root = Path(reference_root) if reference_root else default_reference_root(p)
    runs, systems = [], []
    for case in load_cases(p):
        measured = case.get("measured") or {}
        if measured.get("iter_time_ms") is None and not measured.get("tflops_per_gpu"):
            continue
        try:
            model, strategy = case_model_strategy(case, root)
            # a time given as TFLOP/s per GPU (SimuMax's FLOP convention: the model's, whatever the system)
            seconds = measured_seconds(measured) or measured_seconds(
                measured, Estimate(model, strategy, load_system(case_system(case, root))))
        except ConfigError as exc:  # say which run
            raise ConfigError(exc.field, exc.rule, f"{p}: run {case['id']}" + (f" ({exc.source})" if exc.source else "")) from None
        runs.append(Run(str(case["id"]), model, strategy, float(seconds or 0.0)))
        systems.append(case_system(case, root))
    if not runs:
        raise ConfigError("measured.iter_time_ms", "no run of the file gives one (or tflops_per_gpu): nothing to fit", str(p))
    return runs, systems


def scaled(system: SystemConfig, factors: dict[str, float], name: str | None = None) -> SystemConfig:
    """A copy of ``system`` with each resource (by key) x its factor (``name``: the copy's sys_name)."""
    return scaled_by(system, ((FIT_RESOURCES[k], f) for k, f in factors.items()), system.source or system.sys_name, name)


def _times(runs: list[Run], system: SystemConfig) -> list[float]:
    out = []
    for r in runs:
        try:
            out.append(Estimate(r.model, r.strategy, system).cost(band=False).duration_time_per_iter)
        except ConfigError as exc:  # say which run
            raise ConfigError(exc.field, exc.rule, f"run {r.id}" + (f" ({exc.source})" if exc.source else "")) from None
    return out


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """a x = b, a symmetric positive definite (Gauss-Jordan with partial pivoting)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                k = m[r][c] / m[c][c]
                m[r] = [x - k * y for x, y in zip(m[r], m[c])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _normal(jac: list[list[float]], rows: list[int], noise_sd: float, prior_sd: float) -> list[list[float]]:
    """JᵀJ / noise² + I / prior² over the runs ``rows``."""
    n = len(jac[0])
    return [[sum(jac[i][a] * jac[i][b] for i in rows) / noise_sd**2 + (1 / prior_sd**2 if a == b else 0.0)
             for b in range(n)] for a in range(n)]


def _map_step(jac: list[list[float]], resid: list[float], theta: list[float], rows: list[int],
              noise_sd: float, prior_sd: float) -> list[float]:
    """The Gauss-Newton step δ from θ over the runs ``rows`` (resid: ln measured − ln predicted at θ)."""
    n = len(theta)
    rhs = [sum(jac[i][a] * resid[i] for i in rows) / noise_sd**2 - theta[a] / prior_sd**2 for a in range(n)]
    return _solve(_normal(jac, rows, noise_sd, prior_sd), rhs)


def fit_system(runs: list[Run], base: SystemConfig, resources: tuple[str, ...] = DEFAULT_RESOURCES,
               noise_sd: float = NOISE_SD, prior_sd: float = PRIOR_SD, max_iter: int = 8) -> FitResult:
    """Fit ``resources`` of ``base`` to ``runs`` (module docstring)."""
    unknown = [k for k in resources if k not in FIT_RESOURCES]
    if unknown or not resources:
        raise ConfigError("resources", f"choose from {', '.join(FIT_RESOURCES)} (got {', '.join(unknown) or 'none'})")
    if not (0 < noise_sd <= 1 and 0 < prior_sd <= 2):
        raise ConfigError("noise_sd / prior_sd", "must lie in (0, 1] and (0, 2] (spreads of ln time and ln factor)")
    keys = tuple(dict.fromkeys(resources))
    y = [math.log(r.seconds) for r in runs]
    lo, hi = (math.log(x) for x in FACTOR_RANGE)
    every = list(range(len(runs)))

    def evaluate(theta: list[float]) -> tuple[list[float], list[list[float]]]:
        """ln T of every run at θ, and its Jacobian (each resource x1.1 in turn)."""
        at = dict(zip(keys, (math.exp(t) for t in theta)))
        g = [math.log(t) for t in _times(runs, scaled(base, at))]
        jac = [[0.0] * len(keys) for _ in runs]
        for a, k in enumerate(keys):
            for i, t in enumerate(_times(runs, scaled(base, {**at, k: at[k] * math.exp(STEP)}))):
                jac[i][a] = (math.log(t) - g[i]) / STEP
        return g, jac

    theta = [0.0] * len(keys)
    g, jac = evaluate(theta)
    base_times = [math.exp(x) for x in g]
    iterations = 0
    while iterations < max_iter:
        step = _map_step(jac, [yi - gi for yi, gi in zip(y, g)], theta, every, noise_sd, prior_sd)
        new = [min(hi, max(lo, t + d)) for t, d in zip(theta, step)]
        moved = max(abs(a - b) for a, b in zip(new, theta))
        theta = new
        iterations += 1
        g, jac = evaluate(theta)
        if moved < 1e-4:
            break
    notes: list[str] = []
    for a, k in enumerate(keys):
        if theta[a] in (lo, hi):
            notes.append(f"{FIT_RESOURCES[k].name}: the fit hit its bound (x{math.exp(theta[a]):.3g}); the base system "
                         "may not describe this cluster")
        if all(abs(jac[i][a]) < 1e-3 for i in every):
            notes.append(f"{FIT_RESOURCES[k].name}: no run depends on it; kept at the base's value")
    if "compute" in keys:
        top = max((v for spec in base.accelerator.op.values() for v in (spec.efficient_factor, *spec.accurate_efficient_factor.values())),
                  default=0.0)
        if top * math.exp(theta[keys.index("compute")]) > MAX_EFFICIENCY:
            notes.append(f"tensor cores: efficiencies above {MAX_EFFICIENCY} were capped there, so the fastest kernels "
                         "gained less than the factor")
    cov = _inverse(_normal(jac, every, noise_sd, prior_sd))
    resid = [yi - gi for yi, gi in zip(y, g)]
    loo = []
    for i in every:
        others = [k for k in every if k != i]
        d = _map_step(jac, resid, theta, others, noise_sd, prior_sd)
        loo.append(math.exp(g[i] + sum(jac[i][a] * d[a] for a in range(len(keys)))))
    factors = {k: math.exp(t) for k, t in zip(keys, theta)}
    # a base fitted before keeps its own name: the new fit replaces the old one's suffix
    fitted = scaled(base, factors, name=f"{re.sub(FITTED_SUFFIX, '', base.sys_name)} fitted to {len(runs)} runs")
    rows = [RunRow(r.id, r.seconds, b, math.exp(t), l) for r, b, t, l in zip(runs, base_times, g, loo)]
    return FitResult(base.sys_name, keys, factors, {k: math.sqrt(cov[a][a]) for a, k in enumerate(keys)}, rows, fitted,
                     iterations, noise_sd, prior_sd, notes)


def _inverse(a: list[list[float]]) -> list[list[float]]:
    n = len(a)
    cols = [_solve(a, [1.0 if r == c else 0.0 for r in range(n)]) for c in range(n)]
    return [[cols[c][r] for c in range(n)] for r in range(n)]


def fit_file(path: str | Path, system: str | Path | SystemConfig | None = None,
             reference_root: str | Path | None = None, **kw: Any) -> FitResult:
    """``fit_system`` on a case file's runs; ``system``: the base (default: the one system
    its runs name)."""
    runs, named = runs_from_file(path, reference_root)
    if system is None:
        # a preset name, a file, or a system given inline (compared by its content)
        distinct = {json.dumps(s, sort_keys=True) if isinstance(s, dict) else str(s): s for s in named}
        if len(distinct) != 1:
            shown = ", ".join(k if len(k) < 60 else k[:57] + "..." for k in sorted(distinct))
            raise ConfigError("system", f"the runs name {len(distinct)} systems ({shown}): fit one cluster at a time, "
                              "or give the base system (--system)", str(path))
        system = next(iter(distinct.values()))
    return fit_system(runs, load_system(system), **kw)
