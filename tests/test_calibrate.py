"""Calibration: kernels of a job from the IR, α-β fits, the system writer, and the torch
paths end to end on CPU (tiny shapes: the numbers mean nothing, the plumbing is real)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simumax.calibrate.fit import fit_alpha_beta, ring_bytes
from simumax.calibrate.shapes import job_kernels
from simumax.calibrate.system_writer import fresh_system, merge_collectives, merge_compute
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.system import SystemConfig
from simumax.cost.network import NetworkModel
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL = {"model_name": "tiny", "hidden_size": 128, "head_num": 4, "kv_head_num": 2, "intermediate_size": 256,
              "layer_num": 2, "vocab_size": 1000, "use_swiglu": True}
TINY_STRATEGY = {"seq_len": 64, "micro_batch_size": 1, "micro_batch_num": 2, "world_size": 2, "tp_size": 2,
                 "enable_sequence_parallel": True}


def _cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simumax.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=ROOT)


# ---- fits -------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(gbps=st.floats(1.0, 5000.0), lat_us=st.floats(0.0, 100.0),
       sizes=st.lists(st.integers(1_000, 10**10), min_size=2, max_size=12, unique=True))
def test_alpha_beta_recovers_an_exact_line(gbps: float, lat_us: float, sizes: list[int]) -> None:
    ts = [x / (gbps * 1e9) + lat_us * 1e-6 for x in sizes]
    fit = fit_alpha_beta([float(x) for x in sizes], ts)
    assert fit.efficiency(gbps) == pytest.approx(1.0, rel=1e-6, abs=1e-6)
    assert fit.latency == pytest.approx(lat_us * 1e-6, rel=1e-5, abs=1e-9)
    assert fit.max_rel_residual < 1e-6


def test_alpha_beta_weighs_small_messages_and_clamps_latency() -> None:
    # small sizes decide the latency even beside a huge one (relative least squares)
    xs, ts = [1e3, 1e4, 1e9], [10e-6 + 1e3 / 1e12, 10e-6 + 1e4 / 1e12, 10e-6 + 1e9 / 1e12]
    assert fit_alpha_beta(xs, ts).latency == pytest.approx(10e-6, rel=1e-6)
    # times falling faster than sizes would need a negative latency: clamp to 0
    clamped = fit_alpha_beta([1.0, 2.0, 3.0], [1.0, 3.0, 5.0])
    assert clamped.latency == 0.0 and clamped.seconds_per_byte > 0
    with pytest.raises(ValueError):
        fit_alpha_beta([1.0], [0.0])


def test_ring_bytes_is_the_cost_models_formula() -> None:
    assert ring_bytes(8e6, 8, 2, -1) == 2 * 8e6 * 7 / 8  # ring all-reduce
    assert ring_bytes(8e6, 2, 1, 0) == 8e6  # p2p


# ---- which kernels a job runs -------------------------------------------------------------
def _fake_calibration(kernels, peak_tflops: float, efficiency: float):
    """A ComputeCalibration-shaped object with every kernel at ``efficiency``."""
    timings = []
    for fam, ks in [*kernels.gemms.items(), *kernels.group_gemms.items()]:
        for k in ks:
            timings.append(SimpleNamespace(family=fam, key=k.key, flops=k.flops, seconds=k.flops / (peak_tflops * 1e12 * efficiency)))
    for k in kernels.attentions:
        timings.append(SimpleNamespace(family=k.family, key=k.key, flops=k.table_flops,
                                       seconds=k.table_flops / (peak_tflops * 1e12 * efficiency)))
    bw = {fam: fit_alpha_beta(sizes + [2 * max(sizes)], [s / 1e12 + 5e-6 for s in sizes + [2 * max(sizes)]])
          for fam, sizes in kernels.membound.items()}
    return SimpleNamespace(timings=timings, bandwidth=bw, peak_tflops=peak_tflops, hbm_gbps=1000.0)


@pytest.mark.parametrize("model,strategy", [
    ("llama3-8b", "tp2_pp1_dp4_mbs1_selective_recompute"),
    ("llama3-70b", "tp8_pp1_dp1_mbs1"),
    ("deepseekv2", "ep4_pp2_dp4_mbs1_selective_recompute"),
])
def test_calibrated_job_has_no_efficiency_misses(model: str, strategy: str) -> None:
    """The keys calibration writes are exactly the keys the estimate looks up."""
    m, s, y = load_model(model), load_strategy(strategy), load_system("a100_pcie")
    if model == "deepseekv2":
        m = m.with_updates({"layer_num": 4}, source="test")
    kernels = job_kernels(m, s, y)
    base = y.to_dict()
    for fam in base["accelerator"]["op"].values():
        fam["accurate_efficient_factor"] = {}
    system = SystemConfig.init_from_dict(merge_compute(base, _fake_calibration(kernels, 312.0, 0.5)))
    cost = Estimate(m, s, system).cost()
    assert cost.efficiency_lookups["misses"] == {}
    assert sum(cost.efficiency_lookups["hits"].values()) > 0


def test_efficiency_is_written_against_the_family_peak() -> None:
    """Same seconds, a family with twice the peak: half the efficiency; time predicted unchanged."""
    y = load_system("a100_pcie")
    m, s = load_model("llama3-8b"), load_strategy("tp1_pp1_dp8_mbs1")
    kernels = job_kernels(m, s, y)
    cal = _fake_calibration(kernels, 312.0, 0.6)
    base = y.to_dict()
    a = merge_compute(base, cal)
    base["accelerator"]["op"]["matmul"]["tflops"] = 624.0
    b = merge_compute(base, cal)
    key = kernels.gemms["matmul"][0].key
    assert a["accelerator"]["op"]["matmul"]["accurate_efficient_factor"][key] == pytest.approx(0.6, rel=1e-5)
    assert b["accelerator"]["op"]["matmul"]["accurate_efficient_factor"][key] == pytest.approx(0.3, rel=1e-5)
    ta = Estimate(m, s, SystemConfig.init_from_dict(a)).cost().duration_time_per_iter
    tb = Estimate(m, s, SystemConfig.init_from_dict(b)).cost().duration_time_per_iter
    assert ta == pytest.approx(tb, rel=1e-4)
    # memory-bound fit: 1 TB/s achieved on a 1600 GB/s family, 5 us latency
    assert a["accelerator"]["bandwidth"]["default"]["efficient_factor"] == pytest.approx(1000 / 1600, rel=1e-3)
    assert a["accelerator"]["bandwidth"]["default"]["latency_us"] == pytest.approx(5.0, rel=1e-3)


def test_attention_keys_use_table_flops() -> None:
    kernels = job_kernels(load_model("llama3-8b"), load_strategy("tp1_pp1_dp8_mbs1"), load_system("a100_pcie"))
    fwd = next(k for k in kernels.attentions if isinstance(k, Attention) and k.phase == "fwd")
    assert fwd.table_flops == 4 * 1 * 32 * 4096 * 4096 * 128  # 2·b·h·s²·(dqk + dv), no causal halving


def test_datasheet_matches_the_most_specific_name() -> None:
    from simumax.config.hardware import GPUS, datasheet

    assert datasheet("NVIDIA H100 PCIe").bf16_tflops == 756.0
    assert datasheet("NVIDIA H100 80GB HBM3").scaleup_gbps == 450.0
    assert datasheet("NVIDIA A100-PCIE-40GB").scaleup_gbps == 32.0
    assert datasheet("NVIDIA A100-SXM4-80GB").hbm_gbps == 2039.0
    assert datasheet("NVIDIA GB200").bf16_tflops == 2500.0 and datasheet("NVIDIA B200").bf16_tflops == 2250.0
    assert datasheet("Tesla T4") is None
    # the presets take their peaks from the same rows
    assert {g.name: g.bf16_tflops for g in GPUS}["h200-sxm-141gb"] == datasheet("NVIDIA H200").bf16_tflops


def test_fresh_system_and_collective_merge_load() -> None:
    sys_dict = fresh_system("x", "NVIDIA H100 80GB HBM3", 79.0, 989.4, 3350.0, 8)
    assert sys_dict["networks"]["high_intra_node"]["bandwidth"]["gbps"] == 450.0
    fits = {"all_reduce": fit_alpha_beta([1e6, 1e8], [1e6 / 300e9 + 20e-6, 1e8 / 300e9 + 20e-6])}
    base = load_system("b200_bf16_ceperm").to_dict()
    out = merge_collectives(base, "high_intra_node", fits)
    spec = out["networks"]["high_intra_node"]["op"]["all_reduce"]
    assert spec["efficient_factor"] == pytest.approx(300 / 900, rel=1e-3)
    # no group sizes: the intercept is one fixed latency per call
    assert spec["latency_us"] == 0.0 and spec["fixed_latency_us"] == pytest.approx(20.0, rel=1e-3)
    SystemConfig.init_from_dict(out)
    # per group size: the per-step latency no size exceeds (min of 20/2, 35/14 us), the
    # rest of each size's latency in fixed_latency_us_by_comm_num
    sizes = {"all_reduce": {2: fit_alpha_beta([1e6, 1e8], [1e6 / 300e9 + 20e-6, 1e8 / 300e9 + 20e-6]),
                            8: fit_alpha_beta([1e6, 1e8], [1e6 / 300e9 + 35e-6, 1e8 / 300e9 + 35e-6])}}
    merged = merge_collectives(base, "high_intra_node", fits, sizes)
    by_n = merged["networks"]["high_intra_node"]["op"]["all_reduce"]
    assert by_n["latency_us"] == pytest.approx(2.5, rel=1e-3)
    assert by_n["fixed_latency_us_by_comm_num"] == {"2": pytest.approx(15.0, rel=1e-3), "8": pytest.approx(0.0, abs=1e-3)}
    # the cost model gives back each measured size's latency
    net = NetworkModel(SystemConfig.init_from_dict(merged), load_strategy("tp1_pp1_dp8_mbs1"))
    for n, lat in ((2, 20e-6), (8, 35e-6)):
        assert net._flat("high_intra_node", "all_reduce", 1e6, n) == pytest.approx(2 * (n - 1) / n * 1e6 / 300e9 + lat, rel=1e-3)
    new = merge_collectives(sys_dict, "my_tier", fits)  # a tier the system lacks: created at the measured rate
    assert new["networks"]["my_tier"]["bandwidth"]["gbps"] == pytest.approx(300.0, rel=1e-3)
    assert new["networks"]["my_tier"]["op"]["all_reduce"]["efficient_factor"] == pytest.approx(1.0, rel=1e-3)
    SystemConfig.init_from_dict(new)


def test_calibrate_without_torch_is_one_line_exit_2(tmp_path) -> None:
    code = ("import sys; sys.modules['torch'] = None; from simumax.cli import main; "
            f"sys.argv = ['simumax', 'calibrate', '-m', 'llama3-8b', '-s', 'tp1_pp1_dp8_mbs1', '--out', '{tmp_path / 'x.json'}']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "simumax[calibrate]" in r.stderr
    assert not (tmp_path / "x.json").exists()


# ---- torch on CPU, end to end ---------------------------------------------------------------
torch = pytest.importorskip("torch")


@pytest.fixture
def tiny_files(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(TINY_MODEL))
    (tmp_path / "s.json").write_text(json.dumps(TINY_STRATEGY))
    return tmp_path / "m.json", tmp_path / "s.json"


def test_calibrate_cli_on_cpu_writes_a_system_the_job_hits(tmp_path, tiny_files) -> None:
    m, s = tiny_files
    out = tmp_path / "cpu.json"
    r = _cli("calibrate", "-m", str(m), "-s", str(s), "--base", "a100_pcie", "--name", "cpu_test", "--out", str(out),
             "--device", "cpu", "--warmup", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    system = SystemConfig.init_from_config_file(out)
    assert system.sys_name == "cpu_test"
    report = json.loads((tmp_path / "cpu.report.json").read_text())
    assert report["peak_source"] == "base" and report["peak_tflops"] == 312.0
    assert all(k["seconds"] > 0 for k in report["kernels"]) and len(report["kernels"]) >= 10
    assert {"default", "ce"} <= set(report["bandwidth"])
    r = _cli("perf", "-m", str(m), "-s", str(s), "-y", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cost"]["efficiency_lookups"]["misses"] == {}
    # the base's reference entries are kept beside the new ones
    a100 = load_system("a100_pcie").accelerator.op["matmul"].accurate_efficient_factor
    assert set(a100) <= set(system.accelerator.op["matmul"].accurate_efficient_factor)


def test_calibrate_comm_under_torchrun_gloo(tmp_path) -> None:
    out = tmp_path / "comm.json"
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29517", "-m",
         "simumax.cli", "calibrate-comm", "--base", "a100_pcie", "--tier", "intra_node_pcie_2x", "--sizes", "4K,64K,1M",
         "--warmup", "1", "--repeats", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    system = SystemConfig.init_from_config_file(out)
    tier = system.networks.tiers["intra_node_pcie_2x"]
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all2all", "p2p"):
        assert tier.op[op].efficient_factor and tier.op[op].efficient_factor > 0
        assert tier.op[op].latency_us is not None and tier.op[op].fixed_latency_us == 0.0
    report = json.loads((tmp_path / "comm.comm_report.json").read_text())
    assert report["backend"] == "gloo" and report["world_size"] == 2
    assert set(report["fits_by_group_size"]["all_reduce"]) == {"2"}
    assert len(report["points"]) == 5 * 3 and all(p["seconds"] > 0 for p in report["points"])


def test_calibrate_comm_outside_torchrun_is_one_line(tmp_path) -> None:
    r = _cli("calibrate-comm", "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2 and "torchrun" in r.stderr and r.stderr.strip().count("\n") == 0


def test_check_step_on_cpu(tiny_files) -> None:
    m, _ = tiny_files
    r = _cli("check-step", "-m", str(m), "-y", "a100_pcie", "--seq-len", "32", "--mbs", "2", "--mbc", "2", "--steps", "2",
             "--warmup", "1", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["params_real"] == row["params_predicted"]  # same model, counted two ways
    assert row["step_time_real"] > 0 and row["step_time_predicted"] > 0
    assert row["peak_mem_real"] is None  # no allocator statistics on CPU
    meas = row["measurement"]
    assert len(meas["step_seconds_all"]) == 2 and set(meas["phase_seconds"]) == {"fwd", "bwd", "optimizer"}
    assert row["activation_bytes_real"] > 0


def test_fused_wgrad_linear_matches_autograd() -> None:
    from simumax.calibrate.check_step import _Linear

    torch.manual_seed(0)
    layer = _Linear(16, 8, bias=True)
    x = torch.randn(3, 5, 16, requires_grad=True)
    ref = layer(x).pow(2).sum()  # no main_grad yet: plain nn.Linear path
    gx, gw, gb = torch.autograd.grad(ref, (x, layer.weight, layer.bias))
    layer.weight.main_grad = torch.zeros_like(layer.weight)
    layer(x).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, gx)
    torch.testing.assert_close(layer.weight.main_grad, gw)
    assert layer.weight.grad is None and torch.allclose(layer.bias.grad, gb)


def test_check_step_model_trains_and_counts_like_simumax() -> None:
    """Parameters exact for tied/untied, GQA/MHA, LayerNorm/GeLU; the loss goes down."""
    from simumax.calibrate.check_step import single_device_strategy, train_steps

    base = load_model("llama3-8b").with_updates({k: v for k, v in TINY_MODEL.items() if k != "model_name"}, source="test")
    variants = [base, base.with_updates({"untie_embeddings_and_output_weights": False, "kv_head_num": 4}, source="test"),
                base.with_updates({"use_swiglu": False, "norm_type": "layernorm", "add_bias_linear": True}, source="test")]
    for m in variants:
        meas = train_steps(m, 32, 2, 1, steps=3, warmup=0, device=torch.device("cpu"))
        assert meas.params == Estimate(m, single_device_strategy(32, 2, 1), load_system("a100_pcie")).params.total
        assert meas.loss_last < meas.loss_first
