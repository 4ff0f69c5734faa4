"""The chart of ``simumax fit-runs`` (the fit: simumax/fit_runs.py): each run's predicted
time against its measured one, on the base system and left out of the fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simumax.fit_runs import FitResult
from simumax.report.figure import plain_log_x, pyplot, save_figure, styled


@styled
def figure(res: FitResult) -> Any:
    """Predicted / measured per run (log scale of the measured time): base system and
    left-out prediction, with the ±5 % band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6), dpi=110)
    xs = [r.measured for r in res.rows]
    ax.axhspan(-5, 5, color="0.92", zorder=0)
    ax.axhline(0, color="0.5", lw=0.8)
    before = [(r.before / r.measured - 1) * 100 for r in res.rows]
    left_out = [(r.loo / r.measured - 1) * 100 for r in res.rows]
    ax.vlines(xs, before, left_out, color="0.75", lw=0.8, zorder=1)  # each run: from the base to its fit
    ax.scatter(xs, before, marker="o", facecolors="none", edgecolors="0.45", label=f"{res.base}", zorder=2)
    ax.scatter(xs, left_out, marker="o", color="tab:blue", label="fitted on the other runs", zorder=3)
    plain_log_x(ax)
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted / measured − 1 (%)")
    ax.set_title(f"{len(res.rows)} runs: the base system and each run left out of the fit")
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def plot(res: FitResult, path: Path) -> None:
    save_figure(figure(res), path)
