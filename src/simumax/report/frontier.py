"""Search results as a scatter of throughput against peak memory, with the Pareto frontier
(no other fitting strategy is both faster and lighter). matplotlib; PNG or SVG by suffix."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from simumax.report.figure import pyplot, save_figure, styled
from simumax.report.format import GIB

if TYPE_CHECKING:
    from simumax.search.evaluate import SearchRow



def pareto_frontier(rows: Sequence["SearchRow"]) -> list["SearchRow"]:
    """Fitting rows not dominated in (less peak memory, more tokens/s/GPU), by memory."""
    fit = sorted((r for r in rows if r.fits), key=lambda r: (r.peak_mem, -(r.tokens_per_s_per_gpu or 0.0)))
    out: list[SearchRow] = []
    best = -1.0
    for r in fit:
        tput = r.tokens_per_s_per_gpu or 0.0
        if tput > best:
            out.append(r)
            best = tput
    return out


@styled
def plot_frontier(rows: Sequence["SearchRow"], path: Path, capacity: float, title: str) -> None:
    plt = pyplot()
    fit = [r for r in rows if r.fits]
    front = pareto_frontier(rows)
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    kinds = sorted({r.recompute for r in fit})
    for i, kind in enumerate(kinds):
        sel = [r for r in fit if r.recompute == kind]
        ax.scatter([r.peak_mem / GIB for r in sel], [r.tokens_per_s_per_gpu for r in sel], s=14, alpha=0.6,
                   color=plt.cm.tab10(i % 10), label=f"recompute {kind}")
    if front:
        ax.step([r.peak_mem / GIB for r in front], [r.tokens_per_s_per_gpu for r in front], where="post", color="black",
                linewidth=1.2, label="frontier")
        best = max(fit, key=lambda r: r.tokens_per_s_per_gpu or 0.0)
        ax.scatter([best.peak_mem / GIB], [best.tokens_per_s_per_gpu], marker="*", s=160, color="black", zorder=3)
        ax.text(0.01, 0.98, f"fastest: {best.label}", transform=ax.transAxes, va="top")
    ax.axvline(capacity / GIB, color="#E45756", linestyle="--", linewidth=1, label="memory budget")
    ax.set_xlabel("peak memory per GPU (GiB, max over stages)")
    ax.set_ylabel("tokens / s / GPU")
    ax.set_title(f"{title}: {len(fit)} of {len(rows)} strategies fit")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)
