"""matplotlib plumbing shared by the report plots: a headless pyplot, one font size for
every plot (CLI files and the web app alike), and an atomic save."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from simumax.atomic import write_bytes_atomic


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (imported on first plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


FONT_SIZE = 8  # titles, axis labels, ticks, legends and annotations of every plot
BAR_LABEL_SIZE = 6  # the only exception: micro-batch numbers inside Gantt bars, which must fit the bar
STYLE = {key: FONT_SIZE for key in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize", "ytick.labelsize",
                                    "legend.fontsize", "figure.titlesize")}
F = TypeVar("F", bound=Callable[..., Any])


def styled(fn: F) -> F:
    """Build the figure under the shared style (one font size throughout)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with pyplot().rc_context(STYLE):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def save_figure(fig: Any, path: Path, fmt: str | None = None) -> None:
    """Write the figure atomically (SVG for a .svg path, else PNG, unless ``fmt``) and close it."""
    fmt = fmt or ("svg" if path.suffix.lower() == ".svg" else "png")
    write_bytes_atomic(path, lambda f: fig.savefig(f, format=fmt))
    pyplot().close(fig)


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes (for a web page), closed after."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    pyplot().close(fig)
    return buf.getvalue()


def time_error_axes(ax: Any) -> None:
    """The axes of a time-error chart (fit-runs, validate): predicted / measured − 1 in %
    against the measured time on a log axis labelled 1, 2, 5, 10 ... (not 2x10^0, nor every
    minor tick), 0 ruled and ±5 % shaded."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.axhspan(-5, 5, color="0.92", zorder=0)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("predicted / measured − 1 (%)")
