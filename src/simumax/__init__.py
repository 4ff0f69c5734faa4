"""simumax: predict Megatron-LM-style LLM training time and memory without running it."""

from simumax.api import PerfLLM
from simumax.config import ModelConfig, StrategyConfig, SystemConfig
from simumax.errors import ConfigError

__all__ = ["PerfLLM", "ModelConfig", "StrategyConfig", "SystemConfig", "ConfigError"]
__version__ = "0.1.0"
