"""What several commands share: ``--set`` overrides, the job size, list options, and the
line naming the files a command wrote."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import typer

from simumax import cli
from simumax.config.base import did_you_mean
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError

SetOpt = typer.Option([], "--set", help="Override a field: \\[model.|strategy.|system.]key=value (JSON value); "
                                         "repeat it, or list several after one --set.")
# the options of every command that estimates one job
ModelOpt = typer.Option(..., "--model", "-m", help="Model preset name or JSON path.")
StrategyOpt = typer.Option(..., "--strategy", "-s", help="Strategy preset name or JSON path.")
SystemOpt = typer.Option(..., "--system", "-y", help="System preset name or JSON path.")
WorldSizeOpt = typer.Option(None, "--world-size", help="GPUs (DP follows from TP x PP x CP).")
GbsOpt = typer.Option(None, "--gbs", help="Global batch in sequences; the micro-batch count follows.")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _takes_text(annotation: Any) -> bool:
    """A field whose values are text and never numbers (``te_version: str | None``)."""
    args = typing.get_args(annotation) or (annotation,)
    return str in args and not any(a in args for a in (int, float))


def _set_path(data: dict[str, Any], path: list[str], value: Any, key: str) -> None:
    """Set a nested field of a config dump (``accelerator.mem_gbs``); SimuMax's flat network
    tiers are reached as ``networks.<tier>...``."""
    node: Any = data
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(key, f"unknown field {part!r}")
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(key, f"{path[-2]!r} has no fields")
    node[path[-1]] = value  # an unknown leaf is refused when the config is validated


def apply_overrides(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig, sets: list[str], *,
                    checked: bool = True):
    """``--set key=value`` (JSON value) on the model, strategy or system; ``model.``,
    ``strategy.`` or ``system.`` first picks the config, dots go into nested fields.
    ``checked=False`` leaves the strategy's cross-field rules to the caller (``load_job``)."""
    configs: dict[str, Any] = {"model": model, "strategy": strategy, "system": system}
    dumps: dict[str, dict[str, Any]] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        target, _, field = key.partition(".") if key.split(".", 1)[0] in configs else ("", "", key)
        if not target:
            owners = [n for n, c in (("model", ModelConfig), ("strategy", StrategyConfig)) if field in c.model_fields]
            if not owners:
                hint = did_you_mean(field.split(".")[0], [*ModelConfig.model_fields, *StrategyConfig.model_fields])
                raise ConfigError(key, f"unknown field in model and strategy configs{hint}")
            target = owners[0]
        path = field.split(".")
        fields = type(configs[target]).model_fields
        if path[0] not in fields:
            raise ConfigError(key, f"unknown field of the {target} config{did_you_mean(path[0], fields, f'{target}.')}")
        data = dumps.setdefault(target, configs[target].model_dump())
        parsed = _parse_value(value)
        if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and len(path) == 1 \
                and _takes_text(fields[path[0]].annotation):
            parsed = value  # a version such as 2.10 stays text (as a number it would read 2.1)
        _set_path(data, path, parsed, key)
    for target, data in dumps.items():
        configs[target] = type(configs[target]).init_from_dict(data, source="--set", checked=checked)
    return configs["model"], configs["strategy"], configs["system"]


def load_job(model: str, strategy: str, system: str, sets: list[str], *, world_size: int | None = None,
             gbs: int | None = None) -> tuple[ModelConfig, StrategyConfig, SystemConfig]:
    """One command's configs: files or presets with ``--world-size``, ``--set`` and ``--gbs``
    applied before the strategy's cross-field rules are checked, so a strategy written for
    another job size (the default world_size 8 beside tp 8 x pp 16, one micro-batch with
    interleaving) runs at the size asked for; the rules then hold for the job as run."""
    given = [f for f, v in (("--world-size", world_size), ("--set", sets), ("--gbs", gbs)) if v]
    if world_size is not None:  # with the other overrides, so --set tp_size=8 sees the new world
        if world_size < 1:
            raise ConfigError("--world-size", f"must be >= 1 (got {world_size})")
        sets = [f"strategy.world_size={world_size}", *sets]
    draft = load_strategy(strategy, checked=False)
    label = draft.source
    m, draft, sy = apply_overrides(load_model(model), draft, load_system(system), sets, checked=False)
    return m, _job_size(draft, gbs, f"{label} with {', '.join(given)}" if given else label), sy


def _job_size(st: StrategyConfig, gbs: int | None, source: str = "--gbs") -> StrategyConfig:
    """``--gbs``: the micro-batch count follows (gbs / (mbs x dp)). The result is a checked
    strategy (``st`` may be a draft)."""
    updates: dict[str, Any] = {}
    if gbs is not None and st.world_size % (st.tp_size * st.cp_size * st.pp_size) == 0:  # else the check names it
        per_step = st.micro_batch_size * st.dp_size
        if gbs < 1 or gbs % per_step:
            raise ConfigError("--gbs", f"{gbs} must be a positive multiple of micro-batch size x DP = {per_step}")
        updates["micro_batch_num"] = gbs // per_step
    return st.with_updates(updates, source=source)


def _training(step: float, band: tuple[float, float] | None, st: StrategyConfig, tokens: float,
              price: float | None) -> dict[str, Any]:
    """Time and GPU-hours to train on ``tokens`` at this step time (and its 80 % band)."""
    steps = tokens / (st.global_batch_size * st.seq_len)
    seconds = steps * step
    lo, hi = band or (step, step)
    gpu_hours = seconds * st.world_size / 3600
    return {
        "tokens": tokens, "steps": steps, "seconds": seconds, "days": seconds / 86400,
        "days_interval": (steps * lo / 86400, steps * hi / 86400), "gpu_hours": gpu_hours,
        "cost": gpu_hours * price if price is not None else None,
    }


def _str_list(text: str) -> tuple[str, ...]:
    """A comma-separated option's items, stripped, empty ones dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _int_list(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in _str_list(text)]
    except ValueError:
        raise ConfigError(name, f"expected comma-separated integers, got {text!r}") from None


def _say_written(out: Path, since: float) -> None:
    """One line on stderr naming the files just written to ``out`` (stdout stays the result)."""
    names = sorted(p.name for p in out.iterdir() if p.is_file() and p.stat().st_mtime >= since - 1)
    if names:
        cli.err_console.print(f"wrote {out}: {', '.join(names)}", markup=False, soft_wrap=True)
