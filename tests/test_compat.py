"""SimuMax scripts run unchanged: its import paths and helper names, PerfLLM's attribute
names, configs edited in place (issue 21, part 1 and the live configs of part 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs


def test_simumax_import_paths_and_preset_helpers(capsys: pytest.CaptureFixture[str]) -> None:
    # the first lines of SimuMax's examples and tutorial
    from simumax.core.config import ModelConfig, StrategyConfig, SystemConfig
    from simumax.core.perf_llm import PerfLLM
    from simumax.utils import (get_simu_model_config, get_simu_strategy_config, get_simu_system_config, show_simu_models,
                               show_simu_strategy, show_simu_system)

    import simumax

    assert ModelConfig is simumax.ModelConfig and PerfLLM is simumax.PerfLLM  # one implementation
    model_path = get_simu_model_config("llama3-8b")
    assert Path(model_path).is_file() and json.loads(Path(model_path).read_text())["hidden_size"] == 4096
    perf = PerfLLM()
    perf.configure(
        strategy_config=StrategyConfig.init_from_config_file(get_simu_strategy_config("tp1_pp2_dp4_mbs1")),
        model_config=ModelConfig.init_from_config_file(model_path),
        system_config=SystemConfig.init_from_config_file(get_simu_system_config("a100_pcie")),
    )
    perf.run_estimate()
    assert perf.analysis_cost().duration_time_per_iter > 0
    assert perf.system is perf.system_config and perf.strategy is perf.strategy_config  # SimuMax's attribute names
    assert "llama3-8b" in show_simu_models() and "a100_pcie" in show_simu_system() and show_simu_strategy()
    assert "llama3-8b" in capsys.readouterr().out
    from simumax.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown preset"):
        get_simu_model_config("no-such-model")


def test_fake_tensor() -> None:
    from simumax.core.tensor import FakeTensor
    from simumax.errors import ConfigError

    t = FakeTensor((4, 1024, 8192), "bf16")
    assert t.numel() == 4 * 1024 * 8192 and t.nbytes == 2 * t.numel() and t.size(1) == 1024
    with pytest.raises(ConfigError, match="dtype"):
        FakeTensor((1,), "complex")


def test_op_graph_as_graphviz_dot(tmp_path: Path) -> None:
    from simumax import PerfLLM
    from simumax.core.graph import SimuONNXGraphBuilder, visualize_with_graphviz
    from simumax.errors import ConfigError

    perf = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b", system_config="a100_pcie")
    g = SimuONNXGraphBuilder(perf).build(stage=1)
    names = [n for n, _ in g.nodes]
    assert names[0] == "L16.attn_norm" and names[-1] == "loss" and len(names) == len(perf.estimate.stages[1].ops)
    edges = {(a, b) for a, b, _ in g.edges}
    assert ("L16.qkv", "L16.rope") in edges and ("lm_head", "loss") in edges  # tensor edges from the IR
    dot = g.to_dot()
    assert dot.startswith('digraph "stage1" {') and '"L16.fc1" [label="L16.fc1\\nfc1\\n' in dot
    out = visualize_with_graphviz(g, tmp_path / "stage1")
    assert out.exists() and (tmp_path / "stage1.dot").read_text() == dot
    with pytest.raises(ConfigError, match="stage"):
        SimuONNXGraphBuilder(perf).build(stage=5)


def test_configs_edited_in_place_take_effect() -> None:
    from simumax import ConfigError, PerfLLM

    perf = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b", system_config="a100_pcie")
    perf.run_estimate()
    t32 = perf.analysis_cost().duration_time_per_iter
    perf.model_config.layer_num = 16  # SimuMax scripts edit the config objects
    t16 = perf.analysis_cost().duration_time_per_iter
    assert t16 < t32
    # an entry of a measured efficiency table changed in place (a dict inside the system)
    table = perf.system.accelerator.op["matmul"].accurate_efficient_factor
    for key in table:
        table[key] /= 2
    assert perf.analysis_cost().duration_time_per_iter > t16
    st = perf.strategy
    st.pp_size = 16  # not legal with world 8 yet ...
    st.world_size = 16  # ... until this: order does not matter
    assert (st.pp_size, st.world_size) == (16, 16)
    with pytest.raises(ConfigError, match="tp_size"):
        st.tp_size = -1
    assert st.tp_size == 1  # a refused value leaves the config unchanged
    st.pp_size = 3
    with pytest.raises(ConfigError, match="world_size"):  # still broken when used
        perf.analysis_cost()


def test_usability_one_command_answers() -> None:
    """Issue 24's first questions: the version, a job sized by GPUs and global batch, nested
    --set, time and GPU-hours for a token budget."""
    from tests.conftest import run_cli

    v = run_cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("simumax ")
    base = ["perf", "-m", "llama3-70b", "-y", "h100-sxm-80gb", "-s", "tp1_pp2_dp4_mbs1", "--world-size", "64", "--gbs", "512",
            "--set", "tp_size=8", "--set", "pp_size=4"]
    r = run_cli(*base, "--set", "system.accelerator.mem_gbs=96", "--tokens", "1e12", "--gpu-hour-price", "2", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["mem"]["capacity"] == 96 * 2**30
    t = d["training"]
    step = d["cost"]["duration_time_per_iter"]
    steps = 1e12 / (512 * 4096)  # dp 2 x mbs 1 x 256 micro-batches = 512 sequences of 4096 tokens
    assert t["steps"] == pytest.approx(steps) and t["seconds"] == pytest.approx(steps * step)
    assert t["gpu_hours"] == pytest.approx(steps * step * 64 / 3600) and t["cost"] == pytest.approx(2 * t["gpu_hours"])
    assert d["params"]["total"] > 70e9
    bad = run_cli(*base[:-4], "--gbs", "500")
    assert bad.returncode == 2 and "--gbs" in bad.stderr
    assert run_cli(*base[:-4], "--set", "system.accelerator.no_such=1").returncode == 2


def test_job_size_options_complete_a_strategy_file_before_its_rules_are_checked(tmp_path: Path) -> None:
    """A strategy file written without the job size (world_size then defaults to 8, the
    micro-batch count to 1) runs with --world-size / --gbs / --set that make it whole: the
    cross-field rules hold for the job as run, and an error names the file and the options."""
    from simumax.cli.options import load_job
    from simumax.config.loader import load_strategy
    from simumax.errors import ConfigError
    from tests.conftest import run_cli

    path = tmp_path / "tp8_pp4_vp2.json"
    path.write_text(json.dumps({"seq_len": 4096, "tp_size": 8, "pp_size": 4, "interleaving_size": 2,
                                "enable_sequence_parallel": True}))
    with pytest.raises(ConfigError, match="world_size: must be divisible by tp"):
        load_strategy(str(path))  # as the file stands: 8 GPUs cannot hold tp 8 x pp 4
    _, st, _ = load_job("llama3-70b", str(path), "h100-sxm-80gb", [], world_size=256, gbs=512)
    assert (st.world_size, st.dp_size, st.micro_batch_num, st.global_batch_size) == (256, 8, 64, 512)
    _, st2, _ = load_job("llama3-70b", str(path), "h100-sxm-80gb", ["strategy.tp_size=4"], world_size=256, gbs=512)
    assert (st2.dp_size, st2.micro_batch_num) == (16, 32)  # --gbs follows the DP the --set made
    with pytest.raises(ConfigError, match=r"tp8_pp4_vp2.json with --gbs: world_size"):
        load_job("llama3-70b", str(path), "h100-sxm-80gb", [], gbs=512)
    with pytest.raises(ConfigError, match="micro_batch_num: the interleaved schedule needs at least pp_size = 4"):
        load_job("llama3-70b", str(path), "h100-sxm-80gb", [], world_size=256)  # one micro-batch, interleaved
    r = run_cli("perf", "-m", "llama3-70b", "-y", "h100-sxm-80gb", "-s", str(path), "--world-size", "256", "--gbs", "512",
                "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cost"]["duration_time_per_iter"] > 0
    # as a search's base it describes a job on the searched cluster
    r = run_cli("search", "-m", "llama3-8b", "-y", "h100-sxm-80gb", "-s", str(path), "--world-size", "64", "--gbs", "128",
                "--tp", "8", "--pp", "4", "--vp", "2", "--recompute", "none", "--json")
    assert r.returncode == 0, r.stderr


@settings(max_examples=40, deadline=None)
@given(tp=hs.sampled_from([1, 2, 4, 8]), pp=hs.sampled_from([1, 2, 4]), vp=hs.sampled_from([1, 2]),
       dp=hs.sampled_from([1, 2, 3, 8]), mbs=hs.sampled_from([1, 2]), steps=hs.integers(1, 6),
       file_world=hs.sampled_from([None, 8, 12]), file_mbc=hs.sampled_from([None, 1, 5]))
def test_job_size_options_give_the_strategy_written_whole(tp, pp, vp, dp, mbs, steps, file_world, file_mbc) -> None:
    """Whatever job size a strategy file states (or leaves out), --world-size and --gbs give
    the strategy a file stating the job whole would: the options come before the rules."""
    import tempfile

    from simumax.cli.options import load_job
    from simumax.config.loader import load_strategy

    vp = vp if pp > 1 else 1
    gbs = mbs * dp * pp * steps  # a multiple of pp micro-batches: the interleaved schedule's group
    body = {"seq_len": 2048, "tp_size": tp, "pp_size": pp, "interleaving_size": vp, "micro_batch_size": mbs,
            "enable_sequence_parallel": tp > 1}
    whole = load_strategy({**body, "world_size": tp * pp * dp, "micro_batch_num": gbs // (mbs * dp)})
    partial = {**body, **({"world_size": file_world} if file_world else {}), **({"micro_batch_num": file_mbc} if file_mbc else {})}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.json"
        path.write_text(json.dumps(partial))
        _, got, _ = load_job("llama3-8b", str(path), "a100_pcie", [], world_size=tp * pp * dp, gbs=gbs)
    assert got == whole


def test_rules_between_fields_are_checked_at_use_as_simumax_does(tmp_path: Path) -> None:
    """SimuMax checks a strategy when it is used (its sanity_check), so its scripts load a file
    and then set what completes it; a rule still broken then raises from the estimate, naming
    the file, and every field is still checked on load."""
    from simumax.core.config import StrategyConfig
    from simumax.core.perf_llm import PerfLLM
    from simumax.errors import ConfigError

    path = tmp_path / "tp8_pp4.json"
    path.write_text(json.dumps({"seq_len": 4096, "tp_size": 8, "pp_size": 4, "micro_batch_num": 8,
                                "enable_sequence_parallel": True}))
    st = StrategyConfig.init_from_config_file(str(path))  # world_size 8 (SimuMax's default): tp 8 x pp 4 waits
    st.world_size = 64
    perf = PerfLLM().configure(strategy_config=st, model_config="llama3-70b", system_config="a100_pcie")
    one = perf.analysis_cost().duration_time_per_iter
    whole = dict(json.loads(path.read_text()), world_size=64)
    assert one == PerfLLM().configure(strategy_config=whole, model_config="llama3-70b",
                                      system_config="a100_pcie").analysis_cost().duration_time_per_iter
    perf2 = PerfLLM().configure(strategy_config=str(path), model_config="llama3-70b", system_config="a100_pcie")
    perf2.strategy.world_size = 64  # edited after configure, as SimuMax's tutorial does
    assert perf2.analysis_cost().duration_time_per_iter == one
    broken = StrategyConfig.init_from_config_file(str(path))
    with pytest.raises(ConfigError, match=r"tp8_pp4.json: world_size: must be divisible by tp\*cp\*pp = 32 \(got 8\)"):
        PerfLLM().configure(strategy_config=broken, model_config="llama3-70b", system_config="a100_pcie").run_estimate()
    with pytest.raises(ConfigError, match="tp8_pp4.json: world_size"):
        broken.sanity_check()
    path.write_text(json.dumps({"seq_len": 4096, "tp_size": "8"}))
    with pytest.raises(ConfigError, match="tp_size"):  # a field's own check does not wait
        StrategyConfig.init_from_config_file(str(path))


def test_compare_strategies_side_by_side(tmp_path: Path) -> None:
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate
    from tests.conftest import run_cli

    r = run_cli("compare", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp2_pp1_dp4_mbs1", "--vary", "tp_size=4",
                "--json", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    a, b = d["strategies"]
    assert a["global_batch_size"] == b["global_batch_size"] == 32  # the first strategy's batch for both
    # the TP4 variant is the same estimate as TP4 set by hand with the micro-batch count for that batch
    st = load_strategy("tp2_pp1_dp4_mbs1").with_updates({"tp_size": 4, "micro_batch_num": 16})
    ref = Estimate(load_model("llama3-8b"), st, load_system("a100_pcie")).cost()
    assert b["cost"]["duration_time_per_iter"] == pytest.approx(ref.duration_time_per_iter)
    for part, delta in b["breakdown_delta"].items():
        assert delta == pytest.approx(b["cost"]["breakdown"].get(part, 0.0) - a["cost"]["breakdown"].get(part, 0.0))
    assert (tmp_path / "compare.png").stat().st_size > 0 and (tmp_path / "compare.json").exists()
    text = run_cli("compare", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp2_pp1_dp4_mbs1", "-s", "tp1_pp2_dp4_mbs1").stdout
    assert "tp1_pp2_dp4_mbs1" in text and "iteration time" in text and "tp_comm (ms)" in text
    bad = run_cli("compare", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp2_pp1_dp4_mbs1", "--vary", "tp_size")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --vary: expected key=value")
    one = run_cli("compare", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp2_pp1_dp4_mbs1")
    assert one.returncode == 2 and "--strategy" in one.stderr
    # one strategy on two systems: each row is that system's own estimate of the same job
    r = run_cli("compare", "-m", "llama3-8b", "-y", "h100-sxm-80gb", "-y", "b200-sxm-180gb", "-s", "tp2_pp1_dp4_mbs1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["strategies"]
    assert [x["label"] for x in rows] == ["tp2_pp1_dp4_mbs1 @ h100-sxm-80gb", "tp2_pp1_dp4_mbs1 @ b200-sxm-180gb"]
    for x, sy in zip(rows, ("h100-sxm-80gb", "b200-sxm-180gb")):
        ref = Estimate(load_model("llama3-8b"), load_strategy("tp2_pp1_dp4_mbs1"), load_system(sy)).cost()
        assert x["cost"]["duration_time_per_iter"] == pytest.approx(ref.duration_time_per_iter, rel=1e-9)  # JSON keeps 12 digits


def test_every_job_command_takes_the_job_size(tmp_path: Path) -> None:
    """compare, simulate and export take --world-size and --gbs as perf does: the same
    strategy as the one --set would give (DP from the world size, the count from the batch)."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate
    from tests.conftest import run_cli

    r = run_cli("compare", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp2_pp1_dp4_mbs1", "-s", "tp4_pp1_dp2_mbs1",
                "--world-size", "32", "--gbs", "256", "--json")
    assert r.returncode == 0, r.stderr
    for row, (tp, dp) in zip(json.loads(r.stdout)["strategies"], ((2, 16), (4, 8))):
        assert row["global_batch_size"] == 256
        st = load_strategy("tp2_pp1_dp4_mbs1").with_updates({"tp_size": tp, "world_size": 32, "micro_batch_num": 256 // dp})
        ref = Estimate(load_model("llama3-8b"), st, load_system("a100_pcie")).cost().duration_time_per_iter
        assert row["cost"]["duration_time_per_iter"] == pytest.approx(ref, rel=1e-9)
    both = run_cli("compare", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp2_pp1_dp4_mbs1", "-s", "tp4_pp1_dp2_mbs1",
                   "--gbs", "64", "--keep-micro-batches")
    assert both.returncode == 2 and "--gbs" in both.stderr and "Traceback" not in both.stderr
    sim = run_cli("simulate", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp1_pp2_dp4_mbs1", "--world-size", "16",
                  "--gbs", "64", "--no-ops", "--json", "--out", str(tmp_path))
    assert sim.returncode == 0, sim.stderr
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"world_size": 16, "micro_batch_num": 8})
    ref = Estimate(load_model("llama3-8b"), st, load_system("a100_pcie")).cost().duration_time_per_iter
    assert json.loads(sim.stdout)["closed_form_time_per_iter"] == pytest.approx(ref, rel=1e-9)
    flags = json.loads(run_cli("export", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "--world-size", "64", "--gbs", "512",
                               "--json").stdout)
    assert "--global-batch-size 512" in flags
    bad = run_cli("export", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "--world-size", "64", "--gbs", "100")
    assert bad.returncode == 2 and "--gbs" in bad.stderr


def test_system_queries_by_hand() -> None:
    """SimuMax's SystemConfig.real_comm_bw / compute_op_accuracy_time / miss_efficiency,
    derived by hand from the preset's fields."""
    from simumax.config.loader import load_system
    from simumax.errors import ConfigError

    h100 = load_system("h100-sxm-80gb")  # NVLink tier: 450 GB/s, all-reduce eff 0.8, 2 us per ring step + 8 us per call
    size, n = 2.0**30, 8
    moved = size * 2 * (n - 1) / n  # NCCL's bus bytes of an all-reduce
    t = moved / (450e9 * 0.8) + (2 * (n - 1) * 2.0 + 8.0) * 1e-6
    assert h100.real_comm_bw("all_reduce", size, n) == pytest.approx(moved / t, rel=1e-12)
    # a named tier of the same kind: 8 ranks on the NICs, flat ring: 50 GB/s, eff 0.85, 5 us x 7 + 20 us
    t_ib = size * 7 / 8 / (50e9 * 0.85) + (7 * 5.0 + 20.0) * 1e-6
    assert h100.real_comm_bw("all_gather", size, 8, net="inter_node") == pytest.approx(size * 7 / 8 / t_ib, rel=1e-12)
    assert h100.real_comm_bw("all_reduce", 1e3, 8) < h100.real_comm_bw("all_reduce", 1e9, 8)  # latency-bound small calls

    a100 = load_system("a100_pcie")
    table = a100.accelerator.op["matmul"].accurate_efficient_factor
    key, eff = next(iter(table.items()))
    peak = a100.accelerator.op["matmul"].tflops * 1e12
    assert a100.compute_op_accuracy_time("matmul", key, 1e12) == pytest.approx(1e12 / (peak * eff), rel=1e-12)
    # a key the table holds: what its neighbours would give without it, not the entry itself
    miss = a100.miss_efficiency("matmul", key)
    assert miss != eff and 0.5 * eff < miss < 1.5 * eff
    # a key the table lacks: the efficiency the estimate uses for it
    other = key.replace("m=4096", "m=4000")
    assert other not in table
    assert a100.compute_op_accuracy_time("matmul", other, 1e12) == pytest.approx(1e12 / (peak * a100.miss_efficiency("matmul", other)))
    for bad in (lambda: a100.real_comm_bw("broadcast", 1e6, 8), lambda: a100.real_comm_bw("all_reduce", 1e6, 0),
                lambda: a100.real_comm_bw("all_reduce", 1e6, 8, net="nvlink9"), lambda: a100.miss_efficiency("gemm", key)):
        with pytest.raises(ConfigError):
            bad()


def test_random_in_place_edits_never_leave_a_stale_result() -> None:
    """Edits in place between analysis calls (fields of the three configs, a nested tier,
    an efficiency table entry), each checked against a fresh estimate of copies of the
    configs: PerfLLM's change check (config/base.Fingerprint) never answers from a stale
    estimate."""
    import copy
    import random

    from simumax import ConfigError, PerfLLM

    rng = random.Random(7)
    perf = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b", system_config="a100_pcie")
    perf.run_estimate()
    for _ in range(40):
        m, st, sy = perf.model_config, perf.strategy_config, perf.system_config
        r = rng.random()
        try:
            if r < 0.25:
                st.micro_batch_num = rng.choice([4, 8, 16])
            elif r < 0.5:
                table = sy.accelerator.op["matmul"].accurate_efficient_factor
                f = rng.uniform(0.8, 1.2)
                for key in table:  # inside a dict: no assignment counted
                    table[key] = min(0.95, table[key] * f)
            elif r < 0.65:
                m.layer_num = rng.choice([8, 16, 32])
            elif r < 0.8:
                tier = sy.networks.tiers[rng.choice(sorted(sy.networks.tiers))]
                tier.bandwidth.gbps = rng.uniform(50, 300)
            elif r < 0.9:
                sy.accelerator.op["matmul"].efficient_factor = rng.uniform(0.5, 0.9)
        except ConfigError:
            pass
        got = (perf.analysis_cost().duration_time_per_iter, perf.analysis_mem().peak_mem)
        fresh = PerfLLM().configure(strategy_config=copy.deepcopy(st), model_config=copy.deepcopy(m), system_config=copy.deepcopy(sy))
        assert got == (fresh.analysis_cost().duration_time_per_iter, fresh.analysis_mem().peak_mem)
