"""PerfLLM: the SimuMax-compatible Python entry point."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.report.results import CostResult, MemResult

log = logging.getLogger(__name__)
ConfigLike = Any  # a config object, a JSON path or a preset name


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON via a temp file and rename, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class PerfLLM:
    """Predict one training iteration of a model under a strategy on a system.

    >>> perf = PerfLLM()
    >>> perf.configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b",
    ...                system_config="a100_pcie")
    >>> perf.run_estimate()
    >>> perf.analysis_cost().duration_time_per_iter  # seconds
    """

    def __init__(self) -> None:
        self.model_config: ModelConfig | None = None
        self.strategy_config: StrategyConfig | None = None
        self.system_config: SystemConfig | None = None
        self._estimate: Estimate | None = None
        self._cost: CostResult | None = None
        self._mem: MemResult | None = None

    def configure(
        self,
        strategy_config: ConfigLike = None,
        model_config: ConfigLike = None,
        system_config: ConfigLike = None,
    ) -> "PerfLLM":
        """Set any of the three configs (objects, JSON paths or preset names)."""
        if strategy_config is not None:
            self.strategy_config = load_strategy(strategy_config)
        if model_config is not None:
            self.model_config = load_model(model_config)
        if system_config is not None:
            self.system_config = load_system(system_config)
        self._estimate = self._cost = self._mem = None
        return self

    def _require(self) -> Estimate:
        if self._estimate is None:
            for name in ("model_config", "strategy_config", "system_config"):
                if getattr(self, name) is None:
                    raise ConfigError(name, "not configured: call perf.configure(...) first")
            self._estimate = Estimate(self.model_config, self.strategy_config, self.system_config)  # type: ignore[arg-type]
        return self._estimate

    def run_estimate(self) -> "PerfLLM":
        """Build the IR and compute cost and memory (results cached until reconfigured)."""
        est = self._require()
        self._cost = est.cost()
        self._mem = est.memory()
        log.debug("estimate: %.6f s/iter, peak %.3e B", self._cost.duration_time_per_iter, self._mem.peak_mem)
        return self

    def analysis_cost(self) -> CostResult:
        if self._cost is None:
            self.run_estimate()
        assert self._cost is not None
        return self._cost

    def analysis_mem(self) -> MemResult:
        if self._mem is None:
            self.run_estimate()
        assert self._mem is not None
        return self._mem

    @property
    def estimate(self) -> Estimate:
        """The underlying pipeline (stages, ops, cost models) for inspection."""
        return self._require()

    def analysis(self, save_path: str | Path) -> dict[str, Any]:
        """Write compute_result.json, mem_result.json and the resolved configs to a folder."""
        out = Path(save_path)
        cost = self.analysis_cost().to_dict()
        mem = self.analysis_mem().to_dict()
        write_json_atomic(out / "compute_result.json", cost)
        write_json_atomic(out / "mem_result.json", mem)
        write_json_atomic(out / "model_config.json", self.model_config.to_dict())  # type: ignore[union-attr]
        write_json_atomic(out / "strategy_config.json", self.strategy_config.to_dict())  # type: ignore[union-attr]
        write_json_atomic(out / "system_config.json", self.system_config.to_dict())  # type: ignore[union-attr]
        return {"cost": cost, "mem": mem}
