"""Efficiency for shapes not measured: (a) table, (b) fit over the table, (c) default curve;
the hidden-20 % cross-validation on the reference B200 tables; hardware presets; collectives
across nodes."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.cost.sources import of_ops
from simumax.graph.ops import Op
from simumax.config.system import SystemConfig
from simumax.cost.efficiency import ComputeModel
from simumax.cost.efficiency_fit import TableFit, baseline, default_curve, parse_key
from simumax.cost.network import NetworkModel
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention, Collective, Gemm

ROOT = Path(__file__).resolve().parent.parent


def _cross_validate(table: dict[str, float], sm_count: int | None, seeds: int = 10) -> list[float]:
    errs = []
    for seed in range(seeds):
        keys = sorted(table)
        random.Random(seed).shuffle(keys)
        hidden, kept = keys[: len(keys) // 5], keys[len(keys) // 5 :]
        fit = TableFit({k: table[k] for k in kept}, sm_count)
        errs += [abs(fit.predict(k) - table[k]) / table[k] for k in hidden]
    return errs


def test_b200_gemm_cross_validation() -> None:
    """Hide 20 % of the measured B200 GEMM entries (10 random splits), predict them from the
    rest with (b): the median |error| is within 5 %. The tail is the table's own
    irregularities (e.g. 4096x8192x4096 NN measured at 0.39 between neighbours at 0.56)."""
    table = load_system("b200_bf16_ceperm").accelerator.op["matmul"].accurate_efficient_factor
    errs = _cross_validate(table, 148)
    q = statistics.quantiles(errs, n=10)
    print(f"B200 matmul, {len(table)} entries, {len(errs)} predictions: median {statistics.median(errs):.2%}, "
          f"p10 {q[0]:.2%}, p90 {q[-1]:.2%}, max {max(errs):.1%}")
    assert statistics.median(errs) <= 0.05


@pytest.mark.parametrize("system,family,limit", [
    ("b200_bf16_ceperm", "group_matmul", 0.06), ("b200_bf16_ceperm", "sdp_fwd", 0.05), ("b200_bf16_ceperm", "sdp_bwd", 0.05),
    ("a100_pcie", "matmul", 0.03), ("nvidia_h100_80gb_hbm3", "matmul", 0.08),
    ("nvidia_h100_80gb_hbm3", "sdp_fwd", 0.06), ("nvidia_h100_80gb_hbm3", "sdp_bwd", 0.08),
])
def test_other_tables_cross_validation(system: str, family: str, limit: float) -> None:
    """The same method on the other measured tables (median |error| reported, bounded)."""
    y = load_system(system)
    errs = _cross_validate(y.accelerator.op[family].accurate_efficient_factor, y.accelerator.sm_count or None)
    print(f"{system} {family}: median {statistics.median(errs):.2%}, max {max(errs):.1%}")
    assert statistics.median(errs) <= limit


def _one_kernel_system(table: dict[str, float], factor: float = 0.7, sm_count: int | None = 132) -> SystemConfig:
    d = load_system("h100-sxm-80gb").to_dict()
    d["accelerator"]["sm_count"] = sm_count
    d["accelerator"]["op"]["matmul"] = {"tflops": 1000.0, "efficient_factor": factor, "accurate_efficient_factor": table}
    return SystemConfig.init_from_dict(d)


def test_sources_measured_fitted_default() -> None:
    g = Gemm(4096, 4096, 8192, "TN")
    measured = {Gemm(4096, 4096, n, "TN").key: 0.6 + n / 1e6 for n in (1024, 2048, 4096, 16384)}
    cm = ComputeModel(_one_kernel_system({**measured, g.key: 0.55}))
    assert cm.compute(g)[1] == pytest.approx(0.55)  # (a)
    cm = ComputeModel(_one_kernel_system(measured))
    t, eff = cm.compute(g)  # (b): between its neighbours
    assert 0.6 < eff < 0.62
    cm2 = ComputeModel(_one_kernel_system({}))
    assert cm2.compute(g)[1] == pytest.approx(default_curve(parse_key(g.key)[1], 0.7, 132))  # (c)
    assert cm.seconds_and_source(g)[1:] == ("matmul", "fitted")
    assert cm2.seconds_and_source(g)[1:] == ("matmul", "default")
    found = of_ops([Op("x", "x", 0, fwd=(g,))], cm2, NetworkModel(_one_kernel_system({}), load_strategy("tp1_pp1_dp8_mbs1")))
    assert found.to_dict()["sources"] == {"matmul": {"measured": 0, "fitted": 0, "default": 1}}
    assert list(found.to_dict()["misses"]) == [f"matmul: {g.key}"]  # every unmeasured shape listed


def test_estimate_reports_sources() -> None:
    est = Estimate(load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system("a100-sxm-80gb"))
    sources = est.cost().efficiency_lookups["sources"]
    assert sources["matmul"]["default"] > 0 and sources["matmul"]["measured"] == 0
    est = Estimate(load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system("h100-sxm-80gb"))
    lookups = est.cost().efficiency_lookups
    # per estimate, one micro-batch through every chunk: 32 layers x 4 linears x 3 GEMMs + the LM head's 3
    assert lookups["sources"]["matmul"] == {"measured": 32 * 4 * 3 + 3, "fitted": 0, "default": 0}
    assert lookups["seconds"]["matmul"]["measured"] > 0 and lookups["seconds"]["matmul"]["fitted"] == 0
    # an identical estimate (sharing the profile cache) reports the same, not twice as much
    again = Estimate(est.model, est.strategy, est.system, profiles=est.profiles)
    assert again.cost().efficiency_lookups == lookups



def test_compute_time_shares_by_source() -> None:
    """The share of GEMM / attention seconds per source that `perf` prints beside the
    unmeasured shapes: from the seconds, not the lookup counts, and summing to one."""
    from simumax.uncertainty import attribution, compute_shares
    attr = {"compute/measured": 3.0, "compute/fitted": 1.0, "compute/default": 4.0, "memory": 50.0, "comm/default": 9.0}
    assert compute_shares(attr) == {"measured": 3 / 8, "fitted": 1 / 8, "default": 4 / 8}
    assert compute_shares({}) == {"measured": 0.0, "fitted": 0.0, "default": 0.0}
    est = Estimate(load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system("a100-sxm-80gb"))
    assert compute_shares(attribution(est)) == {"measured": 0.0, "fitted": 0.0, "default": 1.0}


@settings(max_examples=200, deadline=None)
@given(m=st.integers(1, 65536), n=st.integers(1, 65536), k=st.integers(1, 65536))
def test_default_curve_bounds(m: int, n: int, k: int) -> None:
    """Never above the asymptote; smaller (same tiling) never more efficient."""
    s = {"b": 1.0, "m": float(m), "n": float(n), "k": float(k)}
    e = default_curve(s, 0.7, 132)
    assert 0 < e <= 0.7 * (1 + 1e-9) / (2.0 * 8192**3 / (2.0 * 8192**3 + 2.0 * 256**3)) and e <= 0.71
    assert default_curve({**s, "k": float(max(1, k // 2))}, 0.7, 132) <= e + 1e-12


def test_wave_quantisation() -> None:
    """One tile more than the SMs hold needs a second, nearly empty wave."""
    full = {"b": 1.0, "m": 128.0 * 132, "n": 256.0, "k": 8192.0}
    over = {"b": 1.0, "m": 128.0 * 133, "n": 256.0, "k": 8192.0}
    assert baseline(over, 132) < 0.6 * baseline(full, 132)
    assert baseline(over, None) >= baseline(full, None)  # no SM count: no quantisation


@pytest.mark.parametrize("system", ["h100-sxm-80gb", "b200-sxm-180gb", "a100_pcie"])
def test_fit_never_beats_the_best_measured_entry(system: str) -> None:
    """A batch of small products (a chunked scan's: 2048 x 64 x 64 x 128) fills every SM, so
    its baseline is near 1, while its nearest entries are GEMMs whose measured rate is well
    above their own low baseline: the carried ratio once made a fitted efficiency of 1.125 on
    the H100 table (faster than peak). No fitted shape exceeds the table's best entry."""
    table = load_system(system).accelerator.op["matmul"].accurate_efficient_factor
    fit = TableFit(table, 132)
    best = max(table.values())
    for b, m, k, n in [(2048, 64, 128, 64), (2048, 64, 64, 128), (4096, 64, 64, 64), (32, 128, 4096, 128), (1, 8192, 8192, 8192)]:
        key = Gemm(m, k, n, "TN", b=b).key
        assert fit.predict(key) <= best


@pytest.mark.parametrize("system", ["a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72", "mi300x", "a100_pcie"])
def test_attention_efficiency_at_most_one(system: str) -> None:
    """Achieved efficiency on model FLOPs (causal attention counts half the score matrix)
    stays ≤ 1 for every measured and default attention shape, although table entries in
    SimuMax's full-matrix convention exceed 1."""
    y = load_system(system)
    cm = ComputeModel(y)
    shapes = [parse_key(k)[1] for fam in ("sdp_fwd", "sdp_bwd") for k in y.accelerator.op[fam].accurate_efficient_factor]
    shapes += [{"batch": 1, "seq_len": s, "head_num": h, "kv_head_num": 8, "qk_head_dim": 128, "v_head_dim": 128}
               for s in (1024, 4096, 32768) for h in (8, 32, 64)]
    for s in shapes:
        for phase in ("fwd", "bwd"):
            a = Attention(phase, int(s["batch"]), int(s["seq_len"]), int(s["head_num"]), int(s["kv_head_num"]),
                          int(s["qk_head_dim"]), int(s["v_head_dim"]))
            assert cm.compute(a)[1] <= 1.0


@pytest.mark.parametrize("system", ["b200-sxm-180gb", "a100-sxm-80gb"])  # fitted from a measured table; default curve
def test_non_causal_attention_block_runs_at_the_causal_work_rate(system: str) -> None:
    """Tables count a causal kernel's FLOPs over the whole score matrix while flash attention
    computes (s + 1) / 2s of it; a non-causal block (context-parallel steps) computes all
    of it. Where a table has no non-causal entries, the s x s block runs at the causal
    kernel's work rate: 2s / (s + 1) times its time (before: it was fitted from the causal
    entries as if they had done the whole matrix, and on the H100 table ran at the full bf16 peak)."""
    cm = ComputeModel(load_system(system))
    for s, phase in ((4096, "fwd"), (4096, "bwd"), (2048, "bwd")):
        shape = dict(batch=1, seq_len=s, head_num=32, kv_head_num=8, qk_head_dim=128, v_head_dim=128)
        causal = Attention(phase, **shape)
        block = Attention(phase, **shape, kv_seq_len=s, causal=False)
        assert block.key == causal.key.replace(", head_num", f", kv_seq_len={s}, head_num") + ", causal=False"
        assert cm.compute(block)[0] == pytest.approx(cm.compute(causal)[0] * 2 * s / (s + 1), rel=1e-9)
        assert cm.compute(block)[1] == pytest.approx(cm.compute(causal)[1], rel=1e-9)  # same work rate
    assert "causal" not in parse_key(causal.key)[1] and parse_key(block.key)[1]["causal"] == 0.0
    assert parse_key(block.key)[0] == ("causal=False",) and parse_key(causal.key)[0] == ()


def test_measured_non_causal_blocks_run_faster_than_the_causal_kernel() -> None:
    """Measured on the lent H100 (docs/calibration/h100_2026-11-27/non_causal_blocks.json):
    cuDNN's non-causal blocks do their work 1.25-1.6x faster than the causal kernel of the
    same shape (no masked diagonal tiles, no rows of unequal length), so a table that has
    non-causal entries fits a block from them, not from the causal work rate."""
    cm = ComputeModel(load_system("h100-sxm-80gb"))
    for s, h, g in ((4096, 32, 8), (8192, 16, 2)):
        for phase in ("fwd", "bwd"):
            causal = Attention(phase, 1, s, h, g, 128, 128)
            block = Attention(phase, 1, s, h, g, 128, 128, kv_seq_len=s, causal=False)
            assert cm.seconds_and_source(block)[2] == "measured"
            rate = cm.compute(block)[1] / cm.compute(causal)[1]  # work rates on model FLOPs
            print(f"{phase} s={s} heads {h}/{g}: non-causal / causal work rate {rate:.2f}")
            assert 1.1 < rate < 1.6


def test_h100_attention_shapes_held_out() -> None:
    """The NeMo rows' attention kernels, timed on the lent H100 (torch's default SDPA backend,
    cuDNN, as TransformerEngine picks it on Hopper; docs/calibration.md, "Attention shapes")
    and kept out of the table, against the fit over the table: batch 4 x 16 heads was 21-25 %
    too slow when batch and heads were separate distances (now within 10 %), the context-parallel
    blocks 30-50 % too slow at the causal work rate (now fitted from measured non-causal blocks,
    none of them these shapes). What stays furthest off: the 192-dim backward (19 % fast)."""
    data = json.loads((ROOT / "docs" / "calibration" / "h100_2026-11-27" / "attention_backends.json").read_text())
    cm = ComputeModel(load_system("nvidia_h100_80gb_hbm3"))
    errs = []
    for row in data["attn"]:
        k = Attention(**row["kernel"])
        real = min(t for t in (row["default"], row["cudnn"]) if t)  # both cuDNN; the GQA path differs
        pred, _, source = cm.seconds_and_source(k)
        err = pred / real - 1
        errs.append(abs(err))
        print(f"{k.phase} b{k.batch} s{k.seq_len} kv{k.kv_seq_len or k.seq_len} h{k.head_num}/{k.kv_head_num} "
              f"causal={k.causal}: {err:+.1%} ({source})")
        if (k.batch > 1 and k.seq_len == 4096) or not k.causal:
            assert abs(err) < 0.12
    print(f"median |error| {statistics.median(errs):.1%}, max {max(errs):.1%}")
    assert statistics.median(errs) < 0.06


# ---- hardware presets --------------------------------------------------------------------
def test_hardware_presets_are_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("m", ROOT / "docs" / "make_hardware_presets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, text in mod.render().items():
        path = ROOT / "src" / "simumax" / "config" / "presets" / "system" / name
        assert path.read_text() == text, f"run python docs/make_hardware_presets.py ({name})"


def test_hardware_presets_datasheet() -> None:
    b200 = load_system("b200-sxm-180gb")
    ref = load_system("b200_bf16_ceperm")
    assert ref.accelerator.mem_gbs == 80  # the reference file keeps its own (wrong) size
    assert 178 < b200.accelerator.mem_gbs < 181
    assert b200.accelerator.op["matmul"].accurate_efficient_factor == ref.accelerator.op["matmul"].accurate_efficient_factor
    peaks = {n: load_system(n).accelerator.op["matmul"].tflops for n in
             ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72", "mi300x")}
    assert peaks == {"a100-sxm-80gb": 312.0, "h100-sxm-80gb": 989.4, "h200-sxm-141gb": 989.4, "b200-sxm-180gb": 2250.0,
                     "gb200-nvl72": 2500.0, "mi300x": 1307.4}
    assert load_system("gb200-nvl72").num_per_node == 72
    assert load_system("h200-sxm-141gb").accelerator.bandwidth["default"].gbps == 4800.0


def test_preset_memory_bound_fractions_are_the_measured_systems() -> None:
    """The presets' generic memory-bound line is the fraction of datasheet HBM bandwidth
    that SimuMax's two measured Megatron systems' lines give (A100 80GB PCIe, B200), the mean
    of the two for architectures without one — not a STREAM copy's 0.85-0.94."""
    from simumax.config.hardware import (MEMBOUND_EFF_AMPERE, MEMBOUND_EFF_BLACKWELL, MEMBOUND_EFF_UNMEASURED,
                                         datasheet)

    def fraction(name: str) -> float:
        line = load_system(name).accelerator.bandwidth["default"]
        sheet = datasheet(name.replace("_pcie", "-pcie"))
        assert sheet is not None
        return line.efficient_factor * line.gbps / sheet.hbm_gbps

    ampere, blackwell = fraction("a100_pcie"), fraction("b200_bf16_ceperm")
    assert (MEMBOUND_EFF_AMPERE, MEMBOUND_EFF_BLACKWELL) == (round(ampere, 2), round(blackwell, 2))
    assert MEMBOUND_EFF_UNMEASURED == round((ampere + blackwell) / 2, 2)
    for preset, eff in (("a100-sxm-80gb", MEMBOUND_EFF_AMPERE), ("b200-sxm-180gb", MEMBOUND_EFF_BLACKWELL),
                        ("gb200-nvl72", MEMBOUND_EFF_BLACKWELL), ("h100-sxm-80gb", MEMBOUND_EFF_UNMEASURED),
                        ("mi300x", MEMBOUND_EFF_UNMEASURED)):
        assert load_system(preset).accelerator.bandwidth["default"].efficient_factor == eff, preset


@pytest.mark.parametrize(("sibling", "rack"), [("b200-sxm-180gb", "gb200-nvl72"), ("b300-sxm-288gb", "gb300-nvl72")])
def test_grace_blackwell_runs_its_sibling_kernels_in_the_sibling_time(sibling: str, rack: str) -> None:
    """GB200 is the B200 die (148 SMs), GB300 the B300 die; the racks' higher datasheet rate
    is a larger power budget. GB200 takes B200's measured tables as kernel times, GB300 the
    default curves at B300's rates: every measured, fitted and default GEMM / attention shape
    costs the same seconds on both, bf16 and fp8, while MFU is counted against the rack GPU's
    own peak."""
    from simumax.cost.efficiency import ComputeModel
    from simumax.graph.kernels import Attention, Gemm, GroupGemm

    base, gb = ComputeModel(load_system(sibling)), ComputeModel(load_system(rack))
    table = load_system("b200_bf16_ceperm").accelerator.op["matmul"].accurate_efficient_factor
    assert table  # measured shapes exist, and unmeasured ones below go through the fit and curve
    kernels = [Gemm(4096, 8192, 4096, "NN"), Gemm(8192, 8192, 28672, "TN"), Gemm(333, 1000, 77, "NT", True, "fp32"),
               Gemm(4096, 4096, 4096, "TN", family="fp8_matmul"), GroupGemm(8, 2048, 7168, 2048, "fwd"),
               Attention("fwd", 1, 4096, 64, 8, 128, 128, True),
               Attention("bwd", 2, 8192, 32, 32, 128, 128, True)]
    for k in kernels:
        assert gb.compute(k)[0] == pytest.approx(base.compute(k)[0], rel=1e-5), k
    assert load_system(rack).accelerator.op["matmul"].tflops == 2500.0


# ---- collectives across nodes -----------------------------------------------------------
def _net(tp: int, dp: int, system: str = "h100-sxm-80gb") -> NetworkModel:
    st_ = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": tp * dp, "tp_size": tp}, source="test")
    return NetworkModel(load_system(system), st_)


def test_dp_all_reduce_across_1024_nodes_by_hand() -> None:
    """TP8 x DP1024: one DP rank per node, a flat all-reduce over 1024 NICs:
    2(N-1)/N · B / (50 GB/s · 0.85) + 20 µs fixed + 2·log2(1024) tree steps · 5 µs."""
    net = _net(8, 1024)
    b = 1e9
    t = net.time(Collective("all_reduce", b, "dp"))
    hand = 2 * 1023 / 1024 * b / (50e9 * 0.85) + 20e-6 + 2 * 10 * 5e-6
    assert t == pytest.approx(hand, rel=1e-12)


def test_dp_all_reduce_hierarchical_by_hand() -> None:
    """TP1 x DP8192 (8 per node, 1024 nodes): reduce-scatter over NVLink, all-reduce of
    1/8 across nodes, all-gather over NVLink."""
    net = _net(1, 8192)
    b = 1e9
    nv = lambda frac: b * frac / (450e9 * 0.8) + 8e-6 + 7 * 2e-6  # noqa: E731  (8 µs + 7 ring steps)
    hand = nv(7 / 8) + (2 * 1023 / 1024 * (b / 8) / (50e9 * 0.85) + 20e-6 + 2 * 10 * 5e-6) + nv(7 / 8)
    assert net.time(Collective("all_reduce", b, "dp")) == pytest.approx(hand, rel=1e-12)
    # far cheaper than pushing the whole buffer through each NIC
    assert net.time(Collective("all_reduce", b, "dp")) < _net(8, 1024).time(Collective("all_reduce", b, "dp"))


def test_intra_node_groups_unchanged_and_scaling_monotone() -> None:
    net = _net(8, 1)
    b = 64e6
    # inside the node: the ring's 2(n-1) steps of 2 µs after the 8 µs fixed latency
    assert net.time(Collective("all_reduce", b, "tp")) == pytest.approx(2 * 7 / 8 * b / (450e9 * 0.8) + 8e-6 + 14 * 2e-6)
    times = [_net(8, dp).time(Collective("all_reduce", b, "dp")) for dp in (2, 4, 16, 128, 1024)]
    assert times == sorted(times)
    # the per-step latency grows with log2(nodes) for all-reduce, linearly for all-gather
    ag = [_net(8, dp).time(Collective("all_gather", 1e3, "dp")) for dp in (64, 1024)]
    ar = [_net(8, dp).time(Collective("all_reduce", 1e3, "dp")) for dp in (64, 1024)]
    assert ag[1] - ag[0] > 10 * (ar[1] - ar[0])
    assert math.isfinite(ar[1])


def test_presets_run_multi_node_jobs() -> None:
    """Every preset estimates a 1024-GPU Llama3-70B job (presets only, no tables needed)."""
    for name in ("a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72", "mi300x"):
        st_ = load_strategy("tp8_pp1_dp1_mbs1").with_updates(
            {"world_size": 1024, "pp_size": 8, "micro_batch_num": 64, "enable_recompute": True,
             "recompute_granularity": "full_block", "recompute_layer_num": 10}, source="test")
        cost = Estimate(load_model("llama3-70b"), st_, load_system(name)).cost()
        assert 0.1 < cost.mfu < 0.7, (name, cost.mfu)
        assert json.dumps(cost.to_dict())


def test_collective_latency_per_ring_step_by_hand() -> None:
    """SimuMax's per-op latency_us is paid per ring step, fixed_latency_us (by group size when
    given) once; an op without latency_us pays the tier's bandwidth latency once. A SimuMax
    tier's gbps counts 2^30 bytes (docs/compat.md)."""
    gib = 2**30
    st8 = load_strategy("tp8_pp1_dp1_mbs1")
    net = NetworkModel(load_system("b200_bf16_ceperm"), st8)
    b = 64 * 2**20
    ag = net._flat("high_intra_node", "all_gather", b, 8)
    assert ag == pytest.approx(7 / 8 * b / (900 * gib * 0.6735) + (7 * 9.1828 + 23.1049) * 1e-6, rel=1e-12)
    ar = net._flat("high_intra_node", "all_reduce", b, 8)
    assert ar == pytest.approx(2 * 7 / 8 * b / (900 * gib * 0.7424) + (14 * 5.5183 + 22.2316) * 1e-6, rel=1e-12)
    a2a = net._flat("high_intra_node", "all2all", b, 4)  # fixed_latency_us_by_comm_num["4"] = 19.2102
    assert a2a == pytest.approx(3 / 4 * b / (900 * gib * 0.5968) + (3 * 7.3039 + 19.2102) * 1e-6, rel=1e-12)
    p2p = NetworkModel(load_system("a100_pcie"), st8)._flat("intra_node_pcie_8x", "p2p", b, 2)
    assert p2p == pytest.approx(b / (30 * gib * 0.5) + 10e-6, rel=1e-12)  # no op latency: the tier's, once


def test_link_gigabytes_are_the_files_own() -> None:
    """A tier's gbps counts 2^30 bytes in SimuMax's files (unset gbps_unit) and 1e9 where the
    tier says GB: the presets, calibrate-comm and a bandwidth derived from the NICs. The
    unit is kept on a round trip and left out of a SimuMax file that did not have it."""
    st8 = load_strategy("tp8_pp1_dp1_mbs1")
    simumax = load_system("b200_bf16_ceperm")
    assert simumax.networks.tiers["high_intra_node"].gbps_unit is None
    assert "gbps_unit" not in simumax.to_dict()["networks"]["high_intra_node"]
    gb = simumax.with_updates({"networks": {**simumax.to_dict()["networks"], "high_intra_node": {
        **simumax.to_dict()["networks"]["high_intra_node"], "gbps_unit": "GB"}}})
    assert gb.to_dict()["networks"]["high_intra_node"]["gbps_unit"] == "GB"
    b = 64 * 2**20
    t_gib = NetworkModel(simumax, st8)._flat("high_intra_node", "all_gather", b, 8)
    t_gb = NetworkModel(gb, st8)._flat("high_intra_node", "all_gather", b, 8)
    latency = (7 * 9.1828 + 23.1049) * 1e-6
    assert (t_gb - latency) == pytest.approx((t_gib - latency) * 2**30 / 1e9, rel=1e-12)
    for preset in ("h100-sxm-80gb", "a100-sxm-80gb", "gb200-nvl72", "nvidia_h100_80gb_hbm3"):
        assert {t.gbps_unit for t in load_system(preset).networks.tiers.values()} == {"GB"}, preset
    derived = simumax.with_updates({"nics_per_node": 8, "nic_gbps": 400})  # 8 x 400 Gb/s over 8 GPUs
    tier = derived.networks.tiers["inter_node"]
    assert (tier.gbps_unit, tier.bandwidth.gbps, tier.bytes_per_gb) == ("GB", 50.0, 1e9)


def test_table_fit_is_shared_by_estimates_and_refitted_after_an_edit() -> None:
    """Estimates of one system config share each table's fit (fitting parses every key);
    editing the table in place gives the next estimate a fit of the edited table."""
    sy = load_system("a100_pcie")
    unmeasured = Gemm(m=3000, k=5000, n=7000, layout="TN")  # no such key in the table
    first, second = ComputeModel(sy), ComputeModel(sy)
    assert first._fit("matmul") is second._fit("matmul")
    before = first.compute(unmeasured)[0]
    assert first.seconds_and_source(unmeasured)[2] == "fitted"
    table = sy.accelerator.op["matmul"].accurate_efficient_factor
    for key in table:
        table[key] *= 0.5  # every measured GEMM twice as slow
    after = ComputeModel(sy).compute(unmeasured)[0]
    assert after == pytest.approx(2 * before, rel=1e-9)
