"""Several strategies of one model on one system side by side: time, MFU, tokens/s, memory
per stage, and each breakdown part's difference from the first (``simumax compare``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from simumax.report.figure import pyplot, save_figure, styled
from simumax.report.format import GIB, ms
from simumax.report.results import CostResult, MemResult


@dataclass(frozen=True)
class Compared:
    label: str
    cost: CostResult
    mem: MemResult
    gbs: int  # global batch, sequences


def parts(rows: list[Compared]) -> list[str]:
    """Breakdown parts any of the strategies has, in first-seen order."""
    out: list[str] = []
    for r in rows:
        out += [k for k in r.cost.breakdown if k not in out]
    return out


def to_dict(rows: list[Compared]) -> dict[str, Any]:
    base = rows[0].cost.breakdown
    return {
        "strategies": [
            {"label": r.label, "global_batch_size": r.gbs, "cost": r.cost.to_dict(), "mem": r.mem.to_dict(),
             "breakdown_delta": {k: r.cost.breakdown.get(k, 0.0) - base.get(k, 0.0) for k in parts(rows)}}
            for r in rows
        ]
    }


def table(rows: list[Compared]) -> Table:
    t = Table(title=f"compared with {rows[0].label}")
    t.add_column("")
    for r in rows:
        t.add_column(r.label, justify="right")
    first = rows[0]
    delta = lambda v, b, f: f if v == b else f"{f} ({(v - b) / b:+.1%})" if b else f  # noqa: E731
    t.add_row("iteration time (ms)", *(delta(r.cost.duration_time_per_iter, first.cost.duration_time_per_iter,
                                             ms(r.cost.duration_time_per_iter)) for r in rows))
    t.add_row("global batch (sequences)", *(str(r.gbs) for r in rows))
    t.add_row("MFU", *(f"{r.cost.mfu:.1%}" for r in rows))
    t.add_row("tokens/s per GPU", *(f"{r.cost.throughput_per_accelerator:.0f}" for r in rows))
    t.add_row("peak allocated GiB (max stage)", *(f"{r.mem.peak_mem / GIB:.2f}" + ("" if r.mem.fits else " (does not fit)") for r in rows))
    t.add_row("peak allocated GiB per stage", *(" ".join(f"{s.peak_mem / GIB:.1f}" for s in r.mem.stages) for r in rows))
    for part in parts(rows):
        b = first.cost.breakdown.get(part, 0.0)
        cells = []
        for r in rows:
            v = r.cost.breakdown.get(part, 0.0)
            cells.append(ms(v) if r is first else f"{ms(v)} ({(v - b) * 1e3:+.1f})")
        t.add_row(f"{part} (ms)", *cells)
    return t


@styled
def figure(rows: list[Compared]) -> Any:
    """Stacked bars: each strategy's critical-rank time by breakdown part."""
    plt = pyplot()
    names = parts(rows)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(rows) + 3), 4.5), dpi=110)
    bottom = [0.0] * len(rows)
    xs = list(range(len(rows)))
    cmap = plt.get_cmap("tab20")
    for i, part in enumerate(names):
        vals = [r.cost.breakdown.get(part, 0.0) * 1e3 for r in rows]
        if any(vals):
            ax.bar(xs, vals, bottom=bottom, label=part.replace("_", " "), color=cmap(i % 20), width=0.6)
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(xs, [r.label for r in rows], rotation=15, ha="right")
    ax.set_ylabel("ms per iteration (critical rank)")
    ax.set_title("time by part")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def plot(rows: list[Compared], path: Path) -> None:
    save_figure(figure(rows), path)
