"""Calibration without torch: kernels of a job from the IR, α-β fits, the system writer,
the datasheet table and the CLI's errors (the torch paths end to end: test_calibrate_torch.py)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simumax.calibrate.fit import fit_alpha_beta
from simumax.calibrate.shapes import job_kernels
from simumax.calibrate.system_writer import fresh_system, merge_collectives, merge_compute
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.system import SystemConfig
from simumax.cost.network import NetworkModel, ring_bytes
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention
from tests.conftest import run_cli

TINY_MODEL = {"model_name": "tiny", "hidden_size": 128, "head_num": 4, "kv_head_num": 2, "intermediate_size": 256,
              "layer_num": 2, "vocab_size": 1000, "use_swiglu": True}
TINY_STRATEGY = {"seq_len": 64, "micro_batch_size": 1, "micro_batch_num": 2, "world_size": 2, "tp_size": 2,
                 "enable_sequence_parallel": True}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, timeout=300)


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
    # small sizes decide the latency even beside a huge one (weighted least squares)
    xs, ts = [1e3, 1e4, 1e9], [10e-6 + 1e3 / 1e12, 10e-6 + 1e4 / 1e12, 10e-6 + 1e9 / 1e12]
    assert fit_alpha_beta(xs, ts).latency == pytest.approx(10e-6, rel=1e-6)
    # times falling faster than sizes would need a negative latency: clamp to 0
    clamped = fit_alpha_beta([1.0, 2.0, 3.0], [1.0, 3.0, 5.0])
    assert clamped.latency == 0.0 and clamped.seconds_per_byte > 0
    with pytest.raises(ValueError):
        fit_alpha_beta([1.0], [0.0])


def test_memory_line_keeps_the_time_of_the_measured_kernels() -> None:
    """The H100 calibration's 54 default memory-bound sizes (docs/calibration/...report.json):
    35 sit in the 50 MB L2 at a flat ~6.5 µs. The line must still follow the HBM-bound sizes
    that carry the time: within 4 % above 100 MB and within 2 % on the summed time (weighted
    by 1/t² it was 13-17 % under them and 16 % under the sum, at 3.8 TB/s > the 3.35 of HBM)."""
    import json
    from pathlib import Path

    report = Path(__file__).resolve().parent.parent / "docs" / "calibration" / "nvidia_h100_80gb_hbm3.report.json"
    pts = json.loads(report.read_text())["bandwidth"]["default"]["points"]
    fit = fit_alpha_beta([x for x, _ in pts], [t for _, t in pts])
    big = [fit.predict(x) / t - 1 for x, t in pts if x >= 1e8]
    total = sum(fit.predict(x) for x, _ in pts) / sum(t for _, t in pts) - 1
    print(f"large sizes {min(big):+.3f} .. {max(big):+.3f}, sum {total:+.3f}, {1 / fit.seconds_per_byte / 1e9:.0f} GB/s")
    assert len(big) >= 15 and max(abs(e) for e in big) <= 0.04
    assert abs(total) <= 0.02
    assert fit.efficiency(3350.0) <= 1.0  # no faster than the HBM it streams from


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
        timings.append(SimpleNamespace(family=k.family, key=k.key, flops=k.table_flops(),
                                       seconds=k.table_flops() / (peak_tflops * 1e12 * efficiency)))
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
    assert fwd.table_flops() == 4 * 1 * 32 * 4096 * 4096 * 128  # 2·b·h·s²·(dqk + dv), no causal halving


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
    # peaks not given: the datasheet row (a collectives-only calibration)
    assert fresh_system("x", "NVIDIA H100 80GB HBM3", 79.0, None, None, 8) == sys_dict
    fits = {"all_reduce": fit_alpha_beta([1e6, 1e8], [1e6 / 300e9 + 20e-6, 1e8 / 300e9 + 20e-6])}
    base = load_system("b200_bf16_ceperm").to_dict()
    out = merge_collectives(base, "high_intra_node", fits)
    spec = out["networks"]["high_intra_node"]["op"]["all_reduce"]
    # SimuMax's tier states 900 GiB/s (docs/compat.md): rewritten as the same link in GB/s,
    # which the measured 300 GB/s is a fraction of
    tier = out["networks"]["high_intra_node"]
    assert tier["gbps_unit"] == "GB" and tier["bandwidth"]["gbps"] == pytest.approx(900 * 2**30 / 1e9)
    assert spec["efficient_factor"] == pytest.approx(300 / (900 * 2**30 / 1e9), rel=1e-3)
    # the measured tier says so (the uncertainty band counts its seconds as measured); a
    # fresh system's tiers are datasheet values until measured
    assert out["networks"]["high_intra_node"]["provenance"] == "measured"
    assert sys_dict["networks"]["inter_node"]["provenance"] == "datasheet"
    # the device's SM count, when calibrate knows it, goes into the system (wave-aware fits)
    assert "sm_count" not in sys_dict["accelerator"]
    with_sms = fresh_system("x", "NVIDIA H100 80GB HBM3", 79.0, 989.4, 3350.0, 8, sm_count=132)
    assert SystemConfig.init_from_dict(with_sms).accelerator.sm_count == 132
    # NCCL's default CTA cap where megatron-core states it: Hopper SXM (cost/nccl_sms.py)
    assert "nccl_max_ctas" not in with_sms["accelerator"]
    hopper = fresh_system("x", "NVIDIA H100 80GB HBM3", 79.0, 989.4, 3350.0, 8, sm_count=132, compute_major=9)
    assert SystemConfig.init_from_dict(hopper).accelerator.nccl_max_ctas == 32
    for name, major in (("NVIDIA H100 PCIe", 9), ("NVIDIA H100 NVL", 9), ("NVIDIA A100-SXM4-80GB", 8)):
        assert "nccl_max_ctas" not in fresh_system("x", name, 79.0, None, None, 8, compute_major=major)["accelerator"]
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


def test_the_ce_line_is_sized_in_its_table_convention() -> None:
    """calibrate measures the ``ce`` family at the loss's size in the table convention its
    line is fitted in (SimuMax's: 14 B per bf16 logit), not the chain's 38 B."""
    from simumax.config.strategy import StrategyConfig
    from simumax.graph.kernels import MemBound

    model = load_model("llama3-8b").model_copy(update={"layer_num": 1})
    strategy = StrategyConfig.init_from_dict({"seq_len": 512, "world_size": 1, "micro_batch_size": 1})
    system = load_system("a100-sxm-80gb")
    loss = next(o for c in Estimate(model, strategy, system).chunks for o in c.ops if o.name == "loss")
    fwd = next(k for k in loss.fwd if isinstance(k, MemBound))
    assert fwd.table_bytes * 38 == pytest.approx(fwd.bytes * 14)
    sizes = job_kernels(model, strategy, system).membound["ce"]
    assert fwd.table_bytes in sizes and fwd.bytes not in sizes


def test_a_flat_collective_fit_is_capped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Times that hardly grow with size (a busy host, sizes too small for the link) fit a
    near-flat line whose bandwidth is no measurement: written at the schema's cap, with a
    warning naming the op, instead of failing the whole run on the field's bound."""
    import logging

    from simumax.config.system import MAX_LINK_EFFICIENCY

    flat = {"p2p": fit_alpha_beta([4e3, 6.4e4, 1e6], [1.0e-3, 1.02e-3, 1.021e-3])}
    base = load_system("a100_pcie").to_dict()
    with caplog.at_level(logging.WARNING, logger="simumax.calibrate.system_writer"):
        out = merge_collectives(base, "intra_node_pcie_2x", flat)
    assert flat["p2p"].efficiency(30.0) > MAX_LINK_EFFICIENCY
    assert out["networks"]["intra_node_pcie_2x"]["op"]["p2p"]["efficient_factor"] == MAX_LINK_EFFICIENCY
    assert "p2p" in caplog.text and "do not resolve" in caplog.text
    SystemConfig.init_from_dict(out)


def test_clock_readings_summarise_to_medians_and_the_capped_share() -> None:
    from simumax.calibrate.nvml import SW_POWER_CAP, reading, summary

    rows = [{"sm_mhz": 1980, "power_w": 400.0, "throttle": 0},
            {"sm_mhz": 1500, "power_w": 699.0, "throttle": SW_POWER_CAP},
            {"sm_mhz": 1600, "power_w": 690.0, "throttle": SW_POWER_CAP | 0x1}, {}]
    assert summary(rows) == {"sm_mhz": 1600, "power_w": 690.0, "power_capped_share": 2 / 3}
    assert summary([{}, {}]) is None and reading(None, None) == {}


def test_check_step_table_sets_phases_and_kernel_kinds_beside_the_prediction() -> None:
    """check-step's printed table: step, memory, then per phase and (with --profile) per
    kernel kind, each measured beside predicted with the error; the fp8 recipe in the title."""
    from rich.console import Console

    from simumax.report.format import check_step_table

    row = {"model": "m", "layers": 4, "hidden": 4096, "seq_len": 4096, "mbs": 1, "mbc": 2, "device": "gpu",
           "fp8_recipe": "delayed", "step_time_real": 0.1, "step_time_predicted": 0.09, "time_error": -0.1,
           "peak_mem_real": 2**30, "peak_mem_predicted": 2**30, "mem_error": 0.0, "params_real": 1, "params_predicted": 1,
           "phase_time_real": {"fwd": 0.03, "bwd": 0.06, "optimizer": 0.01},
           "phase_time_predicted": {"fwd": 0.03, "bwd": 0.05, "optimizer": 0.01},
           "kernel_seconds_real": {"gemm": 0.05, "attention": 0.01},
           "kernel_seconds_predicted": {"gemm": 0.04, "attention": 0.01}}
    console = Console(width=200, record=True)
    console.print(check_step_table(row))
    text = console.export_text()
    assert "fp8 delayed" in text
    lines = {ln.split("│")[1].strip(): ln for ln in text.splitlines() if ln.count("│") >= 4}
    assert "-16.7%" in lines["bwd (ms)"] and "-20.0%" in lines["gemm kernels (ms)"] and "+0.0%" in lines["fwd (ms)"]
    assert "host issue per micro-batch (ms)" not in lines  # not measured (CPU)
    row.update(host_issue_real=0.012, host_issue_launches_real=600, host_issue_predicted=0.009)
    console = Console(width=200, record=True)
    console.print(check_step_table(row))
    issue = next(ln for ln in console.export_text().splitlines() if "host issue per micro-batch" in ln)
    assert "12.0 (20.0 us x 600 launches)" in issue and "9.0" in issue and "-25.0%" in issue
