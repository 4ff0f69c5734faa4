"""Atomic file writes: a temp file in the target folder, then a rename, so a crash
never leaves half a file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, IO


def ensure_dir(folder: Path) -> None:
    """Create ``folder`` (and its parents), or one ConfigError saying why it cannot be."""
    from simumax.errors import ConfigError

    for p in (folder, *folder.parents):
        if p.exists() and not p.is_dir():
            raise ConfigError("output", f"{p} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("output", f"cannot create {folder}: {exc.strerror}") from None


def _write_atomic(path: Path, mode: str, fill: Callable[[IO[Any]], None]) -> None:
    from simumax.errors import ConfigError

    ensure_dir(path.parent)
    if path.is_dir():
        raise ConfigError("output", f"{path} is a folder, not a file")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise ConfigError("output", f"cannot write in {path.parent}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, mode, **({"newline": ""} if "b" not in mode else {})) as f:
            fill(f)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    _write_atomic(path, "w", lambda f: f.write(text))


def write_stream_atomic(path: Path, fill: Callable[[IO[str]], None]) -> None:
    """``fill`` writes the text piece by piece to the open file (long traces)."""
    _write_atomic(path, "w", fill)


def write_bytes_atomic(path: Path, fill: Callable[[IO[bytes]], None]) -> None:
    """``fill`` writes the content to the open binary file (pickle.dump, savefig...)."""
    _write_atomic(path, "wb", fill)


def write_json_atomic(path: Path, data: Any, compact: bool = False) -> None:
    """Indented for people; ``compact`` for long machine-read files (the C encoder)."""
    write_text_atomic(path, dumps_finite(data, indent=None if compact else 2) + "\n")


def write_jsonl_atomic(path: Path, rows: list[dict[str, Any]]) -> None:
    """All rows, one JSON object per line."""
    write_text_atomic(path, "".join(dumps_finite(r) + "\n" for r in rows))


def dumps_finite(data: Any, indent: int | None = None) -> str:
    """JSON that parsers accept: a NaN or an infinity is a ConfigError, never written."""
    try:
        return json.dumps(data, indent=indent, sort_keys=True, allow_nan=False)
    except ValueError:
        from simumax.errors import ConfigError

        raise ConfigError("result", "a value is infinite or NaN (the inputs make it unbounded)") from None
