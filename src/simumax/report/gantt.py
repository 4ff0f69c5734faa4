"""Pipeline Gantt chart of a simulated iteration (matplotlib, PNG or SVG by suffix)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from simumax.report.figure import pyplot, save_figure

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


def plot_gantt(run: "IterationRun", path: Path, title: str) -> None:
    plt = pyplot()
    from matplotlib.patches import Patch

    ranks = len(run.events)
    total = run.total
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.55 * ranks), dpi=110)
    n_passes = max(sum(e.kind in ("F", "B", "W") for e in evs) for evs in run.events)
    label_mbs = n_passes <= 96
    used = set()
    edge = 0.3 if n_passes <= 400 else 0.0  # thin white separators only while bars are wide
    for r, events in enumerate(run.events):
        y = ranks - 1 - r
        bars: dict[tuple[str, bool], list[tuple[float, float]]] = {}  # one collection per colour: fast
        for e in events:
            comm = e.stream == "comm"
            bars.setdefault((e.kind, comm), []).append((e.start * 1e3, (e.end - e.start) * 1e3))
            if label_mbs and not comm and e.mb >= 0 and (e.end - e.start) > total * 0.012:
                ax.text((e.start + e.end) / 2 * 1e3, y + 0.19, str(e.mb), ha="center", va="center",
                        fontsize=6, color="white")
        for (kind, comm), spans in bars.items():
            used.add(kind)
            height, base = (0.25, y - 0.42) if comm else (0.62, y - 0.12)
            ax.broken_barh(spans, (base, height), facecolors=COLORS.get(kind, "#333333"), edgecolor="white",
                           linewidth=edge)
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {ranks - 1 - y}" for y in range(ranks)])
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, total * 1e3 * 1.01)
    ax.set_title(title, fontsize=10)
    handles = [Patch(color=COLORS[k], label=LABELS[k]) for k in COLORS if k in used]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.35 / (1.0 + 0.55 * ranks), 1, 1))
    save_figure(fig, path, path.suffix.lstrip(".") or "png")
