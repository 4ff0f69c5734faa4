"""Calibration with torch on CPU, end to end (tiny shapes: the numbers mean nothing, the
plumbing is real). Skipped without torch (the ``calibrate`` extra); the torch-free parts
of calibration are in test_calibrate.py."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from simumax.config.loader import load_model, load_system
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from tests.conftest import ROOT
from tests.test_calibrate import TINY_MODEL, TINY_STRATEGY, _cli

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
    # on CPU kernels run back to back (no power limit to wait out) and no power curve is measured
    assert report["cooldown_seconds"] == 0.0 and report["power_curve"] is None and system.accelerator.power_curve is None
    assert report["sm_contention"] is None and system.accelerator.sm_contention is None  # GPU only
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
    # the GEMMs beside the collectives: one point per op that runs beside compute in training,
    # at the largest size, and the tier's processor_usage their median
    points = report["contention"]
    assert [p["op"] for p in points] == ["reduce_scatter", "all_gather", "all2all"]
    assert all(p["bytes"] == 2**20 and p["gemm_alone"] > 0 and p["comm_beside"] > 0 and 0 <= p["usage"] <= 1 for p in points)
    assert tier.processor_usage == report["processor_usage"] == round(statistics.median(p["usage"] for p in points), 4)


def test_contention_usage_is_the_extra_time_per_overlapped_second() -> None:
    """u = (GEMM loop beside - alone) / the compute overlapped: the collectives' time when
    shorter than the loop, else the whole loop (the cost model adds u x that overlap)."""
    from simumax.calibrate.contention import ContentionPoint, tier_usage
    short = ContentionPoint("reduce_scatter", 8, 1 << 26, gemm_alone=0.020, gemm_beside=0.021, comm_beside=0.010)
    assert short.usage == pytest.approx(0.1)
    long = ContentionPoint("all_gather", 8, 1 << 26, gemm_alone=0.020, gemm_beside=0.023, comm_beside=0.050)
    assert long.usage == pytest.approx(0.15)
    faster = ContentionPoint("all2all", 8, 1 << 26, gemm_alone=0.020, gemm_beside=0.019, comm_beside=0.010)
    assert faster.usage == 0.0  # noise below zero is none
    assert tier_usage([short, long, faster]) == 0.1 and tier_usage([]) is None


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
    assert row["clocks_real"] is None and row["tensor_core_rate_predicted"] == 1.0  # no NVML, no power curve
    meas = row["measurement"]
    assert len(meas["step_seconds_all"]) == 2 and set(meas["phase_seconds"]) == {"fwd", "bwd", "optimizer"}
    assert row["activation_bytes_real"] > 0
    assert row["host_issue_real"] is None and row["host_issue_predicted"] > 0  # measured on a GPU only


def test_host_issue_time_runs_a_micro_batch_and_counts_its_kernels() -> None:
    """The measurement check-step makes on a GPU, run on CPU with a small busy GEMM: host
    seconds of one forward + backward, and its CUDA kernels (none on CPU); it adds the
    micro-batch's gradients like a training micro-batch."""
    from simumax.calibrate.check_step import LlamaStyle, host_issue_time
    from simumax.config.loader import load_model

    cfg = load_model("llama2-tiny").with_updates({"layer_num": 1})
    net = LlamaStyle(cfg)
    tokens = torch.randint(0, net.vocab, (1, 17))
    seconds, launches = host_issue_time(net, tokens[:, :-1], tokens[:, 1:], torch.device("cpu"), reps=2, busy=32)
    assert seconds > 0 and launches == 0
    assert all(p.grad is not None or hasattr(p, "main_grad") for p in net.parameters())


def test_check_step_fp8_refused_before_training(tiny_files) -> None:
    """An unknown recipe, or fp8 on a system without an fp8 peak, is one line and exit 2,
    before any training step."""
    m, _ = tiny_files
    for system, recipe, field in (("a100_pcie", "mxfp8", "--fp8"), ("a100-sxm-80gb", "delayed", "fp8")):
        r = _cli("check-step", "-m", str(m), "-y", system, "--seq-len", "32", "--device", "cpu", "--fp8", recipe)
        assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, r.stderr


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


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed"])
def test_fp8_linear_is_the_linear_within_fp8_rounding(recipe) -> None:
    """TE's fp8 linear rebuilt in torch (calibrate/fp8_linear.py): output, input gradient and
    the weight gradient added to main_grad agree with the bf16 linear within what E4M3 /
    E5M2 rounding allows (relative error of the whole tensor); the weight's fp8 copies are
    made once per step and remade after new_step(); delayed scaling uses the last amax."""
    from simumax.calibrate.check_step import _Linear
    from simumax.calibrate.fp8_linear import Fp8Linear, Fp8Quantizer

    torch.manual_seed(0)
    ref = _Linear(64, 48, bias=True)
    x = torch.randn(2, 16, 64)
    dy = torch.randn(2, 16, 48)
    xr = x.clone().requires_grad_(True)
    (ref(xr) * dy).sum().backward()
    ref_wgrad = ref.weight.grad.clone()
    lin = Fp8Linear(ref, Fp8Quantizer(recipe, fused=False))
    lin.weight.main_grad = torch.zeros_like(lin.weight)
    lin.weight.grad = lin.bias.grad = None

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    for step in range(2):  # the second step's delayed scales come from the first's amaxes
        lin.new_step()
        lin.weight.main_grad.zero_()
        x8 = x.clone().requires_grad_(True)
        y = lin(x8)
        (y * dy).sum().backward()
        with torch.no_grad():
            assert rel(y, ref(x)) < 0.06, (step, rel(y, ref(x)))
        assert rel(x8.grad, xr.grad) < 0.15, (step, rel(x8.grad, xr.grad))
        assert rel(lin.weight.main_grad, ref_wgrad) < 0.15
        assert lin.weight.grad is None  # gone into main_grad, as with Megatron's fusion
    cached = lin.weight_fp8()
    assert lin.weight_fp8() is cached  # kept across micro-batches
    assert cached[0].dtype == torch.float8_e4m3fn and cached[1].shape == (64, 48)  # both layouts
    lin.new_step()
    assert lin.weight_fp8() is not cached


def test_check_step_fp8_keeps_fp8_inputs_and_predicts_fp8() -> None:
    """The fp8 step saves the linears' inputs as 1-byte transposed copies (fewer saved bytes
    than bf16), counts its weight copies as states not activations, and is predicted with
    the same recipe and unfused weight-gradient accumulation."""
    from simumax.calibrate.check_step import LlamaStyle, saved_bytes, single_device_strategy, use_fp8

    base = load_model("llama3-8b").with_updates({k: v for k, v in TINY_MODEL.items() if k != "model_name"}, source="test")
    tokens = torch.randint(0, 100, (2, 33))
    saved = {}
    for recipe in (None, "tensorwise"):
        torch.manual_seed(0)
        net = LlamaStyle(base)
        fp8 = use_fp8(net, recipe, fused=False) if recipe else []
        saved[recipe] = saved_bytes(net, tokens[:, :-1], tokens[:, 1:], fp8)
    h, layers = base.hidden_size, base.layer_num
    # per layer the qkv and fc1 inputs (each h wide) and the proj and fc2 inputs: fp32 here (4 B -> 1 B)
    assert 0 < saved["tensorwise"] < saved[None] - layers * 2 * 64 * h * 3
    st = single_device_strategy(32, 2, 1, fp8_recipe="delayed")
    assert st.fp8 and st.fp8_recipe == "delayed" and not st.gradient_accumulation_fusion
    assert not single_device_strategy(32, 2, 1).fp8


def test_cast_transpose_writes_both_layouts_and_the_amax() -> None:
    """The TE-like cast (torch off a GPU): row-wise and transposed fp8 copies of the scaled
    tensor, saturated at the format's maximum, and the tensor's amax."""
    from simumax.calibrate.fp8_cast import FP8_MAX, cast_transpose

    x = (torch.randn(48, 32) * 3).to(torch.bfloat16)
    x[0, 0] = 1e4  # beyond E4M3's 448 once scaled
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        q, qt, amax = cast_transpose(x, dtype, torch.tensor(0.5))
        assert q.dtype == qt.dtype == dtype and q.shape == (48, 32) and qt.shape == (32, 48)
        assert torch.equal(q.view(torch.uint8).t(), qt.view(torch.uint8))
        # the 1e4 entry saturates at E4M3's 448; E5M2 holds 5000 (as its nearest value, 5120)
        assert float(q.float().abs().max()) == float(torch.tensor(min(FP8_MAX[dtype], 5e3)).to(dtype).float())
        assert float(amax) == float(x.float().abs().max())


def test_check_step_phases_add_up_with_or_without_a_wait_per_phase() -> None:
    """Phase times (fwd, bwd, optimizer) cover the step, timed either way."""
    from simumax.calibrate.check_step import train_steps

    base = load_model("llama3-8b").with_updates({k: v for k, v in TINY_MODEL.items() if k != "model_name"}, source="test")
    for sync in (False, True):
        meas = train_steps(base, 32, 2, 2, steps=2, warmup=1, device=torch.device("cpu"), sync_phases=sync)
        parts = sum(meas.phase_seconds.values())
        assert 0.5 * meas.step_seconds < parts <= meas.step_seconds * 1.01, (sync, parts, meas.step_seconds)


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


def test_fp8_gemms_run_as_transformer_engine_runs_them(monkeypatch) -> None:
    """fp8 linears' three GEMMs: E4M3 x E4M3 forward with fast accumulation; E5M2 gradients
    against E4M3 operands with split accumulation for the data and weight gradients (TE's
    _2X_ACC_DGRAD / _2X_ACC_WGRAD); bf16 out, fp32 for the weight gradient."""
    from simumax.calibrate.compute import fp8_gemm_fn
    from simumax.graph.kernels import Gemm

    calls = []
    real = torch._scaled_mm

    def spy(a, b, **kw):
        calls.append((a.dtype, b.dtype, b.stride(0) == 1, kw["use_fast_accum"], kw["out_dtype"]))
        return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", spy)
    t, k, n = 64, 128, 256
    cpu = torch.device("cpu")
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    cases = [
        (Gemm(t, k, n, "TN", family="fp8_matmul"), (e4, e4, True, True, torch.bfloat16), (t, n)),
        (Gemm(t, n, k, "NN", family="fp8_matmul"), (e5, e4, True, False, torch.bfloat16), (t, k)),
        (Gemm(n, t, k, "NT", accumulate=True, out_dtype="fp32", family="fp8_matmul"), (e5, e4, True, False, torch.float32), (n, k)),
    ]
    for gemm, want, shape in cases:
        calls.clear()
        fn = fp8_gemm_fn(gemm, cpu)
        assert fn is not None
        out = fn()
        assert tuple(out.shape) == shape and calls[-1] == want, (gemm.layout, calls[-1])
    # batched GEMMs are not TE linears: not measured as fp8
    assert fp8_gemm_fn(Gemm(32, 64, 64, "TN", b=4, family="fp8_matmul"), cpu) is None


def test_calibrate_measures_the_fp8_gemms_of_an_fp8_job(tmp_path, tiny_files) -> None:
    m, s = tiny_files
    s.write_text(json.dumps({**json.loads(s.read_text()), "fp8": True}))
    out = tmp_path / "fp8.json"
    r = _cli("calibrate", "-m", str(m), "-s", str(s), "--base", "h100-sxm-80gb", "--name", "cpu_fp8", "--out", str(out),
             "--device", "cpu", "--warmup", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    system = SystemConfig.init_from_config_file(out)
    table = system.accelerator.op["fp8_matmul"].accurate_efficient_factor
    est = Estimate(load_model(str(m)), StrategyConfig.init_from_config_file(s), system)
    fp8_keys = {k.key for c in est.chunks for k in c.kernels() if getattr(k, "family", "") == "fp8_matmul"}
    assert fp8_keys and fp8_keys <= set(table)  # every fp8 GEMM of the job measured, in the fp8 family's peak
    assert est.cost().efficiency_lookups["sources"]["fp8_matmul"]["measured"] > 0


def test_calibrate_times_the_fp32_routers_tf32_gemms(tmp_path) -> None:
    """A MoE job with moe_router_dtype fp32: its router gradient GEMMs (tf32_matmul) are timed
    on fp32 operands with TF32 allowed, into a TF32 family at half the bf16 peak, and the
    estimate then reads them as measured."""
    from simumax.cost.efficiency import TF32_OF_BF16_PEAK

    m, s = tmp_path / "moe.json", tmp_path / "s.json"
    m.write_text(json.dumps({**TINY_MODEL, "model_type": "moe", "expert_num": 4, "topk": 2, "moe_ffn_hidden_size": 64,
                             "moe_pad_expert_input_to_capacity": False}))
    s.write_text(json.dumps({**TINY_STRATEGY, "moe_router_dtype": "fp32"}))
    out = tmp_path / "tf32.json"
    r = _cli("calibrate", "-m", str(m), "-s", str(s), "--base", "h100-sxm-80gb", "--name", "cpu_tf32", "--out", str(out),
             "--device", "cpu", "--warmup", "1", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    system = SystemConfig.init_from_config_file(out)
    fam = system.accelerator.op["tf32_matmul"]
    assert fam.tflops == pytest.approx(system.accelerator.op["matmul"].tflops * TF32_OF_BF16_PEAK)
    est = Estimate(load_model(str(m)), StrategyConfig.init_from_config_file(s), system)
    keys = {k.key for c in est.chunks for k in c.kernels() if getattr(k, "family", "") == "tf32_matmul"}
    assert keys and keys <= set(fam.accurate_efficient_factor)
    assert est.cost().efficiency_lookups["sources"]["tf32_matmul"]["measured"] > 0


def test_megatrons_cross_entropy_chain_is_the_cross_entropy() -> None:
    """The chain calibrate times for the ``ce`` line and check-step trains with gives the
    cross-entropy and its gradient (in the logits' dtype), and leaves the bf16 logits as they were."""
    import torch.nn.functional as F

    from simumax.calibrate.megatron_loss import megatron_cross_entropy

    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 40, generator=g).to(torch.bfloat16).requires_grad_()
    before = x.detach().clone()
    t = torch.randint(0, 40, (9,), generator=g)
    megatron_cross_entropy(x, t).mean().backward()
    ours = x.grad.clone()
    assert ours.dtype == torch.bfloat16 and torch.equal(x.detach(), before)
    x.grad = None
    ref = F.cross_entropy(x.float(), t)
    ref.backward()
    assert torch.allclose(megatron_cross_entropy(x, t).mean(), ref.detach(), atol=1e-6)
    assert torch.allclose(ours.float(), x.grad.float(), atol=1e-2)



def test_timing_at_full_clock_idles_first_and_caps_the_timed_work() -> None:
    """``cooldown`` idles before the first call; ``max_load`` trims the samples (at least
    three) so a long kernel is timed within the limiter's full-clock window."""
    import time

    from simumax.calibrate.timing import median_seconds

    calls = []

    def work() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.004)

    t0 = time.perf_counter()
    median_seconds(work, torch.device("cpu"), warmup=1, repeats=10, min_sample=1e-3, cooldown=0.05, max_load=0.001)
    assert calls[0] - t0 >= 0.05
    assert len(calls) == 1 + 1 + 3  # warm-up, probe, three samples of one call
    calls.clear()
    median_seconds(work, torch.device("cpu"), warmup=1, repeats=10, min_sample=1e-3)
    assert len(calls) == 1 + 1 + 10


def test_attention_calls_are_graphed_on_a_gpu_only() -> None:
    """Off a GPU the timed call is the eager one; an attention backward call runs the
    kernel's gradient (on a GPU it is replayed from a CUDA graph: docs/calibration.md,
    "Attention shapes", measured on the lent H100)."""
    from simumax.calibrate.compute import attention_fn
    from simumax.calibrate.timing import graphed
    from simumax.graph.kernels import Attention

    def fn() -> int:
        return 1

    assert graphed(fn, torch.device("cpu")) is fn
    grads = attention_fn(Attention("bwd", 1, 16, 2, 1, 8, 8), torch.device("cpu"), torch.float32)()
    assert [tuple(g.shape) for g in grads] == [(1, 2, 16, 8), (1, 1, 16, 8), (1, 1, 16, 8)]


def test_check_step_refuses_models_it_cannot_build() -> None:
    """check-step's torch model is a dense MHA/GQA transformer: a Gated DeltaNet or hybrid model
    is a one-line ConfigError, not a wrong step."""
    from simumax.calibrate.check_step import LlamaStyle

    base = load_model("llama3-8b").with_updates({k: v for k, v in TINY_MODEL.items() if k != "model_name"}, source="test")
    for upd in ({"experimental_attention_variant": "gated_delta_net", "linear_attention_freq": 2},
                {"hybrid_layer_pattern": "G-" * (base.layer_num // 2)}):
        with pytest.raises(ConfigError):
            LlamaStyle(base.with_updates(upd))


def test_calibrate_comm_picks_the_nodes_tier_by_itself(tmp_path) -> None:
    """Without --tier, groups inside one node fit the tier the cost model puts them on (two
    ranks on the A100 PCIe file: its 2-wide switch tier), as comm_points.merge_points does."""
    out = tmp_path / "comm.json"
    r = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29518", "-m",
         "simumax.cli", "calibrate-comm", "--base", "a100_pcie", "--sizes", "4K,1M", "--warmup", "1", "--repeats", "2",
         "--no-contention", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "comm.comm_report.json").read_text())
    assert report["tiers"] == {"intra_node_pcie_2x": 5 * 2} and report["tier"] == "intra_node_pcie_2x"
    assert SystemConfig.init_from_config_file(out).networks.tiers["intra_node_pcie_2x"].provenance == "measured"


def test_calibrate_comm_across_two_nodes_fits_inter_node(tmp_path) -> None:
    """Two one-rank "nodes" (two torchrun agents on one host): the group spans both, so its
    points, the all-to-all's too, fit inter_node through the model's split (one rank per node:
    no node-local part), and every point is in the report."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--master-addr",
           "127.0.0.1", "--master-port", "29533", "-m", "simumax.cli", "calibrate-comm", "--base", "a100_pcie", "--sizes",
           "4K,1M", "--warmup", "1", "--repeats", "2", "--no-contention"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd[:3] + ["--node-rank", str(r)] + cmd[3:] + ["--out", str(tmp_path / f"comm{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:]
    report = json.loads((tmp_path / "comm0.comm_report.json").read_text())
    assert report["tiers"] == {"inter_node": 5 * 2} and report["tier"] == "inter_node" and not report["not_fitted"]
    tier = SystemConfig.init_from_config_file(tmp_path / "comm0.json").networks.tiers["inter_node"]
    assert tier.provenance == "measured"
    assert all(tier.op[op].efficient_factor > 0 for op in ("all_reduce", "all_gather", "reduce_scatter", "all2all", "p2p"))
