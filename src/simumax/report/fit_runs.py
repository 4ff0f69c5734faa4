"""The chart of ``simumax fit-runs`` (the fit: simumax/fit_runs.py): each run's predicted
time against its measured one, on the base system and left out of the fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simumax.fit_runs import FitResult
from simumax.report.figure import pyplot, save_figure, styled, time_error_axes


@styled
def figure(res: FitResult) -> Any:
    """Predicted / measured per run (log scale of the measured time): base system and
    left-out prediction, with the ±5 % band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6), dpi=110)
    xs = [r.measured for r in res.rows]
    time_error_axes(ax)
    before = [(r.before / r.measured - 1) * 100 for r in res.rows]
    left_out = [(r.loo / r.measured - 1) * 100 for r in res.rows]
    ax.vlines(xs, before, left_out, color="0.75", lw=0.8, zorder=1)  # each run: from the base to its fit
    ax.scatter(xs, before, marker="o", facecolors="none", edgecolors="0.45", label=f"{res.base}", zorder=2)
    ax.scatter(xs, left_out, marker="o", color="tab:blue", label="fitted on the other runs", zorder=3)
    ax.set_title(f"{len(res.rows)} runs: the base system and each run left out of the fit")
    ax.legend(loc="best")
    fig.tight_layout()
    return fig


def plot(res: FitResult, path: Path) -> None:
    save_figure(figure(res), path)
