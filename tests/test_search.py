"""Strategy search: it finds what an exhaustive evaluation finds; max micro-batch; flags."""

from __future__ import annotations

import json
import sys

import pytest

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
    m, peak = perf.search_max_micro_batch_size(gmi_error=2)  # SimuMax's (mbs, peak bytes)
    assert m >= 1
    st = perf.strategy_config
    fits = lambda mbs: Estimate(perf.model_config, st.with_updates({"micro_batch_size": mbs}), perf.system_config).memory().peak_mem_with_reserved <= perf.system_config.mem_bytes - 2 * GIB  # noqa: E731
    assert fits(m) and not fits(m + 1)
    assert peak == Estimate(perf.model_config, st.with_updates({"micro_batch_size": m}), perf.system_config).memory().peak_mem_with_reserved
    mbs, mbc, peaks, times = perf.search_max_micro_batch_size_fixed_gbs(pp_size=2, dp_size=4, global_batch_size=64, gmi_error=2)
    assert mbs and all(a * b == 16 for a, b in zip(mbs, mbc)) and all(p <= perf.system_config.mem_bytes - 2 * GIB for p in peaks)
    every = perf.search_max_micro_batch_size_fixed_gbs(pp_size=2, dp_size=4, global_batch_size=64, gmi_error=2, save_all=True)
    assert every[0] == [1, 2, 4, 8, 16] and every[0][: len(mbs)] == mbs and len(every[3]) == 5
    for bad in ({"dp_size": 0}, {"pp_size": -1}, {"global_batch_size": 0}):  # a ConfigError naming it, not a ZeroDivisionError
        with pytest.raises(ConfigError) as exc:
            perf.search_max_micro_batch_size_fixed_gbs(**{"pp_size": 2, "dp_size": 4, "global_batch_size": 64, **bad})
        assert exc.value.field == next(iter(bad))


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
    from tests.conftest import run_cli

    base = ["search", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--world-size", "8", "--gbs", "16"]
    r = run_cli(*base, "--set", "model.layer_num=4", "--tp", "1,2", "--pp", "1,2", "--recompute", "none", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "search.jsonl").read_text().splitlines()
    assert len(rows) == 4 and (tmp_path / "search.csv").read_text().count("\n") == 5
    # the best strategy as the whole Megatron-LM job: read back, the model and the strategy searched
    from simumax.config.loader import load_model
    from simumax.importers.megatron_args import parse_megatron_args

    best = json.loads((tmp_path / "best_strategy.json").read_text())
    model, strategy, _ = parse_megatron_args((tmp_path / "best_megatron_flags.txt").read_text().replace("\\\n", " "),
                                             world_size=8)
    assert model.layer_num == 4 and model.hidden_size == load_model("llama3-8b").hidden_size
    assert (strategy.tp_size, strategy.pp_size, strategy.micro_batch_num) == (best["tp_size"], best["pp_size"], best["micro_batch_num"])
    bad = run_cli(*base, "--tp", "1,x")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--tp" in bad.stderr


# ---- the space: uneven stages, vp, ZeRO; exhaustive agreement -------------------------------
def test_pp_layouts_cover_indivisible_layer_counts() -> None:
    from simumax.search.space import pp_layouts

    assert pp_layouts(61, 1) == [(None, None)] and pp_layouts(64, 8) == [(None, None)]
    assert pp_layouts(61, 2) == [(30, 31)]
    for layers, pp in ((61, 16), (61, 4), (61, 8), (7, 3), (10, 4)):
        layouts = pp_layouts(layers, pp)
        assert layouts, (layers, pp)
        for first, last in layouts:
            mid = (layers - first - last) // (pp - 2)
            assert first + last + mid * (pp - 2) == layers and min(first, last, mid) >= 1  # Megatron's rule
    assert (2, 3) in pp_layouts(61, 16)  # DeepSeek-V3's own layout (middle stages of 4)


def test_search_over_uneven_vp_zero_equals_exhaustive() -> None:
    """Every candidate is evaluated exactly as a fresh Estimate would (shared profiles change
    nothing), and the ranking's head is the fastest fitting one of an independent sweep."""
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    m = load_model("llama3-8b").with_updates({"layer_num": 20})  # pp 8: [4, 2 x 6, 4]
    sy = load_system("a100_pcie")
    base = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 2048})
    space = SearchSpace(world_size=8, global_batch_size=16, tp=(1, 2), pp=(1, 2, 8), vp=(1, 2), zero=(0, 1), recompute=("none", "selective"))
    rows = run_search(m, sy, base, space, gmi_error=40)
    assert any(r.first_stage_layers for r in rows) and any(r.vp == 2 for r in rows) and {r.zero for r in rows} == {0, 1}
    budget = sy.mem_bytes - 40 * GIB
    fresh = []
    for r in rows:
        est = Estimate(m, StrategyConfig.init_from_dict(r.strategy), sy)
        peak = est.memory().peak_mem_with_reserved
        assert r.fits == (peak <= budget)
        if r.fits:
            assert r.iter_time == est.cost().duration_time_per_iter and r.peak_mem == peak
            fresh.append(r.iter_time)
    assert rows[0].iter_time == min(fresh)
    assert any(not r.fits for r in rows)  # the budget binds somewhere


def test_search_keeps_a_hierarchical_cp_base_valid() -> None:
    """An a2a+p2p base keeps its all-to-all level where it divides a candidate's CP size
    and rings over the rest (the gcd otherwise), so every CP size of the space is tried."""
    from simumax.search.space import SearchSpace, candidates

    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    base = load_strategy("tp1_pp1_dp8_mbs1").with_updates(
        {"seq_len": 32768, "cp_size": 8, "cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [4, 2]})
    space = SearchSpace(world_size=8, global_batch_size=8, tp=(1,), pp=(1,), cp=(1, 2, 4, 8), recompute=("none",))
    got = {st.cp_size: st.hierarchical_context_parallel_sizes for _, st in candidates(m, load_system("h100-sxm-80gb"), base, space)}
    assert got == {1: [1, 1], 2: [2, 1], 4: [4, 1], 8: [4, 2]}


def test_search_candidates_are_what_megatron_runs() -> None:
    """A base's overlap options go to the candidates Megatron accepts them on (validate_args):
    TP's communication overlap to TP > 1, the parameter gather's to ZeRO >= 1; an interleaved
    pipeline over two stages runs only with its P2P overlapped (over more, the base's choice)."""
    from simumax.search.space import SearchSpace, candidates

    m = load_model("llama3-8b").with_updates({"layer_num": 8})
    base = load_strategy("tp1_pp2_dp4_mbs1").with_updates(
        {"tp_size": 2, "world_size": 16, "tp_comm_overlap": True, "overlap_grad_reduce": True, "overlap_param_gather": True})
    assert not base.overlap_p2p_comm
    space = SearchSpace(world_size=16, global_batch_size=32, tp=(1, 2), pp=(2, 4), vp=(1, 2), zero=(0, 1), recompute=("none",))
    got = [st for _, st in candidates(m, load_system("h100-sxm-80gb"), base, space)]
    assert {(st.tp_size, st.tp_comm_overlap) for st in got} == {(1, False), (2, True)}
    assert {(st.zero_state, st.overlap_param_gather) for st in got} == {(0, False), (1, True)}
    assert {(st.pp_size, st.interleaving_size, st.overlap_p2p_comm) for st in got} == {
        (2, 1, False), (2, 2, True), (4, 1, False), (4, 2, False)}


def test_search_gives_windowed_and_sink_models_a_cp_scheme_te_runs() -> None:
    """TE refuses the default ring (p2p) for a sliding window and anything but a2a for
    attention sinks: the search tries those models' CP sizes under a2a, and keeps the base's
    all_gather for a window without sinks."""
    from simumax.search.space import SearchSpace, candidates

    system = load_system("h100-sxm-80gb")
    base = load_strategy({"seq_len": 32768, "world_size": 8, "ep_size": 8})
    space = SearchSpace(world_size=8, global_batch_size=8, tp=(1,), pp=(1,), ep=(8,), cp=(1, 2, 4), recompute=("none",))
    schemes = lambda m, b: {st.cp_size: st.cp_comm_type for _, st in candidates(m, system, b, space)}  # noqa: E731
    oss = load_model("gpt-oss-20b").with_updates({"layer_num": 2})
    assert base.cp_comm_type == "p2p" and schemes(oss, base) == {1: "p2p", 2: "a2a", 4: "a2a"}
    no_sinks = oss.with_updates({"attention_sinks": False})
    assert schemes(no_sinks, base.with_updates({"cp_comm_type": "all_gather"})) == {1: "all_gather", 2: "all_gather", 4: "all_gather"}
    assert schemes(no_sinks.with_updates({"window_size": None}), base) == {1: "p2p", 2: "p2p", 4: "p2p"}


# ---- resume, interruption, executors --------------------------------------------------------
def _small_search(tmp_path, **kw):
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    m = load_model("llama3-8b").with_updates({"layer_num": 8})
    space = SearchSpace(world_size=16, global_batch_size=32, tp=(1, 2), pp=(1, 2, 4), recompute=("none", "full_block"))
    return run_search(m, load_system("a100_pcie"), load_strategy("tp1_pp2_dp4_mbs1"), space, gmi_error=30, **kw)


def test_resume_keeps_rows_and_redoes_none(tmp_path, monkeypatch) -> None:
    import simumax.search.run as run_mod

    full = _small_search(tmp_path, jsonl=tmp_path / "full.jsonl")
    part = tmp_path / "part.jsonl"
    lines = (tmp_path / "full.jsonl").read_text().splitlines()
    part.write_text("\n".join(lines[:5]) + "\n" + lines[5][: len(lines[5]) // 2])  # a kill mid-line
    (tmp_path / "part.fingerprint.json").write_text((tmp_path / "full.fingerprint.json").read_text())  # the same search
    calls = []
    real = run_mod.evaluate
    monkeypatch.setattr(run_mod, "evaluate", lambda *a, **k: calls.append(1) or real(*a, **k))
    resumed = _small_search(tmp_path, jsonl=part, resume=True)
    assert len(calls) == len(full) - 5
    assert [r.to_dict() for r in resumed] == [r.to_dict() for r in full]
    assert part.read_text() == (tmp_path / "full.jsonl").read_text()  # ranked, byte-identical


def test_resume_refuses_another_searchs_rows_and_a_second_writer(tmp_path) -> None:
    from simumax.search import output_guard
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    jsonl = tmp_path / "out" / "search.jsonl"
    _small_search(tmp_path, jsonl=jsonl)
    space = SearchSpace(world_size=8, global_batch_size=32, tp=(1, 2), pp=(1, 2), recompute=("none",))
    other = load_model("llama2-tiny")
    with pytest.raises(ConfigError, match="another search's rows"):
        run_search(other, load_system("a100_pcie"), load_strategy("tp1_pp2_dp4_mbs1"), space, jsonl=jsonl, resume=True)
    (tmp_path / "out" / "search.fingerprint.json").unlink()
    with pytest.raises(ConfigError, match="no readable fingerprint"):
        _small_search(tmp_path, jsonl=jsonl, resume=True)
    with output_guard.locked(jsonl.parent):  # a search already writing there
        with pytest.raises(ConfigError, match="another search is writing"):
            _small_search(tmp_path, jsonl=jsonl)


def test_process_pool_gives_the_local_result(tmp_path) -> None:
    local = _small_search(tmp_path)
    pooled = _small_search(tmp_path, jobs=2, executor="process")
    assert [r.to_dict() for r in pooled] == [r.to_dict() for r in local]


def test_ray_executor_on_a_local_instance(tmp_path) -> None:
    pytest.importorskip("ray")
    local = _small_search(tmp_path)
    remote = _small_search(tmp_path, jobs=2, executor="ray")
    assert [r.to_dict() for r in remote] == [r.to_dict() for r in local]


SIGNAL_SEARCH = [
    sys.executable, "-m", "simumax.cli", "search", "-m", "llama3-70b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie",
    "--world-size", "64", "--gbs", "128", "--tp", "1,2,4,8", "--vp", "1,2", "--mbs", "1,2",
    "--recompute", "none,selective,full_block", "--zero", "0,1", "--gmi-error", "4",
]


def _interrupt(args: list[str], out, sig: int, min_rows: int) -> tuple[int, str]:
    """Start a search writing to ``out``, send ``sig`` once ``min_rows`` rows are on disk."""
    import subprocess
    import time

    proc = subprocess.Popen([*args, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jsonl = out / "search.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not jsonl.exists() or jsonl.read_text().count("\n") < min_rows):
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_sigint_leaves_valid_rows_and_resume_finishes(tmp_path) -> None:
    """A real SIGINT to a running `simumax search`: exit 130, every line a full row; the
    resumed run finishes with exactly the rows of an uninterrupted one."""
    import signal
    import subprocess

    args = SIGNAL_SEARCH
    out = tmp_path / "run"
    code, err = _interrupt(args, out, signal.SIGINT, 5)
    jsonl = out / "search.jsonl"
    assert code == 130, err
    assert "--resume" in err and "Traceback" not in err
    kept = jsonl.read_text().splitlines()
    assert len(kept) >= 5 and all(json.loads(line)["tp"] for line in kept)
    assert not (out / "search.csv").exists()  # nothing else written by an interrupted run
    done = subprocess.run([*args, "--out", str(out), "--resume", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fresh = subprocess.run([*args, "--out", str(tmp_path / "fresh"), "--json"], capture_output=True, text=True)
    assert json.loads(done.stdout) == json.loads(fresh.stdout)
    assert jsonl.read_bytes() == (tmp_path / "fresh" / "search.jsonl").read_bytes()
    assert len(json.loads(done.stdout)) > len(kept)


def test_frontier_is_pareto_and_plots(tmp_path) -> None:
    from simumax.report.frontier import pareto_frontier, plot_frontier

    rows = _small_search(tmp_path)
    front = pareto_frontier(rows)
    fit = [r for r in rows if r.fits]
    assert front and all(r.fits for r in front)
    for r in fit:  # every fitting row is matched or beaten by a frontier row using no more memory
        assert any(f.peak_mem <= r.peak_mem and f.tokens_per_s_per_gpu >= r.tokens_per_s_per_gpu for f in front)
    for a in front:  # and no frontier row is strictly dominated
        assert not any(r.peak_mem < a.peak_mem and r.tokens_per_s_per_gpu > a.tokens_per_s_per_gpu for r in fit)
    plot_frontier(rows, tmp_path / "f.png", 80 * GIB, "t")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_megatron_flags_for_uneven_interleaved_and_recompute() -> None:
    m = load_model("deepseek-v3")
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({
        "world_size": 256, "pp_size": 16, "ep_size": 8, "num_layers_in_first_pipeline_stage": 2,
        "num_layers_in_last_pipeline_stage": 3, "enable_recompute": True, "recompute_granularity": "full_block",
        "overlap_grad_reduce": True,
    })
    flags = " ".join(megatron_flags(st, m))
    for f in ("--decoder-first-pipeline-num-layers 2", "--decoder-last-pipeline-num-layers 3",
              "--recompute-num-layers 4", "--overlap-grad-reduce", "--pipeline-model-parallel-size 16"):
        assert f in flags, f
    vp = megatron_flags(load_strategy("tp1_pp4_vp2_sync_mbs1_mbc8_no_ckpt"), load_model("llama3-8b"))
    assert "--num-layers-per-virtual-pipeline-stage 4" in vp


def test_bad_search_inputs_are_config_errors() -> None:
    from simumax.search.space import SearchSpace

    with pytest.raises(ConfigError, match="recompute_search_type"):
        SearchSpace(world_size=8, global_batch_size=8, recompute=("sometimes",))
    with pytest.raises(ConfigError, match="search.tp"):
        SearchSpace(world_size=8, global_batch_size=8, tp=(0,))
    with pytest.raises(ConfigError, match="executor"):
        _small_search(None, executor="slurm")


def test_sigterm_stops_like_sigint(tmp_path) -> None:
    import signal

    code, err = _interrupt(SIGNAL_SEARCH, tmp_path / "run", signal.SIGTERM, 3)
    assert code == 130, err
    assert all(json.loads(line)["pp"] for line in (tmp_path / "run" / "search.jsonl").read_text().splitlines())


def test_cli_search_defaults_come_from_the_base_strategy() -> None:
    from tests.conftest import run_cli

    r = run_cli("search", "-m", "deepseek-v2-lite", "-s", "ep8_pp1_dp8_mbs1", "-y", "a100_pcie", "--world-size", "8",
                "--tp", "1", "--pp", "1", "--recompute", "none", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and {row["strategy"]["ep_size"] for row in rows} == {8}  # not ep=1 only
    tight = run_cli("search", "-m", "llama3-70b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--world-size", "8",
                    "--tp", "1", "--pp", "1", "--recompute", "none")
    assert tight.returncode == 0 and "nothing fits" in tight.stderr and "GiB more per GPU" in tight.stderr


def test_search_offload_dimension() -> None:
    """--offload tries host offloading as a dimension: every variant appears in the rows,
    labelled; optimizer offload needs the distributed optimizer (ZeRO >= 1) as in Megatron;
    offloading never raises a candidate's memory."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    m, y = load_model("llama3.1-70b"), load_system("h100-sxm-80gb")
    base = load_strategy("tp1_pp2_dp4_mbs1")
    space = SearchSpace(world_size=16, global_batch_size=64, tp=(8,), pp=(2,), recompute=("none",), zero=(0, 1),
                        offload=("none", "optimizer", "activations", "both"))
    rows = run_search(m, y, base, space)
    seen = {(r.zero, r.offload) for r in rows}
    assert seen == {(0, "none"), (0, "activations"), (1, "none"), (1, "optimizer"), (1, "activations"), (1, "both")}
    by = {(r.zero, r.offload): r for r in rows}
    assert all(by[(z, o)].peak_mem <= by[(z, "none")].peak_mem for z, o in seen)
    assert "offload:both" in by[(1, "both")].label and "offload" not in by[(1, "none")].label
    with pytest.raises(ConfigError, match="search.offload"):
        SearchSpace(world_size=16, global_batch_size=64, offload=("disk",))


def test_search_hsdp_replicas_dimension() -> None:
    """--replicas tries HSDP replica counts (fsdp_replicate_size) where they divide dp x cp
    and the state is sharded (ZeRO >= 1); rows say hsdpR."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    space = SearchSpace(world_size=128, global_batch_size=128, tp=(8,), pp=(1,), recompute=("full_block",), zero=(0, 1, 3),
                        replicas=(1, 2, 4))
    rows = run_search(load_model("llama3.1-70b"), load_system("h100-sxm-80gb"), load_strategy("tp1_pp2_dp4_mbs1"), space)
    assert {(r.zero, r.replicas) for r in rows} == {(0, 1), (1, 1), (1, 2), (1, 4), (3, 1), (3, 2), (3, 4)}
    assert all(("hsdp" in r.label) == (r.replicas > 1) for r in rows)
    assert all(r.strategy["fsdp_replicate_size"] == r.replicas for r in rows)


def test_empty_search_says_which_rule_stopped_it() -> None:
    """A space with no legal candidate names the rule its candidates broke most, and a
    space with no layout of the world size says so instead of blaming the batch."""
    from tests.conftest import run_cli

    out = run_cli("search", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "-y", "h100-sxm-80gb", "--world-size", "8",
                  "--tp", "1", "--pp", "2", "--zero", "2", "--fsdp", "deepspeed")
    assert out.returncode == 2 and "pp_size: DeepSpeed's pipeline engine runs ZeRO-1 only" in out.stderr
    out = run_cli("search", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "-y", "h100-sxm-80gb", "--world-size", "8", "--tp", "3")
    assert out.returncode == 2 and "--world-size: 8 is not a multiple of tp x pp x cp" in out.stderr


def test_search_without_a_base_strategy_takes_the_usual_one() -> None:
    """No -s: the dense base (tp1_pp1_dp8_mbs1) or, for a MoE model, the EP one, said on
    stderr; the rows are those of the search given that base explicitly."""
    from tests.conftest import run_cli

    args = ["-m", "llama3-8b", "-y", "h100-sxm-80gb", "--world-size", "8", "--gbs", "64", "--json"]
    implicit, explicit = run_cli("search", *args), run_cli("search", *args, "-s", "tp1_pp1_dp8_mbs1")
    assert implicit.returncode == explicit.returncode == 0
    assert "base strategy: tp1_pp1_dp8_mbs1" in implicit.stderr and "base strategy" not in explicit.stderr
    assert implicit.stdout == explicit.stdout
    moe = run_cli("search", "-m", "deepseek-v2-lite", "-y", "h100-sxm-80gb", "--world-size", "8", "--top", "1",
                  "--set", "model.layer_num=4")
    assert moe.returncode == 0 and "base strategy: ep8_pp1_dp8_mbs1" in moe.stderr


def test_a_search_leaves_nothing_for_the_cyclic_gc_and_restores_it() -> None:
    """The search runs its candidates with the cyclic collector paused (gc_pause.py): that
    is only sound while nothing it makes is cyclic, so a finished search must leave no
    cyclic garbage; and the collector comes back as the caller had it, also on a
    ConfigError mid-way."""
    import gc

    from simumax.gc_pause import cyclic_gc_paused
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    perf = _perf()
    space = SearchSpace(world_size=8, global_batch_size=16, tp=(1, 2), vp=(1, 2), recompute=("none", "full_block"), zero=(0, 1))
    gc.collect()
    gc.disable()
    try:
        rows = run_search(perf.model_config, perf.system_config, perf.strategy_config, space, gmi_error=4)
        assert rows and not gc.isenabled()  # a caller's disabled collector stays disabled
        del rows
        assert gc.collect() == 0
    finally:
        gc.enable()
    run_search(perf.model_config, perf.system_config, perf.strategy_config, space, gmi_error=4)
    assert gc.isenabled()
    with pytest.raises(ConfigError):
        with cyclic_gc_paused():
            assert not gc.isenabled()
            with cyclic_gc_paused():  # nested: the outer one restores
                pass
            assert not gc.isenabled()
            raise ConfigError("x", "y")
    assert gc.isenabled()


def test_search_rows_say_when_their_passes_are_host_bound() -> None:
    """Each fitting row carries its estimate's host issue share (the busiest rank's
    StageCost.host_issue over its passes' GPU time); the table marks the rows at or past 1
    and says what the mark means."""
    from rich.console import Console

    from simumax.report.format import search_table
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    m = load_model("qwen3-30b-a3b").with_updates({"layer_num": 4})
    sy = load_system("b200-sxm-180gb")
    base = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": 2048})
    rows = run_search(m, sy, base, SearchSpace(world_size=8, global_batch_size=32, tp=(1, 4), pp=(1,), ep=(8,), recompute=("none",)))
    fit = [r for r in rows if r.fits]
    assert len(fit) == 2
    for r in fit:
        cost = Estimate(m, StrategyConfig.init_from_dict(r.strategy), sy).cost()
        assert r.host_issue_share == max(s.host_issue / (s.fwd + s.bwd + s.recompute) for s in cost.stages)  # by hand
    shares = {r.tp: r.host_issue_share for r in fit}
    assert shares[1] < 1.0 <= shares[4]  # TP 4 splits the small experts' and attention's GEMMs 4 ways
    console = Console(width=200, record=True)
    console.print(search_table(fit, sy.mem_bytes, 0.0))
    text = " ".join(console.export_text().split())  # the caption wraps at the table's width
    assert text.count("*") == 2 and "host-bound, slower than shown" in text  # the TP 4 row's mark and the caption
