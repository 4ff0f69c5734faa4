"""A search output folder that cannot lie: a fingerprint of what produced its rows (model,
system, base strategy, search space, memory margin, package version) beside the JSONL, so
``--resume`` refuses another search's rows, and a lock so two searches never write one
folder at once."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from simumax.atomic import ensure_dir, write_json_atomic
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.search.space import SearchSpace


def fingerprint(model: ModelConfig, system: SystemConfig, base: StrategyConfig, space: SearchSpace, gmi_error: float,
                use_reserved_memory: bool) -> str:
    from simumax import __version__

    what = {
        "model": model.model_dump(mode="json"), "system": system.model_dump(mode="json"),
        "strategy": base.model_dump(mode="json"), "space": dataclasses.asdict(space), "gmi_error": gmi_error,
        "reserved": use_reserved_memory, "version": __version__,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint_path(jsonl: Path) -> Path:
    return jsonl.with_name(jsonl.stem + ".fingerprint.json")


def check_resume(jsonl: Path, fp: str) -> None:
    """Refuse to resume rows another search (or an unknown one) wrote."""
    if not jsonl.exists():
        return
    path = fingerprint_path(jsonl)
    try:
        recorded = json.loads(path.read_text())["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError("--resume", f"{jsonl} has no readable fingerprint ({path.name}): cannot tell which search wrote it; "
                          "use a new --out") from None
    if recorded != fp:
        raise ConfigError("--resume", f"{jsonl} holds another search's rows (model, system, strategy, space, margin or "
                          "version differ); use a new --out or drop --resume")


def record(jsonl: Path, fp: str) -> None:
    write_json_atomic(fingerprint_path(jsonl), {"fingerprint": fp})


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` for one search; a second one is refused."""
    ensure_dir(folder)
    fh: IO[Any] = open(folder / ".search.lock", "w")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError("--out", f"another search is writing {folder} (pid in {folder / '.search.lock'})") from None
        fh.write(str(os.getpid()))
        fh.flush()
        yield
    finally:
        fh.close()
