"""Resolve a config given as an object, a JSON path or a shipped preset name."""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from simumax.config.base import ConfigBase, read_json
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError

KINDS = {"model": "models", "strategy": "strategy", "system": "system"}
C = TypeVar("C", bound=ConfigBase)


def _preset_dir(kind: str) -> Any:
    return resources.files("simumax.config").joinpath("presets", KINDS[kind])


def list_presets(kind: str) -> list[str]:
    """Preset names of one kind ('model', 'strategy', 'system'), sorted."""
    return sorted(p.name[:-5] for p in _preset_dir(kind).iterdir() if p.name.endswith(".json"))


def _canonical(name: str) -> str:
    """One spelling for preset names: case and _ / - do not matter (H100_SXM_80GB, deepseek_v3)."""
    return name.lower().replace("_", "-")


def _preset_entry(kind: str, name: str) -> Any:
    name = name.removesuffix(".json")
    entry = _preset_dir(kind).joinpath(f"{name}.json")
    if entry.is_file():
        return entry
    known = list_presets(kind)
    same = [k for k in known if _canonical(k) == _canonical(name)]
    if len(same) == 1:  # another spelling of one preset's name
        return _preset_dir(kind).joinpath(f"{same[0]}.json")
    close = set(difflib.get_close_matches(_canonical(name), [_canonical(k) for k in known], n=3, cutoff=0.6))
    # a name's start ("h100", "tp2") names the presets it begins, as far as they are few
    starting = [k for k in known if _canonical(k).startswith(_canonical(name))]
    if len(starting) <= 5:
        close.update(_canonical(k) for k in starting)
    hint = f"; did you mean {', '.join(k for k in known if _canonical(k) in close)}?" if close else ""
    raise ConfigError(kind, f"unknown preset {name!r}{hint} (known: {', '.join(known)})")


def preset_path(kind: str, name: str) -> Path:
    """File of a shipped preset (installed package data: a real path for a normal install)."""
    return Path(str(_preset_entry(kind, name)))


def _resolve(kind: str, cls: type[C], spec: C | str | Path | dict[str, Any], checked: bool = True) -> C:
    if isinstance(spec, cls):
        return spec
    if isinstance(spec, dict):
        return cls.init_from_dict(spec, source=kind, checked=checked)
    if not isinstance(spec, (str, Path)):
        raise ConfigError(kind, f"expected a {cls.__name__}, a path or a preset name, got {type(spec).__name__}")
    text = str(spec)
    path = Path(text)
    if text.endswith(".json") or path.exists() or "/" in text:
        data = read_json(path)
        if kind == "model" and ("architectures" in data or "num_hidden_layers" in data):
            raise ConfigError("model", f"{text} is a Hugging Face config.json: convert it with `simumax import hf {text}`")
        return cls.init_from_dict(data, source=text, checked=checked)
    name = text.removesuffix(".json")
    entry = _preset_entry(kind, name)
    with resources.as_file(entry) as p:
        return cls.init_from_dict(read_json(p), source=f"preset {kind} {name}", checked=checked)


def load_model(spec: ModelConfig | str | Path | dict[str, Any]) -> ModelConfig:
    return _resolve("model", ModelConfig, spec)


def load_strategy(spec: StrategyConfig | str | Path | dict[str, Any], *, checked: bool = True) -> StrategyConfig:
    """``checked=False``: the rules between fields are checked when the strategy is used, so
    edits or job-size overrides may complete it first (``ConfigBase.init_from_dict``)."""
    return _resolve("strategy", StrategyConfig, spec, checked)


def load_system(spec: SystemConfig | str | Path | dict[str, Any]) -> SystemConfig:
    return _resolve("system", SystemConfig, spec)
