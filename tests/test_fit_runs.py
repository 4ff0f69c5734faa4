"""`simumax fit-runs`: a system's resources fitted to measured runs (simumax/fit_runs.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.fit_runs import FACTOR_RANGE, Run, _times, fit_file, fit_system, scaled
from tests.conftest import VALIDATION, needs_shared, run_cli

MODEL = load_model("llama3-8b").with_updates({"layer_num": 4})
BASE = load_system("h100-sxm-80gb")
JOBS = [  # one GPU, one node's TP, DP across nodes, TP x PP across nodes, short sequences, TP4 x DP8
    {"world_size": 1, "micro_batch_num": 4},
    {"world_size": 8, "tp_size": 8, "micro_batch_num": 4},
    {"world_size": 16, "micro_batch_num": 2},
    {"world_size": 16, "tp_size": 2, "pp_size": 2, "micro_batch_num": 8},
    {"world_size": 1, "seq_len": 1024, "micro_batch_size": 8, "micro_batch_num": 2},
    {"world_size": 32, "tp_size": 4, "micro_batch_num": 2},
]
STRATEGIES = [load_strategy("tp1_pp1_dp8_mbs1").with_updates(j) for j in JOBS]


def _runs(truth: dict[str, float], jobs: range | list[int] = range(len(JOBS))) -> list[Run]:
    """The jobs as measured on a cluster whose resources are ``truth`` x the base's."""
    strategies = [STRATEGIES[i] for i in jobs]
    real = _times([Run("", MODEL, s, 1.0) for s in strategies], scaled(BASE, truth))
    return [Run(f"job{i}", MODEL, s, t) for i, s, t in zip(jobs, strategies, real)]


def test_recovers_the_resources_a_cluster_was_made_of() -> None:
    """Runs timed on the base with tensor-core efficiency x0.9, HBM x1.15, NVLink x0.8 and
    NICs x0.7: with a weak prior the fit finds those factors and every run's time again."""
    truth = {"compute": 0.9, "hbm": 1.15, "scale_up": 0.8, "scale_out": 0.7}
    res = fit_system(_runs(truth), BASE, prior_sd=2.0, noise_sd=0.005)
    for k, f in truth.items():
        assert res.factors[k] == pytest.approx(f, rel=0.01), (k, res.factors)
    before = [abs(r.before / r.measured - 1) for r in res.rows]
    assert max(before) > 0.05  # the base was off
    for r in res.rows:
        assert r.after == pytest.approx(r.measured, rel=1e-3)
        assert r.loo == pytest.approx(r.measured, rel=1e-3)  # each run predicted by the others' fit


def test_measured_as_predicted_fits_the_base_itself() -> None:
    res = fit_system(_runs({}), BASE)
    assert all(f == pytest.approx(1.0, abs=1e-9) for f in res.factors.values())
    assert all(r.after == pytest.approx(r.measured, rel=1e-12) for r in res.rows)


def test_a_resource_no_run_uses_stays_at_the_base_with_the_priors_spread() -> None:
    """Runs inside one node say nothing of the NICs: kept x1, posterior spread = the prior's,
    and a note says so."""
    res = fit_system(_runs({"compute": 0.85, "scale_out": 0.5}, [0, 1, 4]), BASE, prior_sd=0.3)
    assert res.factors["scale_out"] == 1.0
    assert res.sd["scale_out"] == pytest.approx(0.3)
    assert any("scale-out links: no run depends on it" in n for n in res.notes)
    assert res.sd["compute"] < 0.3  # what the runs do see is pinned down


def test_leave_one_out_is_the_fit_without_the_run() -> None:
    """The linearised leave-one-out prediction matches refitting without the run (the
    truth lies off the model: each run's time x its own noise)."""
    runs = _runs({"compute": 0.92, "scale_up": 0.85})
    noisy = [Run(r.id, r.model, r.strategy, r.seconds * (1 + e)) for r, e in zip(runs, (0.03, -0.02, 0.01, 0.04, -0.03, 0.0))]
    res = fit_system(noisy, BASE)
    for i in (0, 3):
        alone = fit_system(noisy[:i] + noisy[i + 1:], BASE)
        exact = _times([noisy[i]], alone.system)[0]
        assert res.rows[i].loo == pytest.approx(exact, rel=2e-3)


def test_fitted_system_keeps_peaks_and_reloads(tmp_path: Path) -> None:
    """Tensor cores are fitted as efficiencies: the peaks (MFU's denominator) stay the
    datasheet's; the written file loads back and predicts the fitted times."""
    res = fit_system(_runs({"compute": 0.9}, [0, 1]), BASE, resources=("compute",))
    assert res.factors["compute"] < 1
    for fam, spec in res.system.accelerator.op.items():
        assert spec.tflops == BASE.accelerator.op[fam].tflops
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(res.system.model_dump()))
    again = load_system(str(path))
    assert _times([r for r in _runs({}, [0, 1])], again) == pytest.approx([r.after for r in res.rows], rel=1e-12)
    assert again.sys_name == "h100-sxm-80gb fitted to 2 runs"


@settings(max_examples=10, deadline=None)
@given(scale=hs.floats(0.05, 20.0))
def test_factors_stay_in_range_whatever_the_times(scale: float) -> None:
    runs = [Run(r.id, r.model, r.strategy, r.seconds * scale) for r in _runs({}, [0, 2])]
    res = fit_system(runs, BASE, prior_sd=2.0)
    lo, hi = FACTOR_RANGE
    assert all(lo * (1 - 1e-9) <= f <= hi * (1 + 1e-9) for f in res.factors.values())
    assert all(math.isfinite(r.loo) and r.loo > 0 for r in res.rows)


def test_bad_input_is_one_config_error(tmp_path: Path) -> None:
    runs = _runs({}, [0])
    with pytest.raises(ConfigError, match="resources"):
        fit_system(runs, BASE, resources=("tensor",))
    with pytest.raises(ConfigError, match="noise_sd"):
        fit_system(runs, BASE, noise_sd=0.0)
    empty = tmp_path / "none.jsonl"
    empty.write_text(json.dumps({"id": "a", "system": "a100_pcie", "model": "llama3-8b", "strategy": "tp1_pp2_dp4_mbs1",
                                 "measured": {"peak_alloc_gib": 40.0}}) + "\n")
    with pytest.raises(ConfigError, match="iter_time_ms"):
        fit_file(empty)


def _case(i: int, system: str, ms: float) -> str:
    return json.dumps({"id": f"run{i}", "system": system, "model": "llama3-8b", "strategy": "tp1_pp2_dp4_mbs1",
                       "measured": {"iter_time_ms": ms}})


def test_cli_writes_the_system_and_its_fit(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(_case(i, "a100_pcie", ms) for i, ms in enumerate((5900.0, 6000.0))) + "\n")
    out = tmp_path / "fit" / "my_cluster.json"
    res = run_cli("fit-runs", str(runs), "--out", str(out), "--resource", "compute")
    assert res.returncode == 0, res.stderr
    assert "tensor cores" in res.stdout and "left out" in res.stdout
    assert (tmp_path / "fit" / "my_cluster.fit.png").read_bytes()[:4] == b"\x89PNG"
    fit = json.loads((tmp_path / "fit" / "my_cluster.fit.json").read_text())
    assert [r["key"] for r in fit["resources"]] == ["compute"] and fit["resources"][0]["factor"] < 1
    perf = run_cli("perf", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", str(out), "--json")
    assert perf.returncode == 0, perf.stderr
    t = json.loads(perf.stdout)["cost"]["duration_time_per_iter"]
    assert t == pytest.approx(fit["runs"][0]["after"], rel=1e-9)
    v = run_cli("validate", str(runs), "--system", str(out), "--json")  # the runs again, on the fitted system
    assert v.returncode == 0, v.stderr
    assert [c["predicted_time"] for c in json.loads(v.stdout)["cases"]] == pytest.approx([r["after"] for r in fit["runs"]], rel=1e-9)
    again = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "again.json"), "--system", str(out), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["sys_name"] == "a100_pcie_bf16 fitted to 2 runs"


def test_cli_refuses_runs_of_two_clusters(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text(_case(0, "a100_pcie", 6000.0) + "\n" + _case(1, "h100-sxm-80gb", 3000.0) + "\n")
    res = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "x.json"))
    assert res.returncode == 2
    assert "2 systems" in res.stderr and "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()
    bad = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "x.json"), "--system", "a100_pcie", "--plot-format", "gif")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --plot-format")
    ok = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "x.json"), "--system", "a100_pcie", "--json",
                 "--plot-format", "none")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["base"] == "a100_pcie_bf16" and not (tmp_path / "x.fit.png").exists()


@needs_shared
@pytest.mark.parametrize("name", ["b200_megatron", "a100_pcie_megatron"])
def test_left_out_runs_of_a_measured_cluster_gain(name: str) -> None:
    """On each shipped cluster, every run predicted by a fit on the others is on average
    nearer its measurement than the base system's prediction (docs/validation.md, "Fitted
    to a cluster's own runs": 2.7 -> 2.0 % and 2.4 -> 1.7 %)."""
    res = fit_file(VALIDATION / f"{name}.jsonl")
    mean = lambda key: sum(abs(getattr(r, key) / r.measured - 1) for r in res.rows) / len(res.rows)  # noqa: E731
    print(f"{name}: mean |err| base {mean('before'):.2%}, left out {mean('loo'):.2%}, fitted {mean('after'):.2%}")
    assert mean("loo") < mean("before")
    assert mean("after") <= mean("loo")
    assert mean("loo") < 0.025


def test_runs_that_give_their_system_inline_fit_it(tmp_path: Path) -> None:
    """A case may carry its system as a JSON object: the same object on every run is one
    cluster (fitted as such), two different ones are refused."""
    sy = load_system("a100_pcie").model_dump()
    runs = tmp_path / "runs.jsonl"
    line = lambda i, system, ms: json.dumps({"id": f"r{i}", "system": system, "model": "llama3-8b",  # noqa: E731
                                             "strategy": "tp1_pp2_dp4_mbs1", "measured": {"iter_time_ms": ms}})
    runs.write_text(line(0, sy, 5800.0) + "\n" + line(1, sy, 5900.0) + "\n")
    assert fit_file(runs, resources=("compute",)).factors["compute"] < 1
    other = {**sy, "sys_name": "other"}
    runs.write_text(line(0, sy, 5800.0) + "\n" + line(1, other, 5900.0) + "\n")
    with pytest.raises(ConfigError, match="2 systems"):
        fit_file(runs)


def test_config_paths_of_a_users_runs_file_are_beside_it(tmp_path: Path) -> None:
    """A runs file outside shared/validation names its configs relative to its own folder."""
    (tmp_path / "model.json").write_text(json.dumps(load_model("llama3-8b").to_dict()))
    (tmp_path / "gpu.json").write_text(json.dumps(load_system("a100_pcie").model_dump()))
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"id": "a", "system": "gpu.json", "model": "model.json", "strategy": "tp1_pp2_dp4_mbs1",
                                "measured": {"iter_time_ms": 5800.0}}) + "\n")
    v = run_cli("validate", str(runs), "--json")
    assert v.returncode == 0, v.stderr
    assert json.loads(v.stdout)["cases"][0]["predicted_time"] > 0
    assert fit_file(runs, resources=("compute",)).rows[0].measured == 5.8
    # the strategy by file name too, and every run grouped by its fields
    (tmp_path / "st.json").write_text(json.dumps(load_strategy("tp1_pp2_dp4_mbs1").to_dict()))
    runs.write_text(runs.read_text() + json.dumps({"id": "b", "system": "gpu.json", "model": "model.json",
                                                   "strategy": "st.json", "measured": {"iter_time_ms": 5900.0}}) + "\n")
    v = run_cli("validate", str(runs), "--json")
    assert v.returncode == 0, v.stderr
    a, b = json.loads(v.stdout)["cases"]
    assert a["predicted_time"] == b["predicted_time"] and a["group"] == b["group"] and a["step_group"] == b["step_group"]


def test_a_users_runs_get_one_summary_and_a_bad_run_is_named(tmp_path: Path) -> None:
    runs = tmp_path / "runs.jsonl"
    runs.write_text("\n".join(_case(i, "a100_pcie", ms) for i, ms in enumerate((5900.0, 6000.0))) + "\n")
    v = run_cli("validate", str(runs), "--out", str(tmp_path / "val"))
    assert v.returncode == 0, v.stderr
    assert "run0: " not in v.stdout and "2/2 cases" in v.stdout  # no per-run "source" lines
    assert (tmp_path / "val" / "validation.png").read_bytes()[:4] == b"\x89PNG"  # each run's error and band
    assert "slower than predicted on average: `simumax fit-runs" in v.stdout  # 5.9 / 6.0 s against 5.58 predicted
    runs.write_text(runs.read_text() + json.dumps({"id": "run9", "system": "a100_pcie", "model": "llama3-9b",
                                                   "strategy": "tp1_pp2_dp4_mbs1", "measured": {"iter_time_ms": 1.0}}) + "\n")
    f = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "x.json"))
    assert f.returncode == 2 and "run run9" in f.stderr and "llama3-9b" in f.stderr
    # a run whose strategy breaks a rule only the estimate checks (heads over TP) is named too
    runs.write_text(_case(0, "a100_pcie", 5900.0) + "\n" + json.dumps(
        {"id": "run7", "system": "a100_pcie", "model": "llama3-8b", "measured": {"iter_time_ms": 1.0},
         "strategy": load_strategy("tp1_pp2_dp4_mbs1").with_updates({"tp_size": 3, "world_size": 6, "pp_size": 1, "enable_sequence_parallel": False}).to_dict()}) + "\n")
    f = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "x.json"))
    assert f.returncode == 2 and "run run7" in f.stderr and "Traceback" not in f.stderr, f.stderr


def test_a_run_given_as_tflops_per_gpu_is_read_as_validate_reads_it(tmp_path: Path) -> None:
    """SimuMax's records give TFLOP/s per GPU: the time is the model's FLOPs per GPU over it
    (validate's ``measured_seconds``), so the fit sees the same time validate compares."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text(json.dumps({"id": "t", "system": "a100_pcie", "model": "llama3-8b", "strategy": "tp1_pp2_dp4_mbs1",
                                "measured": {"tflops_per_gpu": 150.0}}) + "\n")
    res = fit_file(runs, resources=("compute",))
    v = json.loads(run_cli("validate", str(runs), "--json").stdout)["cases"][0]
    assert res.rows[0].measured == pytest.approx(v["measured_time"], rel=1e-12)
