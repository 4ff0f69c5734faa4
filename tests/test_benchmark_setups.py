"""The speed benchmarks' workloads are configurations the package accepts: a refusal rule
added to the loader must not silently turn a benchmark into a traceback (bench_search.py's
405B job once set tp_comm_overlap on a TP 1 base, which Megatron refuses)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.search.space import candidates

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_search.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_search", BENCH)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_search_benchmark_base_loads_and_has_candidates() -> None:
    mod = _bench_module()
    for name, (model, strategy, _target, space) in mod.WORKLOADS.items():
        if "offload" in name:  # the same base as the 405B job, a larger space
            continue
        sys_name, fields = mod.SETUP.get(name, ("a100_pcie", {}))
        m, system = load_model(model), load_system(sys_name)
        base = load_strategy(strategy).with_updates(fields)
        assert next(candidates(m, system, base, space), None) is not None, name
