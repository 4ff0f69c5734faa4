"""SimuMax import path: ``from simumax.core.config import ModelConfig, StrategyConfig, SystemConfig``."""

from simumax.config import ModelConfig, StrategyConfig, SystemConfig

__all__ = ["ModelConfig", "StrategyConfig", "SystemConfig"]
