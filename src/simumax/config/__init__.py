"""Configuration schemas (SimuMax-compatible JSON), presets and cross-checks."""

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.config.loader import load_model, load_strategy, load_system, list_presets
from simumax.config.checks import check_compatible

__all__ = [
    "ModelConfig",
    "StrategyConfig",
    "SystemConfig",
    "load_model",
    "load_strategy",
    "load_system",
    "list_presets",
    "check_compatible",
]
