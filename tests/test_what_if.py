"""`simumax what-if`: one hardware resource scaled at a time (simumax/what_if.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.what_if import RESOURCES, scaled_system, what_if
from tests.conftest import run_cli


def _t(model, strategy, system) -> float:
    return Estimate(model, strategy, system).cost().duration_time_per_iter


CASES = [  # model, system, strategy preset, updates: dense / MoE, 1 to 256 GPUs, PP / VPP, overlaps, fp8, offload
    ("llama3-8b", "a100_pcie", "tp1_pp2_dp4_mbs1", {}),
    ("llama3-8b", "b200-sxm-180gb", "tp1_pp1_dp8_mbs1", {"world_size": 1, "fp8": True}),
    ("llama3-70b", "h100-sxm-80gb", "tp1_pp2_dp4_mbs1",
     {"world_size": 64, "tp_size": 8, "pp_size": 4, "interleaving_size": 2, "micro_batch_num": 16,
      "overlap_grad_reduce": True, "overlap_param_gather": True, "tp_comm_overlap": True}),
    ("deepseek-v3", "h100-sxm-80gb", "ep8_pp1_dp8_mbs1",
     {"world_size": 256, "ep_size": 32, "pp_size": 8, "micro_batch_num": 16, "num_layers_in_first_pipeline_stage": 5,
      "num_layers_in_last_pipeline_stage": 8}),
    ("mixtral-8x7b", "gb200-nvl72", "ep8_pp1_dp8_mbs1",
     {"world_size": 64, "tp_size": 2, "moe_dispatcher_policy": "all2all", "overlap_moe_expert_parallel_comm": True}),
    ("llama3-8b", "mi300x", "tp1_pp1_dp8_mbs1",
     {"world_size": 16, "optimizer_cpu_offload": True, "use_precision_aware_optimizer": True, "optimizer_offload_fraction": 1.0, "overlap_grad_reduce": True,
      "overlap_param_gather": True}),
]


@settings(max_examples=25, deadline=None)
@given(case=hs.sampled_from(CASES), factor=hs.floats(1.1, 8.0))
def test_every_resource_scaled_together_scales_the_time(case, factor) -> None:
    """Iteration time is homogeneous of degree -1 in the system's rates: every resource
    `factor` times better runs the job `factor` times faster, so no time the package predicts
    comes from a constant outside the system config."""
    name, system, preset, upd = case
    model, strategy, sy = load_model(name), load_strategy(preset).with_updates(upd), load_system(system)
    assert _t(model, strategy, scaled_system(sy, RESOURCES, factor)) * factor == pytest.approx(_t(model, strategy, sy), rel=1e-9)


def test_one_resource_at_a_time_by_hand() -> None:
    """On one node (TP8, no offload) the scale-out links and the host change nothing; on one
    GPU of the A100 PCIe file (no power curve), 1.5x the tensor-core peak removes a third of
    the GEMM and attention time exactly; rows come most gain first."""
    m, sy = load_model("llama3-8b"), load_system("a100_pcie")
    node = load_strategy("tp8_pp1_dp1_mbs1")
    rows = {w.resource: w for w in what_if(m, node, sy, 1.5)}
    assert rows["scale-out links"].change == 0.0 and rows["host link and memory"].change == 0.0
    assert rows["scale-up links"].change < 0 and rows["tensor-core peak"].change < 0
    ordered = what_if(m, node, sy, 1.5)
    assert [w.time for w in ordered] == sorted(w.time for w in ordered)

    one = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 1})
    est = Estimate(m, one, sy)
    from simumax.graph.kernels import Attention, Gemm, GroupGemm

    cm = est.compute_model
    tensor = sum(cm.compute(k)[0] for ch in est.chunks for k in ch.kernels()
                 if isinstance(k, (Gemm, GroupGemm, Attention))) * one.micro_batch_num
    peak = next(r for r in RESOURCES if r.name == "tensor-core peak")
    drop = _t(m, one, sy) - _t(m, one, scaled_system(sy, (peak,), 1.5))
    assert drop == pytest.approx(tensor / 3, rel=1e-9)
    with pytest.raises(ConfigError, match="--factor"):
        what_if(m, one, sy, 1.0)
    from simumax import PerfLLM

    perf = PerfLLM().configure(model_config=m, strategy_config=node, system_config=sy)
    assert [w.time for w in perf.what_if(1.5)] == [w.time for w in ordered]


def test_what_if_cli(tmp_path) -> None:
    path = tmp_path / "tp8_pp4.json"
    path.write_text(json.dumps({"seq_len": 4096, "tp_size": 8, "pp_size": 4, "enable_sequence_parallel": True}))
    r = run_cli("what-if", "-m", "llama3-70b", "-s", str(path), "-y", "h100-sxm-80gb", "--world-size", "64", "--gbs", "64",
                "--factor", "2", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert {w["resource"] for w in rows} == {r.name for r in RESOURCES}
    assert all(w["factor"] == 2 and w["time"] <= w["base_time"] for w in rows)
    r = run_cli("what-if", "-m", "llama3-70b", "-s", str(path), "-y", "h100-sxm-80gb", "--world-size", "64", "--gbs", "64",
                "--out", str(tmp_path / "w"))
    assert r.returncode == 0 and "tensor-core peak" in r.stdout, r.stderr
    written = json.loads((tmp_path / "w" / "what_if.json").read_text())["rows"]
    assert [w["factor"] for w in written] == [1.5] * len(RESOURCES)  # the default
    # a sweep: every resource at every factor, the gain growing with the factor
    r = run_cli("what-if", "-m", "llama3-70b", "-s", str(path), "-y", "h100-sxm-80gb", "--world-size", "64", "--gbs", "64",
                "--factor", "4", "--factor", "1.25", "--factor", "2", "--json", "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    sweep = json.loads(r.stdout)["rows"]
    assert len(sweep) == 3 * len(RESOURCES) and [w["factor"] for w in sweep[::len(RESOURCES)]] == [1.25, 2, 4]
    by = {}
    for w in sweep:
        by.setdefault(w["resource"], []).append(w["time"])
    assert all(a >= b >= c for a, b, c in by.values())
    assert (tmp_path / "s" / "what_if.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "w" / "what_if.png").read_bytes()[:4] == b"\x89PNG"
    bad = run_cli("what-if", "-m", "llama3-70b", "-s", str(path), "-y", "h100-sxm-80gb", "--world-size", "64",
                  "--factor", "0.5")
    assert bad.returncode == 2 and "--factor" in bad.stderr and "Traceback" not in bad.stderr
