"""SimuMax import path: ``from simumax.utils import get_simu_model_config, show_simu_models, ...``."""

from simumax.compat.presets import (
    get_simu_model_config,
    get_simu_strategy_config,
    get_simu_system_config,
    show_simu_models,
    show_simu_strategy,
    show_simu_system,
)

__all__ = [
    "get_simu_model_config", "get_simu_strategy_config", "get_simu_system_config",
    "show_simu_models", "show_simu_strategy", "show_simu_system",
]
