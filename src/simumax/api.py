"""PerfLLM: the SimuMax-compatible Python entry point."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from simumax.atomic import ensure_dir, write_json_atomic, write_jsonl_atomic, write_text_atomic  # noqa: F401 (re-exported)
from simumax.compat.perf_methods import SimuMaxPerfMethods
from simumax.compat.results import cost_view, mem_view
from simumax.config.base import Fingerprint
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.report.results import CostResult, MemResult, SimResult
from simumax.profiles import ProfileCache
from simumax.search.evaluate import GIB, SearchRow
from simumax.search.run import run_search
from simumax.search.space import RECOMPUTE_TYPES, SearchSpace
from simumax.search.table import search_csv
from simumax.simulate.outputs import simulate_to
from simumax.what_if import WhatIf
from simumax.what_if import what_if as what_if_rows

log = logging.getLogger(__name__)
ConfigLike = Any  # a config object, a JSON path or a preset name


class PerfLLM(SimuMaxPerfMethods):
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
        self._built_from: Fingerprint | None = None
        self.all_search_result: list[dict[str, Any]] = []

    def configure(
        self,
        strategy_config: ConfigLike = None,
        model_config: ConfigLike = None,
        system_config: ConfigLike = None,
    ) -> "PerfLLM":
        """Set any of the three configs (objects, JSON paths or preset names). A strategy's
        rules between fields are checked when it is estimated, as SimuMax does, so a script
        may complete it first (``perf.strategy.world_size = 64``)."""
        if strategy_config is not None:
            self.strategy_config = load_strategy(strategy_config, checked=False)
        if model_config is not None:
            self.model_config = load_model(model_config)
        if system_config is not None:
            self.system_config = load_system(system_config)
        self._estimate = self._cost = self._mem = None
        return self

    # SimuMax's attribute names for two of the configs
    @property
    def system(self) -> SystemConfig | None:
        return self.system_config

    @system.setter
    def system(self, value: ConfigLike) -> None:
        self.configure(system_config=value)

    @property
    def strategy(self) -> StrategyConfig | None:
        return self.strategy_config

    @strategy.setter
    def strategy(self, value: ConfigLike) -> None:
        self.configure(strategy_config=value)

    def _configs(self) -> tuple[Any, ...]:
        return self.model_config, self.strategy_config, self.system_config

    def _unchanged(self) -> bool:
        """The configs hold what the estimate was built from (no edit in place since)."""
        return self._built_from is not None and self._built_from.matches(self._configs())

    def _require(self) -> Estimate:
        """The estimate of the configs as they are now: editing a config in place (as
        SimuMax scripts do, ``perf.model_config.layer_num = 4``) rebuilds it."""
        if self._estimate is not None and not self._unchanged():
            self._estimate = self._cost = self._mem = None
        if self._estimate is None:
            for name in ("model_config", "strategy_config", "system_config"):
                if getattr(self, name) is None:
                    raise ConfigError(name, "not configured: call perf.configure(...) first")
            self._built_from = fp = Fingerprint(self._configs())
            model, system = self.model_config, self.system_config
            profiles = ProfileCache.of(model, system, (fp.snapshots[0], fp.snapshots[2]))  # type: ignore[arg-type]
            self._estimate = Estimate(model, self.strategy_config, system, profiles)  # type: ignore[arg-type]
        return self._estimate

    def run_estimate(self, capture_graph: bool = False, save_path: str | Path | None = None) -> "PerfLLM":
        """Build the IR and compute cost and memory (results cached until reconfigured).
        SimuMax's keywords: ``save_path`` also writes analysis() there; ``capture_graph``
        writes the first stage's op graph as Graphviz DOT (``op_graph.dot``) there."""
        est = self._require()
        self._cost = cost_view(est.cost(), est)  # our results, answering SimuMax's keys too
        self._mem = mem_view(est.memory(), est)
        log.debug("estimate: %.6f s/iter, peak %.3e B", self._cost.duration_time_per_iter, self._mem.peak_mem)
        if save_path is not None:
            self.analysis(save_path, console_log=False)
            if capture_graph:
                from simumax.compat.graph import SimuONNXGraphBuilder

                write_text_atomic(Path(save_path) / "op_graph.dot", SimuONNXGraphBuilder(self).build(stage=0).to_dot())
        return self

    def analysis_cost(self) -> CostResult:
        if self._cost is None or not self._unchanged():
            self.run_estimate()
        assert self._cost is not None
        return self._cost

    def analysis_mem(self) -> MemResult:
        if self._mem is None or not self._unchanged():
            self.run_estimate()
        assert self._mem is not None
        return self._mem

    @property
    def estimate(self) -> Estimate:
        """The underlying pipeline (stages, ops, cost models) for inspection."""
        return self._require()

    def what_if(self, factor: float = 1.5) -> list[WhatIf]:
        """The iteration time with each hardware resource ``factor`` times better, one at a
        time, most gain first (simumax/what_if.py; ``simumax what-if``)."""
        base = self.analysis_cost().duration_time_per_iter  # the job as it is, estimated once (cached here)
        est = self._require()
        return what_if_rows(est.model, est.strategy, est.system, factor, base=base)

    def analysis(self, save_path: str | Path | None = None, console_log: bool = True) -> dict[str, Any]:
        """SimuMax's analysis: print the summary (``console_log``) and, with ``save_path``,
        write compute_result.json, mem_result.json, the resolved configs, and SimuMax's
        base_info.json (sizes, parameters, FLOPs), net_info.json (analysis_net) and
        model_arch.txt (the op list of every stage) to that folder."""
        cost_r, mem_r = self.analysis_cost(), self.analysis_mem()
        cost, mem = cost_r.to_dict(), mem_r.to_dict()
        if console_log:
            from rich.console import Console

            from simumax.report import format as fmt

            console = Console()
            console.print(fmt.summary_table(cost_r, mem_r))
            console.print(fmt.breakdown_table(cost_r))
            console.print(fmt.memory_table(mem_r))
        if save_path is None:
            return {"cost": cost, "mem": mem}
        out = Path(save_path)
        est = self._require()
        st = est.strategy
        write_json_atomic(out / "base_info.json", {
            "model_name": est.model.model_name, "sys_name": est.system.sys_name, "world_size": st.world_size,
            "tp_size": st.tp_size, "pp_size": st.pp_size, "dp_size": st.dp_size, "cp_size": st.cp_size,
            "ep_size": st.ep_size, "etp_size": st.etp_size, "interleaving_size": st.interleaving_size,
            "global_batch_size": st.global_batch_size, "layers_per_stage": self.get_pp_num_layers(),
            "param_numel_info": cost_r["param_numel_info"], "flops_info": cost_r["flops_info"],  # type: ignore[index]
        })
        write_json_atomic(out / "net_info.json", self.analysis_net())
        write_text_atomic(out / "model_arch.txt", "".join(
            f"stage {s.index} chunk {s.chunk}: layers {s.layers}\n" + "".join(f"  {o.name} ({o.module})\n" for o in s.ops)
            for s in est.chunks))
        write_json_atomic(out / "compute_result.json", cost)
        write_json_atomic(out / "mem_result.json", mem)
        write_json_atomic(out / "model_config.json", self.model_config.to_dict())  # type: ignore[union-attr]
        write_json_atomic(out / "strategy_config.json", self.strategy_config.to_dict())  # type: ignore[union-attr]
        write_json_atomic(out / "system_config.json", self.system_config.to_dict())  # type: ignore[union-attr]
        return {"cost": cost, "mem": mem}

    def simulate(self, save_path: str | Path | None = None, ops: bool | None = None, gantt: bool = True,
                 merge_lanes: bool | None = None) -> SimResult:
        """Event-simulate the iteration with the strategy's schedule and overlap options.
        With ``save_path`` writes tracing_logs.json (Chrome trace: Perfetto,
        chrome://tracing), memory_timeline_rank<r>.json, a memory_viz snapshot pickle
        of the peak rank and pipeline.png there; ``merge_lanes`` draws each rank's compute
        and communication streams on one lane (SimuMax's option)."""
        return simulate_to(self._require(), Path(save_path) if save_path is not None else None, ops=ops, gantt=gantt,
                           merge_lanes=bool(merge_lanes))

    # ---- search (names from the SimuMax tutorial) ------------------------------------
    def _configured(self) -> tuple[ModelConfig, StrategyConfig, SystemConfig]:
        self._require()
        return self.model_config, self.strategy_config, self.system_config  # type: ignore[return-value]

    def _peak(self, st: StrategyConfig, use_reserved_memory: bool, profiles: ProfileCache) -> float:
        model, _, system = self._configured()
        mem = Estimate(model, st, system, profiles).memory()
        return mem.peak_mem_with_reserved if use_reserved_memory else mem.peak_mem

    def search_max_micro_batch_size(
        self, gmi_error: float = 0.0, use_reserved_memory: bool = True, max_micro_batch_size: int = 1024,
        micro_batch_num: int | None = None,
    ) -> tuple[int, float]:
        """SimuMax's form: (largest micro_batch_size that fits with the configured strategy,
        its peak bytes); (0, peak at mbs 1) when none fits. ``micro_batch_num`` overrides
        the strategy's."""
        model, st, system = self._configured()
        if micro_batch_num is not None:
            st = st.with_updates({"micro_batch_num": micro_batch_num})
        cache = ProfileCache(model, system)
        budget = system.mem_bytes - gmi_error * GIB
        peak = lambda m: self._peak(st.with_updates({"micro_batch_size": m}), use_reserved_memory, cache)  # noqa: E731
        best = _largest(lambda m: peak(m) <= budget, 1, max_micro_batch_size)
        return best, peak(max(best, 1))

    def search_max_micro_batch_size_fixed_gbs(
        self, pp_size: int, dp_size: int, global_batch_size: int, gmi_error: float = 0.0, use_reserved_memory: bool = True,
        save_all: bool = False, verbose: bool = False, memory_utils: float = 1.0,
    ) -> tuple[list[int], list[int], list[float], list[float]]:
        """SimuMax's four lists over the micro-batch sizes dividing global_batch_size / dp
        (at the configured tp and cp with pp_size and dp_size): micro-batch sizes,
        micro-batch counts, peak bytes, iteration seconds — the ones that fit in
        ``memory_utils`` of the device less gmi_error GiB, or every size tried with
        ``save_all``. The last fitting size is the largest (memory grows with mbs)."""
        model, st, system = self._configured()
        if not 0 < memory_utils <= 1:
            raise ConfigError("memory_utils", f"must be in (0, 1] (got {memory_utils})")
        for name, value in (("pp_size", pp_size), ("dp_size", dp_size), ("global_batch_size", global_batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be a positive integer (got {value!r})")
        cache = ProfileCache(model, system)
        if global_batch_size % dp_size:
            raise ConfigError("global_batch_size", f"must be divisible by dp_size ({dp_size})")
        per_dp = global_batch_size // dp_size
        world = st.tp_size * st.cp_size * pp_size * dp_size
        budget = system.mem_bytes * memory_utils - gmi_error * GIB
        out: tuple[list[int], list[int], list[float], list[float]] = ([], [], [], [])
        for mbs in sorted(d for d in range(1, per_dp + 1) if per_dp % d == 0):
            trial = st.with_updates({"world_size": world, "pp_size": pp_size, "micro_batch_size": mbs, "micro_batch_num": per_dp // mbs})
            est = Estimate(model, trial, system, cache)
            mem = est.memory()
            peak = mem.peak_mem_with_reserved if use_reserved_memory else mem.peak_mem
            fits = peak <= budget
            if fits or save_all:
                for lst, v in zip(out, (mbs, per_dp // mbs, peak, est.cost().duration_time_per_iter)):
                    lst.append(v)  # type: ignore[attr-defined]
            if verbose:  # asked for: SimuMax prints each size it tries
                print(f"mbs {mbs} x mbc {per_dp // mbs}: peak {peak / GIB:.2f} GiB" + ("" if fits else " (does not fit)"))
            if not fits and not save_all:
                break  # memory grows with mbs
        return out

    def search_best_parallel_strategy(
        self,
        world_size: int,
        gmi_error: float = 0.0,
        micro_batch_size: int | list[int] = 1,
        global_batch_size: int | None = None,
        tp_search_list: list[int] | None = None,
        ep_search_list: list[int] | None = None,
        pp_search_list: list[int] | None = None,
        recompute_search_type: str | list[str] | None = None,
        cp_search_list: list[int] | None = None,
        use_reserved_memory: bool = True,
        jobs: int = 1,
        dump_path: str | Path | None = None,
        *,
        vp_search_list: list[int] | None = None,
        etp_search_list: list[int] | None = None,
        zero_search_list: list[int] | None = None,
        schedule_search_list: list[str | None] | None = None,
        executor: str = "local",
        resume: bool = False,
    ) -> list[SearchRow]:
        """Every legal strategy of the space, ranked (fitting ones by iteration time).

        Fills ``all_search_result`` with the rows as dicts. ``dump_path`` (JSONL) gets each
        row as it finishes and all rows ranked at the end; with ``resume`` the rows already
        there are kept and not redone. ``executor``: local, process (``jobs`` workers) or ray.
        """
        model, st, system = self._configured()
        rc = [recompute_search_type] if isinstance(recompute_search_type, str) else (recompute_search_type or ["none"])
        mbs = [micro_batch_size] if isinstance(micro_batch_size, int) else micro_batch_size
        space = SearchSpace(
            world_size=world_size,
            global_batch_size=global_batch_size or st.global_batch_size,
            tp=tuple(tp_search_list or (1, 2, 4, 8)),
            pp=tuple(pp_search_list) if pp_search_list else None,
            vp=tuple(vp_search_list or (1,)),
            ep=tuple(ep_search_list or (1,)),
            etp=tuple(etp_search_list or (1,)),
            cp=tuple(cp_search_list or (1,)),
            mbs=tuple(mbs),
            recompute=tuple(rc),
            zero=tuple(zero_search_list or (st.zero_state,)),
            schedule=tuple(schedule_search_list or (None,)),
        )
        # SimuMax's dump_path is a folder; ours a JSONL file: a path without a suffix is a folder
        folder = dump_path is not None and (Path(dump_path).is_dir() or not Path(dump_path).suffix)
        jsonl = Path(dump_path) / "search_result.jsonl" if folder else (Path(dump_path) if dump_path else None)
        if folder:
            ensure_dir(Path(dump_path))
        rows = run_search(
            model, system, st, space, gmi_error=gmi_error, use_reserved_memory=use_reserved_memory, jobs=jobs,
            executor=executor, jsonl=jsonl, resume=resume,
        )
        self.all_search_result = [r.to_dict() for r in rows]
        if folder:  # SimuMax's dump_path is a folder of tables: every row, and the fitting ones ranked
            write_text_atomic(Path(dump_path) / "search_result.csv", search_csv(rows))
            write_text_atomic(Path(dump_path) / "search_result_fits.csv", search_csv(r for r in rows if r.fits))
        return rows

    def search_best_parallel_strategy_with_recompute(
        self,
        world_size: int,
        gmi_error: float = 0.0,
        micro_batch_size: int | list[int] = 1,
        global_batch_size: int | None = None,
        all_search_result: list[dict[str, Any]] | dict[str, list[Any]] | None = None,
        tp_search_list: list[int] | None = None,
        ep_search_list: list[int] | None = None,
        recompute_search_type: str | list[str] | None = None,
        use_reserved_memory: bool = True,
        dump_path: str | Path | None = None,
        pp_search_list: list[int] | None = None,
        jobs: int = 1,
        verbose: bool = False,
        use_etp: bool = False,
        **space: Any,
    ) -> list[SearchRow]:
        """As search_best_parallel_strategy over SimuMax's three recompute modes by default
        (full-block with the fewest layers that fit; SimuMax's names ``no_recompute``,
        ``selective_recompute`` (its three flag sets), ``full_block`` / ``layer_only`` too).
        ``all_search_result`` gets the rows: appended as dicts to a list, or as one list per
        column to a dict (SimuMax's form). ``use_etp`` searches the expert-TP sizes of the TP
        list; ``verbose`` prints the ranked table. Further keywords as
        search_best_parallel_strategy."""
        if use_etp and "etp_search_list" not in space:
            space["etp_search_list"] = list(tp_search_list or (1, 2, 4, 8))
        rows = self.search_best_parallel_strategy(
            world_size, gmi_error, micro_batch_size, global_batch_size, tp_search_list, ep_search_list, pp_search_list,
            recompute_search_type or list(RECOMPUTE_TYPES), space.pop("cp_search_list", None), use_reserved_memory, jobs,
            dump_path, **space,
        )
        if isinstance(all_search_result, dict):
            for row in self.all_search_result:
                for key, value in row.items():
                    all_search_result.setdefault(key, []).append(value)
        elif all_search_result is not None:
            all_search_result.extend(self.all_search_result)
        if verbose:
            from rich.console import Console

            from simumax.report.format import search_table

            Console().print(search_table(rows[:20], self._configured()[2].mem_bytes, gmi_error))
        return rows


def _largest(fits: Any, lo: int, hi: int) -> int:
    """Largest n in [lo, hi] with fits(n), assuming fits is monotone (0 if none)."""
    if not fits(lo):
        return 0
    n = lo
    while n * 2 <= hi and fits(n * 2):
        n *= 2
    a, b = n, min(n * 2, hi + 1)  # fits(a), not fits(b) (or b past hi)
    while b - a > 1:
        mid = (a + b) // 2
        if fits(mid):
            a = mid
        else:
            b = mid
    return a
