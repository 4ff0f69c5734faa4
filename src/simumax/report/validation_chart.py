"""The chart of ``simumax validate --out``: each run's time error with its 80 % band,
against the measured time, a colour per source (the cases: simumax/validate.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simumax.report.figure import pyplot, save_figure, styled, time_error_axes
from simumax.validate import CaseResult


@styled
def figure(results: list[CaseResult], title: str) -> Any:
    """predicted / measured − 1 per timed case, the band as a bar (where the measurement
    would have to lie for the band to hold it), ±5 % shaded."""
    plt = pyplot()
    timed = [r for r in results if r.time_error is not None]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=110)
    time_error_axes(ax)
    sources = sorted({r.source for r in timed})
    for i, src in enumerate(sources):
        rows = [r for r in timed if r.source == src]
        xs = [r.measured_time for r in rows]
        ys = [r.time_error * 100 for r in rows]  # type: ignore[operator]
        color = f"C{i % 10}"
        for r, x in zip(rows, xs):
            if r.time_band is not None and r.predicted_time:
                # the band holds the measurement when pred/real - 1 lies in [pred/high - 1, pred/low - 1]
                lo, hi = (r.predicted_time / r.time_band[1] - 1) * 100, (r.predicted_time / r.time_band[0] - 1) * 100
                ax.vlines(x, lo, hi, color=color, alpha=0.35, lw=2.5, zorder=1)
        ax.scatter(xs, ys, color=color, s=14, zorder=2, label=src or "runs")
    ax.set_title(title)
    if len(sources) > 1:
        ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    return fig


def plot(results: list[CaseResult], path: Path, title: str) -> None:
    save_figure(figure(results, title), path)
