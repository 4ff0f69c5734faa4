"""matplotlib plumbing shared by the report plots: a headless pyplot, and an atomic save."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from simumax.atomic import write_bytes_atomic


def pyplot() -> Any:
    """matplotlib.pyplot on the non-interactive Agg backend (imported on first plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
