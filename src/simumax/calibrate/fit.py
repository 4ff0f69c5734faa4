"""Turn timings into the system config's fields (pure Python, no torch).

Memory-bound families and collectives use the same α-β form as the cost model
(cost/efficiency.py, cost/network.py):

    t = x / (gbps * 1e9 * efficient_factor) + latency

with x the bytes the model charges (collectives: bytes * scale * (n + offset) / n). A
least-squares line through (x, t) gives slope 1 / (gbps * eff) and intercept latency.
gbps stays the datasheet (or base config) peak, so efficient_factor says what fraction of
it the kernels reach; a negative intercept (noise on tiny sizes) is clamped to 0 and the
slope refitted through the origin.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    seconds_per_byte: float
    latency: float  # seconds
    points: int
    max_rel_residual: float  # max |fit - measured| / measured over the points

    def efficiency(self, gbps: float) -> float:
        return 1.0 / (self.seconds_per_byte * gbps * 1e9)

    def predict(self, x: float) -> float:
        return x * self.seconds_per_byte + self.latency


def fit_alpha_beta(xs: list[float], ts: list[float]) -> AlphaBeta:
    """Least-squares t = latency + x * seconds_per_byte, latency >= 0, slope > 0."""
    if len(xs) != len(ts) or not xs:
        raise ValueError("need matching, non-empty sizes and times")
    if len(xs) == 1 or len(set(xs)) == 1:
        slope, lat = statistics.fmean(ts) / statistics.fmean(xs), 0.0
    else:
        mx, mt = statistics.fmean(xs), statistics.fmean(ts)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx
        lat = mt - slope * mx
        if lat < 0 or slope <= 0:
            lat = 0.0
            slope = sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs)
    slope = max(slope, 1e-30)
    res = max(abs(lat + slope * x - t) / t for x, t in zip(xs, ts) if t > 0) if any(t > 0 for t in ts) else 0.0
    return AlphaBeta(slope, lat, len(xs), res)


def ring_bytes(nbytes: float, n: int, scale: float, offset: float) -> float:
    """Bytes one rank moves in the cost model's collective formula."""
    return nbytes * scale * (n + offset) / n
