"""The MoE router as Megatron-Core runs it (graph/router.py, graph/moe_layer._router): the
kernel chain its routing options choose, TE's fused router (``moe_router_fusion``) and the
fp32 router (``moe_router_dtype``, Megatron's --moe-router-dtype) with its TF32 GEMMs.

The fp32 router follows megatron-core's RouterGatingLinearFunction (transformer/moe/
moe_utils.py, 0.19.2): the gating GEMM on the bf16 input and weight writes fp32 logits; its
backward casts the weight (data gradient) and the input (weight gradient) to fp32, runs both
GEMMs on fp32 operands and casts the results back to bf16; every routing tensor is in the
logits' dtype.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from simumax.config.loader import load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.cost.efficiency import TF32_OF_BF16_PEAK, ComputeModel
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.kernels import Collective, Gemm, MemBound
from simumax.graph.router import router_kernels

MEASURED = Path(__file__).parents[1] / "docs" / "calibration" / "router_dtype_2026-11-27" / "h100.json"
T, H, E, K = 4096, 1024, 64, 6  # tokens, hidden, experts, top-k


def _moe() -> ModelConfig:
    return ModelConfig.init_from_dict({"model_type": "moe", "hidden_size": H, "head_num": 8, "intermediate_size": 2048,
                                       "layer_num": 2, "vocab_size": 32000, "expert_num": E, "topk": K})


def _est_on(model: ModelConfig, **strategy) -> Estimate:
    st = StrategyConfig.init_from_dict({"seq_len": 2048, "world_size": 1, "micro_batch_size": 2, **strategy})
    return Estimate(model, st, load_system("h100-sxm-80gb"))


def _est(**strategy) -> Estimate:
    return _est_on(_moe(), **strategy)


def _dims():
    return _est().layer_profiles.source.dims  # bf16, 2 x 2048 tokens, tp 1


def _router_op(est: Estimate):
    return next(o for o in est.chunks[0].ops if o.module == "router")


def _kernels(fp32: bool):
    return router_kernels(_moe(), _dims(), "L1", T, H, capacity=False, dp_reduce=True, fp32=fp32)


# ---- the chain from the routing options, TE's fused router --------------------------------
def _router(fused: bool = False, **opts):
    m = ModelConfig.init_from_dict({"model_type": "moe", "hidden_size": 1024, "head_num": 8, "intermediate_size": 2048,
                                    "layer_num": 2, "vocab_size": 1000, "expert_num": 64, "topk": 6, **opts})
    d = _dims()
    fwd, bwd = router_kernels(m, d, "L1", 4096, 1024, capacity=False, dp_reduce=True, fused=fused)
    names = lambda ks: [k.name.split("router.")[1] for k in ks if isinstance(k, MemBound)]  # noqa: E731
    return names(fwd), names(bwd), fwd, bwd


def test_router_chain_megatron_defaults() -> None:
    """top-k of the logits, softmax over the k, dense maps, aux loss: Megatron's defaults."""
    f, b, fwd, bwd = _router()
    assert f == ["topk", "topk_softmax", "gates_zeros", "gates_scatter", "map_zeros", "map_scatter", "map_bool",
                 "tokens_per_expert", "aux_scores", "aux_loss"]
    assert b == ["gather_bwd", "softmax_bwd", "topk_bwd", "aux_bwd", "add_grads"]
    assert isinstance(fwd[0], Gemm) and (fwd[0].m, fwd[0].k, fwd[0].n) == (4096, 1024, 64)
    t, E, k = 4096, 64, 6
    by = {kk.name.split("router.")[1]: kk.bytes for kk in fwd if isinstance(kk, MemBound)}
    assert by["topk"] == t * E * 2 + t * k * (2 + 8)  # read bf16 logits, write values + int64 indices
    assert by["aux_scores"] == t * E * (2 + 4)  # softmax over all experts in fp32


def test_router_chain_deepseek_v3_options() -> None:
    f, b, fwd, _ = _router(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                           moe_router_topk_scaling_factor=2.5, moe_router_num_groups=8, moe_router_group_topk=4,
                           moe_router_load_balancing_type="seq_aux_loss")
    default_f, default_b, _, _ = _router()
    assert f[:2] == ["sigmoid", "add_expert_bias"]
    assert f[2:9] == ["group_scores_topk", "group_scores_sum", "group_topk", "group_mask_zeros", "group_mask_scatter",
                      "group_mask_expand", "masked_scores"]
    assert "gather_scores" in f and "probs_normalise" in f and "scale_probs" in f and "expert_bias_tokens" in f
    assert "aux_seq_tokens_per_expert" in f and "topk_softmax" not in f
    assert len(f) - len(default_f) == 14 and len(b) - len(default_b) == 3
    assert "sigmoid_bwd" in b and "masked_scores_bwd" in b and "probs_normalise_bwd" in b and "scale_probs_bwd" in b


def test_router_chain_other_options() -> None:
    f, b, fwd, _ = _router(moe_router_load_balancing_type="none")
    assert "aux_scores" not in f and "aux_bwd" not in b and "add_grads" not in b
    f, b, _, _ = _router(moe_router_pre_softmax=True, moe_z_loss_coeff=1e-3)
    assert f[:3] == ["z_loss.logsumexp", "z_loss.mean", "softmax"] and "topk_softmax" not in f
    assert "z_loss_bwd" in b and b[-1] == "add_grads"
    _, _, fwd, _ = _router(moe_router_load_balancing_type="global_aux_loss")
    assert Collective("all_reduce", 64 * 4.0, "dp") in fwd  # tokens per expert over the data-parallel ranks
    with pytest.raises(ConfigError, match="moe_router_group_topk"):
        _router(moe_router_num_groups=8)


@pytest.mark.parametrize("opts", [{}, {"moe_router_score_function": "sigmoid", "moe_router_enable_expert_bias": True,
                                    "moe_router_topk_scaling_factor": 2.5, "moe_router_num_groups": 8,
                                    "moe_router_group_topk": 4, "moe_router_load_balancing_type": "seq_aux_loss"}])
def test_fused_router_is_one_kernel_each_way_whatever_the_options(opts) -> None:
    """--moe-router-fusion (TE's fused_topk_with_score_function, fused aux-loss scores and
    loss): score function, groups, bias, top-k, scaling and the dense probabilities in one
    kernel reading bf16 logits and writing bf16 probabilities, the bool map and an fp32
    intermediate (2 + 2 + 1 + 4 B per token x expert); backward reads map, intermediate and
    gradient and writes the logits' gradient (1 + 4 + 2 + 2 B). The aux loss: fused scores
    (2 in, 4 + 1 + 4 out), the map's count, the loss over the scores; backward the loss's
    gradient (4 out), the scores' (4 + 4 in, 2 out)."""
    te = 4096 * 64.0
    f, b, fwd, bwd = _router(fused=True, **opts)
    seq = ["aux_seq_tokens_per_expert"] if opts else []
    bias = ["expert_bias_tokens"] if opts else []
    assert f == ["fused_topk", "tokens_per_expert", "aux_fused_scores", "aux_tokens_per_expert", *seq, "aux_loss", *bias]
    assert b == ["fused_topk_bwd", "aux_fused_loss_bwd", "aux_fused_scores_bwd", "add_grads"]
    by = {k.name.split("router.")[1]: k.bytes for k in [*fwd, *bwd] if isinstance(k, MemBound)}
    assert by["fused_topk"] == by["fused_topk_bwd"] == te * 9
    assert by["aux_fused_scores"] == te * 11 and by["aux_fused_scores_bwd"] == te * 10
    assert isinstance(fwd[0], Gemm) and isinstance(bwd[-1], Gemm)  # the gating GEMMs as unfused
    unfused_f, unfused_b, _, _ = _router(**opts)
    # kernels saved: forward 5 at Megatron's defaults, 17 with DeepSeek-V3's options; backward 1 and 4
    assert len(unfused_f) - len(f) == (17 if opts else 5) and len(unfused_b) - len(b) == (4 if opts else 1)


def test_fused_router_in_the_estimate_and_its_flag() -> None:
    """The strategy's moe_router_fusion reaches the MoE layers (fewer, not slower, router
    kernels; TE's saved intermediates), refuses a TE before 2.7, and round-trips Megatron's
    --moe-router-fusion."""
    from simumax.export.megatron_flags import megatron_flags
    from simumax.importers.megatron_args import parse_megatron_args

    m = ModelConfig.init_from_dict({"model_type": "moe", "hidden_size": 1024, "head_num": 8, "intermediate_size": 2048,
                                    "layer_num": 2, "vocab_size": 32000, "expert_num": 64, "topk": 6})
    plain, fused = (_est_on(m, moe_router_fusion=f) for f in (False, True))
    router = [next(o for o in e.chunks[0].ops if o.module == "router") for e in (plain, fused)]
    assert len(router[1].fwd) < len(router[0].fwd) and len(router[1].bwd_input) < len(router[0].bwd_input)
    assert fused.cost().duration_time_per_iter < plain.cost().duration_time_per_iter
    te = 2 * 2048 * 64.0  # tokens x experts
    assert [(n.split(".", 1)[1], b) for n, b in router[1].saved[1:]] == [
        ("router.intermediate", te * 4), ("router.map", te), ("router.aux_intermediate", te * 4)]
    with pytest.raises(ConfigError, match="moe_router_fusion"):
        _est_on(m, moe_router_fusion=True, te_version="2.6.0").cost()
    flags = megatron_flags(fused.strategy, m)
    assert "--moe-router-fusion" in flags
    _, st, _ = parse_megatron_args(flags + ["--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "8",
                                            "--num-experts", "64", "--moe-router-topk", "6", "--seq-length", "2048",
                                            "--vocab-size", "32000"])
    assert st.moe_router_fusion


def test_router_flags_import_export() -> None:
    from simumax.config.loader import load_model
    from simumax.export.megatron_flags import model_flags
    from simumax.importers.megatron_args import parse_megatron_args

    m0 = load_model("deepseek-v3").with_updates({"layer_num": 4, "moe_z_loss_coeff": 0.001})
    flags = model_flags(m0)
    assert "--moe-router-score-function sigmoid" in flags and "--moe-router-enable-expert-bias" in flags
    m, _, notes = parse_megatron_args(flags + ["--seq-length", "4096", "--attention-dropout", "0", "--hidden-dropout", "0",
                                               "--moe-token-dispatcher-type", "alltoall", "--bf16"])
    assert not notes
    for name in ("moe_router_score_function", "moe_router_num_groups", "moe_router_group_topk", "moe_router_topk_scaling_factor",
                 "moe_router_load_balancing_type", "moe_router_enable_expert_bias", "moe_z_loss_coeff", "moe_router_pre_softmax"):
        assert getattr(m, name) == getattr(m0, name), name


def test_forced_load_balancing_random_logits() -> None:
    """--moe-router-force-load-balancing (megatron-core 0.19 router.py TopKRouter.forward,
    moe_utils.RandomSTE): the logits' clone filled by normal_ before the routing chain (read and
    write, then write, of tokens x experts bf16), a straight-through backward (no kernel). The
    tokens then route uniformly at random, as modelled: the routed ops rest on no guess (not
    flagged approximate, tests/test_uncertainty.py), moe_load_imbalance must stay 1, and the
    flag round-trips through Megatron's arguments."""
    from simumax.export.megatron_flags import model_flags
    from simumax.importers.megatron_args import parse_megatron_args

    f, b, fwd, _ = _router(moe_router_force_load_balancing=True)
    default_f, default_b, _, _ = _router()
    assert f == ["random_logits.clone", "random_logits.normal", *default_f] and b == default_b
    te = 4096 * 64.0
    assert [k.bytes for k in fwd[1:3]] == [2 * te * 2, te * 2]
    dropless = _moe().with_updates({"moe_pad_expert_input_to_capacity": False, "capacity": None})
    m = dropless.with_updates({"moe_router_force_load_balancing": True})
    assert not any(op.approximate for op in _est_on(m).chunks[0].ops)
    assert {op.module for op in _est_on(dropless).chunks[0].ops if op.approximate} >= {"dispatch", "expert_fc1", "combine"}
    with pytest.raises(ConfigError, match="moe_load_imbalance"):
        _moe().with_updates({"moe_router_force_load_balancing": True, "moe_load_imbalance": 1.2})
    flags = model_flags(m)
    assert "--moe-router-force-load-balancing" in flags
    back, _, notes = parse_megatron_args(flags + ["--seq-length", "2048", "--bf16"])
    assert back.moe_router_force_load_balancing and not any("force-load" in n for n in notes)


# ---- moe_router_dtype fp32 -------------------------------------------------------------------
def test_fp32_router_kernels_by_hand() -> None:
    """Forward: the gating GEMM writes fp32; the chain reads and writes 4-byte logits and
    probabilities (top-k: t x E x 4 in, t x k x (4 + 8) out). Backward ends with the weight
    cast to fp32 (E x h x (2 + 4) B), the data-gradient GEMM on TF32 (fp32 out) and its
    output cast back (t x h x (4 + 2) B)."""
    fwd, bwd = _kernels(fp32=True)
    fwd16, bwd16 = _kernels(fp32=False)
    assert fwd[0] == Gemm(T, H, E, "TN", out_dtype="fp32") and fwd16[0] == Gemm(T, H, E, "TN")
    by = {k.name.split("router.")[1]: k.bytes for k in fwd if isinstance(k, MemBound)}
    by16 = {k.name.split("router.")[1]: k.bytes for k in fwd16 if isinstance(k, MemBound)}
    assert by["topk"] == T * E * 4 + T * K * (4 + 8) and by16["topk"] == T * E * 2 + T * K * (2 + 8)
    assert by["gates_zeros"] == 2 * by16["gates_zeros"] == T * E * 4
    assert [type(k).__name__ for k in bwd[-3:]] == ["MemBound", "Gemm", "MemBound"]
    cast, gemm, back = bwd[-3:]
    assert cast.bytes == E * H * (2 + 4) and back.bytes == T * H * (4 + 2)
    assert gemm == Gemm(T, E, H, "NN", out_dtype="fp32", family="tf32_matmul")
    assert gemm.bytes == (T * E + E * H) * 4 + T * H * 4  # fp32 operands and output
    assert bwd16[-1] == Gemm(T, E, H, "NN")
    assert len(fwd) == len(fwd16) and len(bwd) == len(bwd16) + 2


def test_tf32_gemm_runs_the_bf16_shape_at_half_the_peak() -> None:
    """Without a TF32 family of its own a system prices a TF32 GEMM at its bf16 family's
    efficiency for the shape against half the bf16 peak (datasheets since Ampere), so a
    compute-bound shape takes twice the bf16 time; a system that has ``tf32_matmul`` uses it."""
    system = load_system("h100-sxm-80gb")
    cm = ComputeModel(system)
    big = Gemm(8192, 8192, 8192, "NN", out_dtype="fp32")
    t16, fam16, _ = cm.seconds_and_source(big)
    t32, fam32, src32 = cm.seconds_and_source(big._replace(family="tf32_matmul"))
    assert fam16 == fam32 == "matmul" and src32 == "default"
    assert t32 == pytest.approx(t16 / TF32_OF_BF16_PEAK)
    # a skinny one is memory-bound: its floor counts 4-byte operands
    skinny = Gemm(65536, 8192, 8, "NN", out_dtype="fp32", family="tf32_matmul")  # [t, h] @ [h, 8]
    hbm = system.accelerator.bandwidth["default"]
    assert cm.compute(skinny)[0] >= skinny.bytes / (hbm.gbps * 1e9 * hbm.efficient_factor)
    assert skinny.bytes == pytest.approx(2 * skinny._replace(family="matmul").bytes, rel=0.01)
    # a system with a TF32 family of its own: its peak, its efficiency
    raw = system.model_dump()
    raw["accelerator"]["op"]["tf32_matmul"] = {"tflops": 400.0, "efficient_factor": 0.5, "accurate_efficient_factor": {}}
    own = ComputeModel(type(system).model_validate(raw))
    t_own, fam_own, _ = own.seconds_and_source(big._replace(family="tf32_matmul"))
    assert fam_own == "tf32_matmul" and t_own == pytest.approx(big.flops / (400e12 * 0.5), rel=0.05)


def test_fp32_router_in_the_estimate() -> None:
    """The strategy field reaches the router: the weight gradient from the fp32 input copy,
    cast back and added to the main grad; the backward holds the fp32 input copy, the fp32
    input gradient and the fp32 weight gradient (t x h x 8 + E x h x 4 B) on top; the step
    is slower, the forward's transient holds fp32 logits."""
    plain, fp32 = _est(), _est(moe_router_dtype="fp32")
    r16, r32 = _router_op(plain), _router_op(fp32)
    t = 2 * 2048
    assert [k.name if isinstance(k, MemBound) else k.family for k in r32.bwd_weight] == [
        "router.wgrad_cast_fp32", "tf32_matmul", "router.wgrad_cast_back", "router.main_grad_add"]
    assert r32.bwd_weight[0].bytes == t * H * 6 and r32.bwd_weight[-1].bytes == E * H * (4 + 2 + 4)
    assert r32.bwd_transient - 2 * r16.bwd_transient == pytest.approx(t * H * 8 + E * H * 4)
    assert r32.fwd_transient == 2 * r16.fwd_transient
    assert fp32.cost().duration_time_per_iter > plain.cost().duration_time_per_iter
    with pytest.raises(ConfigError, match="moe_router_dtype"):
        _est(moe_router_dtype="fp64").cost()


def test_router_dtype_flag_round_trip() -> None:
    from simumax.export.megatron_flags import megatron_flags
    from simumax.importers.megatron_args import parse_megatron_args

    est = _est(moe_router_dtype="fp32")
    flags = megatron_flags(est.strategy, _moe())
    assert "--moe-router-dtype fp32" in flags
    _, st, notes = parse_megatron_args(flags + ["--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "8",
                                                "--num-experts", "64", "--moe-router-topk", "6", "--seq-length", "2048",
                                                "--vocab-size", "32000"])
    assert st.moe_router_dtype == "fp32" and not any("router-dtype" in n for n in notes)
    assert "--moe-router-dtype" not in megatron_flags(_est().strategy, _moe())


def test_tf32_over_bf16_against_the_h100_measurement() -> None:
    """Router-shaped gradient GEMMs timed on an H100 (benchmarks/router_gemm_dtype.py): the
    TF32 GEMM over the bf16 one of the same shape, measured vs the model's ratio on the
    measured H100 preset. Measured 1.5-2.8x; the model says 2 where compute-bound."""
    data = json.loads(MEASURED.read_text())
    cm = ComputeModel(load_system("nvidia_h100_80gb_hbm3"))
    errs = []
    for r in data["rows"]:
        t, h, e, s = r["tokens"], r["hidden"], r["experts"], r["seconds"]
        for kind, g in (("dgrad", Gemm(t, e, h, "NN")), ("wgrad", Gemm(e, t, h, "NT"))):
            g32 = g._replace(out_dtype="fp32", family="tf32_matmul")
            predicted = cm.compute(g32)[0] / cm.compute(g)[0]
            measured = s[f"{kind}_tf32"] / s[f"{kind}_bf16"]
            errs.append(math.log(predicted / measured))
            print(f"t={t} h={h} E={e} {kind}: TF32/bf16 measured {measured:.2f}, model {predicted:.2f}")
    med = statistics.median(abs(x) for x in errs)
    print(f"median |log error| {med:.3f}, max {max(map(abs, errs)):.3f}")
    assert med < 0.15 and max(map(abs, errs)) < 0.45
