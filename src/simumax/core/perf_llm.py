"""SimuMax import path: ``from simumax.core.perf_llm import PerfLLM``."""

from simumax.api import PerfLLM

__all__ = ["PerfLLM"]
