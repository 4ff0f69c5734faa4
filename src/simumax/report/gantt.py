"""Pipeline Gantt chart of a simulated iteration (matplotlib, PNG or SVG by suffix)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from simumax.report.figure import BAR_LABEL_SIZE, pyplot, save_figure, styled

if TYPE_CHECKING:
    from simumax.simulate.iteration import IterationRun

COLORS = {
    "F": "#4C78A8", "B": "#54A24B", "W": "#F58518", "p2p": "#9D9D9D", "optimizer": "#E45756",
    "grad_sync": "#B279A2", "param_gather": "#72B7B2", "wgrad": "#EECA3B",
}
LABELS = {
    "F": "forward", "B": "backward", "W": "weight grad", "p2p": "P2P send", "optimizer": "optimizer",
    "grad_sync": "grad reduce (comm)", "param_gather": "param gather (comm)", "wgrad": "deferred wgrad",
}


@styled
def plot_gantt(run: "IterationRun", path: Path, title: str) -> None:
    """The whole iteration; past 96 passes per rank (bars too thin to label) two more
    panels zoom on the warm-up and the cool-down, where the schedule's shape is, with each
    pass labelled by its micro-batch (and model chunk when ranks hold several)."""
    plt = pyplot()
    from matplotlib.patches import Patch

    ranks = len(run.events)
    total = run.total
    n_passes = max(sum(e.kind in ("F", "B", "W") for e in evs) for evs in run.events)
    zoom = n_passes > 96
    chunks = len({e.vstage for evs in run.events for e in evs if e.vstage >= 0}) > ranks
    panel_h = 1.0 + 0.55 * ranks
    windows = [(0.0, total, "whole iteration")]
    if zoom:
        span = total * 0.15
        windows += [(0.0, span, "warm-up (first 15 %)"), (total - span, total, "cool-down (last 15 %)")]
    fig, axes = plt.subplots(len(windows), 1, figsize=(14, panel_h * len(windows)), dpi=110, squeeze=False)
    used: set[str] = set()
    for ax, (t0, t1, name) in zip(axes[:, 0], windows):
        edge = 0.3 if (t1 - t0) < total or n_passes <= 400 else 0.0  # white separators only while bars are wide
        used |= _draw(ax, run, t0, t1, labels=not zoom or name != "whole iteration", chunks=chunks, edge=edge)
        ax.set_title(title if name == "whole iteration" else name)
    handles = [Patch(color=COLORS[k], label=LABELS[k]) for k in COLORS if k in used]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0.35 / (panel_h * len(windows)), 1, 1))
    save_figure(fig, path, path.suffix.lstrip(".") or "png")


def _draw(ax, run: "IterationRun", t0: float, t1: float, *, labels: bool, chunks: bool, edge: float) -> set[str]:
    """One panel: every pass and transfer overlapping [t0, t1] (seconds)."""
    ranks = len(run.events)
    used: set[str] = set()
    width = t1 - t0
    for r, events in enumerate(run.events):
        y = ranks - 1 - r
        bars: dict[tuple[str, bool], list[tuple[float, float]]] = {}  # one collection per colour: fast
        for e in events:
            if e.end < t0 or e.start > t1:
                continue
            comm = e.stream == "comm"
            bars.setdefault((e.kind, comm), []).append((e.start * 1e3, (e.end - e.start) * 1e3))
            if labels and not comm and e.mb >= 0 and (e.end - e.start) > width * 0.012:
                text = f"{e.mb}" + (f"/c{e.vstage // ranks}" if chunks and e.vstage >= 0 else "")
                ax.text((max(e.start, t0) + min(e.end, t1)) / 2 * 1e3, y + 0.19, text, ha="center", va="center",
                        fontsize=BAR_LABEL_SIZE, color="white", clip_on=True)
        for (kind, comm), spans in bars.items():
            used.add(kind)
            height, base = (0.25, y - 0.42) if comm else (0.62, y - 0.12)
            ax.broken_barh(spans, (base, height), facecolors=COLORS.get(kind, "#333333"), edgecolor="white", linewidth=edge)
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {ranks - 1 - y}" for y in range(ranks)])
    ax.set_xlabel("time (ms)")
    ax.set_xlim(t0 * 1e3, t1 * 1e3 * 1.01 if t0 == 0 else t1 * 1e3)
    return used
