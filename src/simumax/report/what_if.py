"""The table and the bar chart of ``simumax what-if`` (the estimates: simumax/what_if.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from simumax.report.figure import pyplot, save_figure, styled
from simumax.what_if import WhatIf


def table(rows: list[WhatIf], title: str) -> Table:
    t = Table(title=title)
    t.add_column("resource x{:g}".format(rows[0].factor) if rows else "resource")
    t.add_column("iteration (ms)", justify="right")
    t.add_column("change", justify="right")
    t.add_column("scales", overflow="fold")
    for w in rows:
        t.add_row(w.resource, f"{w.time * 1e3:.1f}", f"{w.change * 100:+.1f}%", w.fields)
    return t


@styled
def figure(rows: list[WhatIf], title: str) -> Any:
    """Horizontal bars: the iteration time each resource's scaling saves, most first."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 0.45 * len(rows) + 1.4), dpi=110)
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [-w.change * 100 for w in rows], color="tab:blue", height=0.6)
    ax.set_yticks(ys, [w.resource for w in rows])
    for y, w in zip(ys, rows):
        ax.annotate(f"{w.time * 1e3:.0f} ms", (max(-w.change * 100, 0.0), y), xytext=(3, 0), textcoords="offset points",
                    va="center")
    ax.set_xlim(0, max([-w.change * 100 for w in rows] + [1.0]) * 1.3)  # room for the labels
    ax.set_xlabel(f"iteration time saved with the resource x{rows[0].factor:g} (%)" if rows else "")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot(rows: list[WhatIf], path: Path, title: str) -> None:
    save_figure(figure(rows, title), path)
