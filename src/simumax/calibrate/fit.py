"""Turn timings into the system config's fields (pure Python, no torch).

Memory-bound families and collectives use the same α-β form as the cost model
(cost/efficiency.py, cost/network.py):

    t = x / (gbps * 1e9 * efficient_factor) + latency

with x the bytes the model charges (collectives: bytes * scale * (n + offset) / n). A
line through (x, t), each point weighted by 1/t, gives slope 1 / (gbps * eff) and intercept
latency.
gbps stays the datasheet (or base config) peak, so efficient_factor says what fraction of
it the kernels reach.
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
    """Weighted least squares for t = latency + x * seconds_per_byte (latency >= 0, slope >
    0), each point weighted by 1/t: its squared error relative to the time it carries.

    An estimate sums kernel times, so a kernel of 400 µs must not be missed by 15 % to fit
    one of 7 µs within 1 %; but small kernels still pin the latency. Relative error alone
    (weights 1/t²) let the many kernels that fit in L2 (flat at ~6.5 µs below 33 MB on an
    H100) bend the line: 3.8 TB/s, above the 3.35 TB/s HBM, 13–17 % under every measured
    kernel of 100 MB – 1.2 GB and 16 % under the sum of the points; weighted by 1/t the same
    points give 3.16 TB/s and 4.2 µs, within 4 % above 100 MB (most within 2 %) and 1 % on the sum
    (docs/calibration.md)."""
    if len(xs) != len(ts) or not xs or min(ts) <= 0:
        raise ValueError("need matching, non-empty sizes and positive times")
    w = [1.0 / t for t in ts]
    if len(set(xs)) == 1:
        slope, lat = statistics.fmean(ts) / statistics.fmean(xs), 0.0
    else:
        sw = sum(w)
        mx = sum(wi * x for wi, x in zip(w, xs)) / sw
        mt = sum(wi * t for wi, t in zip(w, ts)) / sw
        sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
        slope = sum(wi * (x - mx) * (t - mt) for wi, x, t in zip(w, xs, ts)) / sxx
        lat = mt - slope * mx
        if lat < 0 or slope <= 0:  # noise on tiny sizes: a line through the origin
            lat = 0.0
            slope = sum(wi * x * t for wi, x, t in zip(w, xs, ts)) / sum(wi * x * x for wi, x in zip(w, xs))
    slope = max(slope, 1e-30)
    res = max(abs(lat + slope * x - t) / t for x, t in zip(xs, ts))
    return AlphaBeta(slope, lat, len(xs), res)
