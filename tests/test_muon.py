"""Muon as megatron-core 0.19 runs it (dp/muon.py): which weights it steps, its states, the
Newton-Schulz work of its step, the layer-wise distributed optimizer, Megatron's flags."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.dp.muon import Matrix, _busiest_owner, elementwise_kernels, host_seconds, muon_params, ns_flops, ns_kernels, stage_matrices
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags, model_flags
from simumax.graph.kernels import Gemm, MemBound
from simumax.importers.megatron_args import parse_megatron_args

SYSTEM = load_system("h100-sxm-80gb")
LLAMA = load_model("llama3.1-8b").with_updates({"layer_num": 2})


def _est(model=LLAMA, **st) -> Estimate:
    return Estimate(model, load_strategy("tp1_pp1_dp8_mbs1").with_updates({"optimizer": "muon", **st}), SYSTEM)


def test_newton_schulz_flops_by_hand() -> None:
    """On the short side m of an m x n weight, each quintic step is A = X X^T (2 m^2 n),
    A·A (2 m^3) and B·X (2 m^2 n), on TF32 tensor cores (fp32 at the "medium" precision);
    the two addmm copy their fp32 input (A: m x m, X: m x n) into the output first and then
    accumulate; the kernels before them normalise X (read twice, write)."""
    w = Matrix(14336, 4096, 1, False)
    m, n = 4096, 14336
    assert ns_flops(w, 5) == 5 * (4 * m * m * n + 2 * m**3)
    kernels = ns_kernels(w, 5)
    gemms = [k for k in kernels if isinstance(k, Gemm)]
    assert len(gemms) == 15 and sum(k.flops for k in gemms) == ns_flops(w, 5)
    assert {k.family for k in gemms} == {"tf32_matmul"} and [k.accumulate for k in gemms[:3]] == [False, True, True]
    copies = [k.bytes for k in kernels if isinstance(k, MemBound) and k.name == "muon.addmm_copy"]
    assert copies == [8 * m * m, 8 * m * n] * 5
    assert kernels[0].bytes == 3 * 4 * m * n


def test_elementwise_chain_by_hand() -> None:
    """Besides the iterations a weight's step reads and writes, per element of its fp32
    master: weight decay 4 + 4, momentum lerp_ 8 + 4, Nesterov lerp 8 + 4, two scale
    products 2 x (4 + 4), update 8 + 4, cast to bf16 4 + 2: 78 B (emerging_optimizers'
    OrthogonalizedOptimizer.step with Megatron's defaults)."""
    e = 4096 * 1024
    assert sum(k.bytes for k in elementwise_kernels(Matrix(4096, 1024, 1, False), 2)) == 78 * e - 12 * e  # normalise apart
    assert sum(k.launches for k in elementwise_kernels(Matrix(4096, 1024, 1, False), 2)) == 7


def test_host_bound_small_weights() -> None:
    """The optimizer issues about 31 PyTorch ops per weight from Python (11 + 4 per
    iteration at 5); a rank takes the longer of its weights' GPU time and that host time:
    Qwen3-30B-A3B's experts (768 x 2048, 1536 x 2048) are host-bound at the 30 us default
    (0.93 ms per weight; measured 0.73-1.00 on two H100 machines), a 4096 x 4096 weight
    GPU-bound."""
    assert host_seconds(5, 30.0) == pytest.approx(31 * 30e-6)
    assert _busiest_owner([(100, 1e-4, 10)], 1, host_seconds(5, 30.0)) == pytest.approx(10 * 31 * 30e-6)
    assert _busiest_owner([(100, 7e-3, 2)], 1, host_seconds(5, 30.0)) == pytest.approx(14e-3)
    moe = load_model("qwen3-30b-a3b").with_updates({"layer_num": 2})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"optimizer": "muon"})
    slow, fast = (Estimate(moe, st, SYSTEM.with_updates({"host_op_us": us})) for us in (30.0, 1.0))
    t_slow, t_fast = (e.cost().breakdown["optimizer"] for e in (slow, fast))
    experts = sum(n for m, n in stage_matrices(moe, st, slow.stages[0]) if m.expert)
    assert experts == 2 * 2 * 128 // 8
    assert t_fast < experts * host_seconds(5, 30.0) <= t_slow  # host-bound at 30 us, not at 1


def test_which_weights_and_their_states() -> None:
    """Llama (GQA 32 / 8 heads of 128): q, k, v (split), o, the fused gate-up FC1 and FC2 of
    each layer are Muon's; the embedding, output layer and norms go to Adam. States per
    parameter: Muon 4 (master) + 4 (momentum), Adam 4 + 8; over 8 data-parallel ranks with
    the (layer-wise) distributed optimizer, on every rank without it."""
    e = _est()
    h, f = 4096, 14336
    per_layer = [(4096, h), (1024, h), (1024, h), (h, 4096), (2 * f, h), (h, f)]
    mats = stage_matrices(LLAMA, e.strategy, e.stages[0])
    assert sorted((m.rows, m.cols) for m, n in mats for _ in range(n)) == sorted(per_layer * 2)
    dense, expert = muon_params(e.stages[0])
    assert expert == 0 and dense == 2 * sum(r * c for r, c in per_layer)
    rest = e.params.total - dense
    assert e.memory().stages[0].optimizer == pytest.approx((8 * dense + 12 * rest) / 8)
    assert _est(zero_state=0).memory().stages[0].optimizer == pytest.approx(8 * dense + 12 * rest)
    adam = Estimate(LLAMA, load_strategy("tp1_pp1_dp8_mbs1"), SYSTEM).memory().stages[0].optimizer
    assert adam - e.memory().stages[0].optimizer == pytest.approx(4 * dense / 8)
    fused = stage_matrices(LLAMA, _est(muon_split_qkv=False).strategy, e.stages[0])
    assert (6144, h) in {(m.rows, m.cols) for m, _ in fused}  # --muon-no-split-qkv: the fused QKV weight
    lion = _est(muon_scalar_optimizer="lion").memory().stages[0].optimizer
    assert e.memory().stages[0].optimizer - lion == pytest.approx(4 * rest / 8)


def test_experts_and_router_and_tensor_parallel_shards() -> None:
    """Each local expert's weights are Muon's (one matrix each), as is the router's [E, h]
    weight; with TP each rank orthogonalises its own shard (blockwise)."""
    moe = load_model("mixtral-8x7b").with_updates({"layer_num": 1})
    e = Estimate(moe, load_strategy("tp1_pp1_dp8_mbs1").with_updates({"optimizer": "muon", "ep_size": 8}), SYSTEM)
    mats = stage_matrices(moe, e.strategy, e.stages[0])
    experts = [(m.rows, m.cols, n) for m, n in mats if m.expert]
    assert sorted(experts) == sorted([(2 * 14336, 4096, 1), (4096, 14336, 1)])  # one expert per rank at EP8
    assert (8, 4096) in {(m.rows, m.cols) for m, _ in mats if not m.expert}  # the router
    tp2 = _est(tp_size=2, world_size=8, enable_sequence_parallel=True)
    assert (2048, 4096) in {(m.rows, m.cols) for m, _ in stage_matrices(LLAMA, tp2.strategy, tp2.stages[0])}


def test_step_time_layer_wise_and_replicated() -> None:
    """Without the distributed optimizer every rank orthogonalises every weight; the
    layer-wise one takes about 1/dp of them, no less than the largest; both beyond Adam's
    step. The breakdown still sums to the iteration, and the event simulator agrees."""
    from simumax.simulate.outputs import simulate_to

    adam = Estimate(LLAMA, load_strategy("tp1_pp1_dp8_mbs1"), SYSTEM).cost().breakdown["optimizer"]
    layer_wise = _est().cost()
    replicated = _est(zero_state=0).cost()
    assert replicated.breakdown["optimizer"] > 3 * layer_wise.breakdown["optimizer"] > 3 * adam
    for c in (layer_wise, replicated):
        assert sum(c.breakdown.values()) == pytest.approx(c.duration_time_per_iter, rel=1e-12)
    e = _est(pp_size=2, world_size=8)
    assert simulate_to(e, None).duration_time_per_iter == pytest.approx(e.cost().duration_time_per_iter, rel=1e-9)


def test_refused_as_megatron_refuses_it() -> None:
    for bad, field in (({"dtype": "fp16"}, "optimizer"), ({"zero_state": 2}, "optimizer"),
                       ({"use_precision_aware_optimizer": True}, "optimizer"),
                       ({"interleaving_size": 2, "pp_size": 2, "overlap_param_gather_with_optimizer_step": True},
                        "overlap_param_gather_with_optimizer_step")):
        with pytest.raises(ConfigError, match=field):
            load_strategy("tp1_pp1_dp8_mbs1").with_updates({"optimizer": "muon", **bad})


def test_megatron_flags_round_trip() -> None:
    """--optimizer muon (dist_muon: with the distributed optimizer), --muon-num-ns-steps,
    --muon-no-split-qkv, --muon-scalar-optimizer both ways; its hyper-parameters read as no
    effect; a TP mode or matmul precision other than the modelled defaults said in a note."""
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"optimizer": "muon", "muon_num_ns_steps": 6,
                                                        "muon_split_qkv": False, "muon_scalar_optimizer": "lion"})
    flags = model_flags(LLAMA) + megatron_flags(st, LLAMA)
    assert "--optimizer muon" in flags and "--muon-no-split-qkv" in flags
    _, back, _ = parse_megatron_args(flags, world_size=8)
    assert (back.optimizer, back.muon_num_ns_steps, back.muon_split_qkv, back.muon_scalar_optimizer) == ("muon", 6, False, "lion")
    _, dist, notes = parse_megatron_args(model_flags(LLAMA) + ["--seq-length", "4096", "--bf16", "--optimizer", "dist_muon",
                                                                "--muon-momentum", "0.95", "--muon-tp-mode", "duplicated"],
                                         world_size=8)
    assert dist.optimizer == "muon" and dist.zero_state == 1
    assert any("--muon-momentum" in n and "no effect" in n for n in notes)
    assert any("--muon-tp-mode" in n and "not modelled" in n for n in notes)


def test_layer_wise_packing_by_hand() -> None:
    """Megatron packs whole weights largest first onto the rank holding the fewest elements;
    the busiest rank's seconds set the step. Sizes 10, 6, 5, 5 with 1.0, 5.0, 0.5, 0.5 s over
    two ranks: 10 -> rank 0, 6 -> rank 1, 5 -> rank 1 (6 < 10), 5 -> rank 0 (10 < 11): rank 1
    takes 5.5 s where an even split would say 3.5; more ranks than weights: the longest."""
    weights = [(10, 1.0, 1), (6, 5.0, 1), (5, 0.5, 2)]
    assert _busiest_owner(weights, 2) == 5.5
    assert _busiest_owner(weights, 8) == 5.0
    assert _busiest_owner(weights, 1) == 7.0


def test_calibrate_times_muons_tf32_gemms() -> None:
    """``simumax calibrate`` on a Muon job times the Newton-Schulz GEMMs (TF32, on each weight's
    short side) beside the model's; an Adam job has none."""
    from simumax.calibrate.shapes import job_kernels

    muon = job_kernels(LLAMA, _est().strategy, SYSTEM)
    adam = job_kernels(LLAMA, load_strategy("tp1_pp1_dp8_mbs1"), SYSTEM)
    assert "tf32_matmul" not in adam.gemms
    shapes = {(k.m, k.k, k.n) for k in muon.gemms["tf32_matmul"]}
    assert {(1024, 4096, 1024), (1024, 1024, 4096), (4096, 14336, 4096), (4096, 4096, 4096)} <= shapes
