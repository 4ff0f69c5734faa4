"""SimuMax's ``simumax.utils`` preset helpers: paths of shipped config files, and listings."""

from __future__ import annotations

from simumax.config.loader import list_presets, preset_path


def get_simu_model_config(name: str) -> str:
    """Path of a shipped model config (``get_simu_model_config("llama3-8b")``)."""
    return str(preset_path("model", name))


def get_simu_strategy_config(name: str) -> str:
    return str(preset_path("strategy", name))


def get_simu_system_config(name: str) -> str:
    return str(preset_path("system", name))


def _show(kind: str) -> list[str]:
    names = list_presets(kind)
    print("\n".join(names))  # SimuMax's helpers print the list: the call asks for it
    return names


def show_simu_models() -> list[str]:
    return _show("model")


def show_simu_strategy() -> list[str]:
    return _show("strategy")


def show_simu_system() -> list[str]:
    return _show("system")
