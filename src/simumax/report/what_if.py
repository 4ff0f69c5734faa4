"""The table and the chart of ``simumax what-if`` (the estimates: simumax/what_if.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from simumax.report.figure import pyplot, save_figure, styled
from simumax.what_if import WhatIf


def _by_resource(rows: list[WhatIf]) -> tuple[list[float], dict[str, dict[float, WhatIf]]]:
    """The factors, and each resource's rows by factor, most gain at the largest factor first."""
    factors = sorted({w.factor for w in rows})
    by: dict[str, dict[float, WhatIf]] = {}
    for w in rows:
        by.setdefault(w.resource, {})[w.factor] = w
    order = sorted(by, key=lambda r: by[r][factors[-1]].time)
    return factors, {r: by[r] for r in order}


def table(rows: list[WhatIf], title: str) -> Table:
    """One row per resource: its iteration time and change at each factor."""
    factors, by = _by_resource(rows)
    t = Table(title=title)
    t.add_column("resource")
    for f in factors:
        t.add_column(f"x{f:g} (ms)", justify="right")
        t.add_column("change", justify="right")
    t.add_column("scales", overflow="fold")
    for resource, at in by.items():
        cells = [c for f in factors for c in (f"{at[f].time * 1e3:.1f}", f"{at[f].change * 100:+.1f}%")]
        t.add_row(resource, *cells, at[factors[0]].fields)
    return t


@styled
def figure(rows: list[WhatIf], title: str) -> Any:
    """One factor: horizontal bars of the iteration time each resource's scaling saves, most
    first; several: the time saved against the factor, a line per resource."""
    plt = pyplot()
    factors, by = _by_resource(rows)
    if len(factors) > 1:
        fig, ax = plt.subplots(figsize=(6.0, 4.0), dpi=110)
        for resource, at in by.items():
            ax.plot(factors, [-at[f].change * 100 for f in factors], marker="o", label=resource)
        ax.set_xscale("log", base=2)
        ax.set_xticks(factors, [f"x{f:g}" for f in factors])
        ax.set_xlabel("the resource made this many times better")
        ax.set_ylabel("iteration time saved (%)")
        ax.legend(loc="upper left")
        ax.set_title(title)
        fig.tight_layout()
        return fig
    rows = [at[factors[0]] for at in by.values()]
    fig, ax = plt.subplots(figsize=(6.0, 0.45 * len(rows) + 1.4), dpi=110)
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [-w.change * 100 for w in rows], color="tab:blue", height=0.6)
    ax.set_yticks(ys, [w.resource for w in rows])
    for y, w in zip(ys, rows):
        ax.annotate(f"{w.time * 1e3:.0f} ms", (max(-w.change * 100, 0.0), y), xytext=(3, 0), textcoords="offset points",
                    va="center")
    ax.set_xlim(0, max([-w.change * 100 for w in rows] + [1.0]) * 1.3)  # room for the labels
    ax.set_xlabel(f"iteration time saved with the resource x{factors[0]:g} (%)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def plot(rows: list[WhatIf], path: Path, title: str) -> None:
    save_figure(figure(rows, title), path)
