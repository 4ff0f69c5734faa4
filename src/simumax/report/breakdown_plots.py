"""Memory per pipeline stage and time per part as pictures (matplotlib; PNG or SVG by
the path's suffix). Reads the typed results only: what is drawn is what is reported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simumax.report.figure import pyplot, save_figure, styled
from simumax.report.format import GIB
from simumax.report.results import CostResult, MemResult

MEMORY_PARTS = ("weights", "grads", "optimizer", "te_buffers", "activations", "transient")
COLOURS = {"weights": "#4c72b0", "grads": "#55a868", "optimizer": "#c44e52", "te_buffers": "#8172b2",
           "activations": "#ccb974", "transient": "#64b5cd"}


def memory_parts(mem: MemResult) -> list[dict[str, float]]:
    """Per stage, bytes by part; activations = the in-flight micro-batches' caches,
    transient = the rest of the peak (the walk's working set at the peak op)."""
    out = []
    for s in mem.stages:
        transient = max(0.0, s.peak_mem - s.model_mem - s.activation_mem)
        out.append({"weights": s.weights, "grads": s.grads, "optimizer": s.optimizer, "te_buffers": s.te_buffers,
                    "activations": s.activation_mem, "transient": transient})
    return out


def plot_memory(mem: MemResult, path: Path, title: str = "") -> None:
    save_figure(memory_figure(mem, title), path)


def plot_time(cost: CostResult, path: Path, title: str = "") -> None:
    save_figure(time_figure(cost, title), path)


@styled
def memory_figure(mem: MemResult, title: str = "") -> Any:
    """Stacked bars per stage: the parts of memory_parts, and the device's capacity."""
    plt = pyplot()
    parts = memory_parts(mem)
    fig, ax = plt.subplots(figsize=(max(6.5, 0.6 * len(parts) + 4.5), 4.5), dpi=110)
    bottom = [0.0] * len(parts)
    xs = list(range(len(parts)))
    for name in MEMORY_PARTS:
        vals = [p[name] / GIB for p in parts]
        if any(vals):
            ax.bar(xs, vals, bottom=bottom, label=name.replace("_", " "), color=COLOURS[name], width=0.7)
            bottom = [b + v for b, v in zip(bottom, vals)]
    cap = mem.capacity / GIB
    ax.axhline(cap, color="black", linestyle="--", linewidth=1, label="device memory")
    # a stage whose reserved peak does not fit: its tick label and bar edge in red
    over = [s.peak_mem_with_reserved > mem.capacity for s in mem.stages]
    for x, top, bad in zip(xs, bottom, over):
        if bad:
            ax.bar([x], [top], width=0.7, fill=False, edgecolor="red", linewidth=2)
    ax.set_xticks(xs, [f"{s.stage}\nOOM" if bad else str(s.stage) for s, bad in zip(mem.stages, over)])
    for label, bad in zip(ax.get_xticklabels(), over):
        if bad:
            label.set_color("red")
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB (peak allocated)")
    ax.set_title(title or "memory per pipeline stage")
    ax.set_ylim(0, max([cap, *bottom]) * 1.05)
    # the legend beside the axes: it never covers a bar or the device line
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


@styled
def time_figure(cost: CostResult, title: str = "") -> Any:
    """Horizontal bars: the critical rank's time per breakdown part."""
    plt = pyplot()
    items = [(k, v * 1e3) for k, v in cost.breakdown.items() if v > 0]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(items) + 1.5), dpi=110)
    names = [k.replace("_", " ") for k, _ in items][::-1]
    vals = [v for _, v in items][::-1]
    ax.barh(names, vals, color="#4c72b0")
    total = cost.duration_time_per_iter * 1e3
    for y, v in enumerate(vals):
        ax.text(v, y, f" {v:.1f} ms ({v / total:.0%})", va="center")
    ax.set_xlabel("ms per iteration (critical rank)")
    ax.set_xlim(0, max(vals) * 1.35 if vals else 1)
    ax.set_title(title or f"time breakdown: {total:.1f} ms per iteration, MFU {cost.mfu:.1%}")
    fig.tight_layout()
    return fig
