"""Strategy search: it finds what an exhaustive evaluation finds; max micro-batch; flags."""

from __future__ import annotations

import json

from simumax import PerfLLM, StrategyConfig
from simumax.config.checks import check_compatible
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags

GIB = 2**30


def _perf(model: str = "llama3-8b") -> PerfLLM:
    m = load_model(model).with_updates({"layer_num": 8})
    return PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config=m, system_config="a100_pcie")


def _exhaustive_best(perf: PerfLLM, world: int, gbs: int, gmi: float) -> tuple[float, str]:
    """Brute force, independent of the search code: every tp, pp, recompute layer count."""
    model, system = perf.model_config, perf.system_config
    budget = system.mem_bytes - gmi * GIB
    best = (float("inf"), "")
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if gbs % dp:
                continue
            variants = [{"enable_recompute": False}, {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True}]
            variants += [{"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": n} for n in range(1, model.layer_num // pp + 1)]
            for v in variants:
                fields = {"seq_len": 4096, "world_size": world, "tp_size": tp, "pp_size": pp, "micro_batch_num": gbs // dp, "enable_sequence_parallel": tp > 1, "use_fp32_accum_grad": True, **v}
                try:
                    st = StrategyConfig.init_from_dict(fields)
                    check_compatible(model, st, system)
                except ConfigError:
                    continue
                est = Estimate(model, st, system)
                if est.memory().peak_mem_with_reserved > budget:
                    continue
                t = est.cost().duration_time_per_iter
                best = min(best, (t, f"tp{tp} pp{pp}"))
    return best


def test_search_best_equals_exhaustive_evaluation() -> None:
    perf = _perf()
    rows = perf.search_best_parallel_strategy_with_recompute(8, gmi_error=4, global_batch_size=32, pp_search_list=[1, 2, 4, 8])
    t, label = _exhaustive_best(perf, 8, 32, 4)
    assert rows[0].fits
    assert rows[0].iter_time == t
    assert rows[0].label.startswith(label + " ")
    assert perf.all_search_result and perf.all_search_result[0]["iter_time"] == t
    fitting = [r.iter_time for r in rows if r.fits]
    assert fitting == sorted(fitting)


def test_search_respects_memory_budget_and_dumps_jsonl(tmp_path) -> None:
    perf = _perf()
    out = tmp_path / "rows.jsonl"
    rows = perf.search_best_parallel_strategy(8, gmi_error=10, global_batch_size=32, recompute_search_type=["none", "full_block"], dump_path=out)
    cap = perf.system_config.mem_bytes - 10 * GIB
    assert all((r.peak_mem <= cap) == r.fits for r in rows)
    lines = out.read_text().splitlines()
    assert len(lines) == len(rows) and json.loads(lines[0])["iter_time"] == rows[0].iter_time


def test_max_micro_batch_size_is_the_largest_that_fits() -> None:
    perf = _perf()
    m = perf.search_max_micro_batch_size(gmi_error=2)
    assert m >= 1
    st = perf.strategy_config
    fits = lambda mbs: Estimate(perf.model_config, st.with_updates({"micro_batch_size": mbs}), perf.system_config).memory().peak_mem_with_reserved <= perf.system_config.mem_bytes - 2 * GIB  # noqa: E731
    assert fits(m) and not fits(m + 1)
    fixed = perf.search_max_micro_batch_size_fixed_gbs(pp_size=2, dp_size=4, global_batch_size=64, gmi_error=2)
    assert fixed >= 1 and 16 % fixed == 0


def test_megatron_flags() -> None:
    st = load_strategy("ep4_pp2_dp4_mbs1_full_recompute")
    flags = " ".join(megatron_flags(st, load_model("deepseekv2")))
    for f in ("--tensor-model-parallel-size 1", "--pipeline-model-parallel-size 2", "--expert-model-parallel-size 4",
              "--recompute-granularity full", "--recompute-method block", "--use-distributed-optimizer", "--moe-token-dispatcher-type alltoall"):
        assert f in flags
    tp = " ".join(megatron_flags(load_strategy("tp2_pp1_dp4_mbs1_selective_recompute")))
    assert "--sequence-parallel" in tp and "--recompute-granularity selective" in tp
    assert load_system("a100_pcie")  # the system preset the search tests use exists


def test_search_cli_writes_jsonl_and_csv(tmp_path) -> None:
    from tests.test_errors import run_cli

    base = ["search", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--world-size", "8", "--gbs", "16"]
    r = run_cli(*base, "--set", "model.layer_num=4", "--tp", "1,2", "--pp", "1,2", "--recompute", "none", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "search.jsonl").read_text().splitlines()
    assert len(rows) == 4 and (tmp_path / "search.csv").read_text().count("\n") == 5
    bad = run_cli(*base, "--tp", "1,x")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--tp" in bad.stderr
