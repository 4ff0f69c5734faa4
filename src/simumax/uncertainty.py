"""How sure a prediction is: an 80 % band around the point estimate, never moving it.

The width follows where the time came from. Every compute kernel's time is either looked up
in a measured efficiency table, fitted from the table's neighbours, or read off a default
curve (``cost/efficiency.py``); ``attribution`` sums the seconds of one micro-batch through
every model chunk by that source. The share not measured, u, sets the band in log space:

    ln(real / predicted) ~ Normal(a·u, (s0 + s1·u)²),   80 %: a·u ± 1.2816·(s0 + s1·u)

so a prediction from measured tables gets the narrow band the measured validation files
show, and a blind preset the wider, upward-shifted one the published runs show (blind
predictions have been fast). A kernel measured in a table but run at a size the configs do
not fix — an op that rests on a mechanism the model takes as an expectation
(``Op.approximate``: a dropless MoE's tokens per expert) —
counts as unmeasured: its seconds are a measured rate times a guessed size. a, s0, s1 are fitted by ``fit_band`` on the validation files
(``docs/make_uncertainty.py``; leave-one-source-out coverage in docs/validation.md); the
shipped values are ``TIME_BAND``. Memory gets a band of its own from the memory rows
(allocator fragmentation, NCCL and library buffers the walk does not see).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from simumax.estimate import Estimate

Z80 = 1.2815515655446004  # standard normal quantile of 0.9: a central 80 % interval


@dataclass(frozen=True, slots=True)
class BandParams:
    """ln(real / predicted) ~ Normal(a·u, (s0 + s1·u)²), u the unmeasured share."""

    a: float
    s0: float
    s1: float

    def interval(self, value: float, u: float = 0.0) -> tuple[float, float]:
        mu, sd = self.a * u, self.s0 + self.s1 * u
        return value * math.exp(mu - Z80 * sd), value * math.exp(mu + Z80 * sd)


# fitted on every validation file by docs/make_uncertainty.py (a test keeps them current)
TIME_BAND = BandParams(a=0.0407, s0=0.0325, s1=0.0291)
MEMORY_BAND = BandParams(a=0.0, s0=0.0154, s1=0.0)


def attribution(est: "Estimate") -> dict[str, float]:
    """Seconds of one micro-batch through every model chunk, by source: ``compute/measured``,
    ``compute/fitted``, ``compute/default`` (GEMM, grouped GEMM, attention), ``memory``
    (bandwidth-bound kernels), ``comm/measured`` and ``comm/default`` (collectives on a
    measured tier or one from a datasheet). Per estimate (Estimate.kernel_sources)."""
    out: dict[str, float] = defaultdict(float)
    for key, t in est.kernel_sources.seconds.items():
        fam, src = key.rsplit("/", 1)
        if fam.startswith("comm"):
            out[f"comm/{src}"] += t
        elif fam.startswith("memory"):
            out["memory"] += t
        else:
            out[f"compute/{src}"] += t
    return dict(out)


def compute_shares(attr: dict[str, float]) -> dict[str, float]:
    """Share of the compute-kernel seconds (GEMM, grouped GEMM, attention) per source:
    measured, fitted, default (all 0 when ``attr`` has none)."""
    parts = {src: attr.get(f"compute/{src}", 0.0) for src in ("measured", "fitted", "default")}
    whole = sum(parts.values())
    return {src: (t / whole if whole > 0 else 0.0) for src, t in parts.items()}


def approximated(est: "Estimate") -> dict[str, float]:
    """Compute and collective seconds of one micro-batch through every chunk whose sizes
    rest on a mechanism the configs do not fix, per mechanism (``Op.approximate``), and of
    those the seconds of measured kernels (key ``"<mechanism>/measured"``)."""
    out: dict[str, float] = defaultdict(float)
    for key, t in est.kernel_sources.approximate.items():
        mech, part = key.rsplit("/", 1)
        out[mech] += t
        if part != "other":
            out[f"{mech}/measured"] += t
    return dict(out)


def unmeasured_share(attr: dict[str, float], approx: dict[str, float] | None = None) -> float:
    """Share of the compute-kernel and collective seconds that nothing measured gave: no
    measured table entry, a network tier from a datasheet (issue 20: the band's width
    follows where the time came from), or a measured kernel at a size a mechanism the
    configs do not fix guessed (``approx``: ``approximated``'s seconds)."""
    total = sum(v for k, v in attr.items() if k.startswith(("compute/", "comm/")))
    measured = attr.get("compute/measured", 0.0) + attr.get("comm/measured", 0.0)
    if approx:
        measured -= sum(t for k, t in approx.items() if k.endswith("/measured"))
    return 0.0 if total <= 0 else 1.0 - measured / total


def band_share(est: "Estimate") -> float:
    """The u of an estimate's band: ``unmeasured_share`` with its approximate mechanisms; on
    a system whose kernel tables were timed on a sibling device (``accelerator.tables_from``),
    every kernel read from them counts as unmeasured too."""
    attr = attribution(est)
    sibling = bool(est.system.accelerator.tables_from)
    approx: dict[str, float] = defaultdict(float)
    for key, t in est.kernel_sources.approximate.items():
        mech, part = key.rsplit("/", 1)
        # with sibling tables every measured compute second goes below, each counted once
        if part == "comm" or (part == "compute" and not sibling):
            approx[f"{mech}/measured"] += t
    if sibling:
        approx["sibling_tables/measured"] = attr.get("compute/measured", 0.0)
    return unmeasured_share(attr, approx)


def fit_band(rows: Iterable[tuple[str, float, float]]) -> BandParams:
    """(source, u, ln(real/pred)) rows -> BandParams, with the spread between sources counted.

    Cases split into measured (u < 0.5) and blind (u >= 0.5). a is the mean over blind
    sources of each source's mean e / u (every source weighs the same, whatever its case
    count). At each level the variance is the pooled within-source variance plus the
    between-source one (the mean squared offset of each source's mean from a·u; pooled over
    both levels when a level has fewer than two sources; at the blind level times 1 + 1/n
    for the n sources a was estimated from): cases of one source share their software stack
    and cluster, so their errors move together and a band from case scatter alone would be
    too narrow for a new source. s0 is the measured level's sd, s1 the blind level's excess."""
    levels: dict[bool, dict[str, list[tuple[float, float]]]] = {False: {}, True: {}}
    for source, u, e in rows:
        levels[u >= 0.5].setdefault(source, []).append((u, e))
    blind = levels[True]
    a = sum(sum(e for _, e in pts) / sum(u for u, _ in pts) for pts in blind.values()) / len(blind) if blind else 0.0
    parts: dict[bool, tuple[float, float, int]] = {}
    for level, sources in levels.items():
        if not sources:
            continue
        means = {s: sum(e - a * u for u, e in pts) / len(pts) for s, pts in sources.items()}
        sq = [(e - a * u - means[s]) ** 2 for s, pts in sources.items() for u, e in pts]
        within = sum(sq) / max(1, len(sq) - len(sources))
        between = sum(m * m for m in means.values()) / len(means)
        parts[level] = (within, between, len(sources))
    pooled = sum(b for _, b, _ in parts.values()) / len(parts)
    sd = {}
    for lvl, (w, b, n) in parts.items():
        between = b if n >= 2 else max(b, pooled)
        if lvl:
            # the blind level's shift a is itself the mean of n sources' offsets: a new
            # source lies off the estimate by between-source variance x (1 + 1/n) (the
            # random-effects prediction interval); the measured level's mean is 0 by
            # construction, nothing estimated
            between *= 1.0 + 1.0 / n
        sd[lvl] = math.sqrt(w + between)
    s0 = sd.get(False, sd.get(True, 0.0))
    s1 = max(0.0, sd.get(True, s0) - s0)
    return BandParams(round(a, 4), round(s0, 4), round(s1, 4))


def leave_one_source_out(rows: list[tuple[str, float, float]]) -> dict[str, tuple[int, int]]:
    """Per source: (cases inside the 80 % band, cases), the band fitted on the other
    sources only; ``rows`` are (source, u, ln(real/pred))."""
    out = {}
    for held in sorted({s for s, _, _ in rows}):
        params = fit_band(r for r in rows if r[0] != held)
        test = [(u, e) for s, u, e in rows if s == held]
        out[held] = (sum(1 for u, e in test if _inside(params, u, e)), len(test))
    return out


def _inside(p: BandParams, u: float, e: float) -> bool:
    lo, hi = p.interval(1.0, u)
    return math.log(lo) <= e <= math.log(hi)
