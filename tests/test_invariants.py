"""Invariants over random legal dense (model, strategy) pairs."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from simumax import ModelConfig, StrategyConfig
from simumax.config.loader import load_system
from simumax.estimate import Estimate

SYSTEMS = {"a100_pcie": load_system("a100_pcie"), "b200_bf16_ceperm": load_system("b200_bf16_ceperm")}


@hs.composite
def cases(draw):
    heads = draw(hs.sampled_from([8, 16, 32]))
    kv = draw(hs.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    head_dim = draw(hs.sampled_from([64, 128]))
    tp = draw(hs.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    pp = draw(hs.sampled_from([1, 2, 4]))
    layers = pp * draw(hs.integers(1, 4))
    dp = draw(hs.sampled_from([1, 2, 4]))
    model = ModelConfig(
        hidden_size=heads * head_dim, head_num=heads, kv_head_num=kv, intermediate_size=tp * 64 * draw(hs.integers(4, 40)),
        layer_num=layers, vocab_size=draw(hs.integers(1000, 70000)), use_swiglu=draw(hs.booleans()),
        norm_type=draw(hs.sampled_from(["rmsnorm", "layernorm"])),
    )
    st = StrategyConfig(
        seq_len=512 * draw(hs.integers(1, 8)), micro_batch_size=draw(hs.integers(1, 2)),
        micro_batch_num=draw(hs.integers(1, 16)), world_size=tp * pp * dp, tp_size=tp, pp_size=pp,
        enable_sequence_parallel=draw(hs.booleans()), zero_state=draw(hs.sampled_from([0, 1])),
        cross_entropy_loss_fusion=draw(hs.booleans()), te_version=draw(hs.sampled_from([None, "2.1", "2.11.0"])),
    )
    return model, st, SYSTEMS[draw(hs.sampled_from(sorted(SYSTEMS)))]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(cases())
def test_results_finite_and_positive(case) -> None:
    model, st, sy = case
    est = Estimate(model, st, sy)
    cost, mem = est.cost(), est.memory()
    assert math.isfinite(cost.duration_time_per_iter) and cost.duration_time_per_iter > 0
    assert 0 < cost.mfu < 1
    assert all(v >= 0 and math.isfinite(v) for v in cost.breakdown.values())
    for s in mem.stages:
        assert s.peak_mem > s.model_mem > 0
        assert s.fwd_activation_cache_per_micro_batch > 0
        assert math.isfinite(s.peak_mem_with_reserved)


@SETTINGS
@given(cases())
def test_zero1_optimizer_shards_over_dp(case) -> None:
    model, st, sy = case
    z1 = Estimate(model, st.with_updates({"zero_state": 1}), sy).memory()
    z0 = Estimate(model, st.with_updates({"zero_state": 0}), sy).memory()
    for a, b in zip(z1.stages, z0.stages):
        assert a.optimizer * st.dp_size == b.optimizer
        assert a.weights == b.weights and a.grads == b.grads


@SETTINGS
@given(cases())
def test_full_recompute_trades_time_for_memory(case) -> None:
    model, st, sy = case
    base = Estimate(model, st, sy)
    rec = Estimate(model, st.with_updates({"enable_recompute": True, "recompute_granularity": "full_block"}), sy)
    assert rec.memory().peak_mem <= base.memory().peak_mem
    assert rec.cost().duration_time_per_iter >= base.cost().duration_time_per_iter


@SETTINGS
@given(cases(), hs.integers(1, 8))
def test_more_micro_batches_never_raise_bubble_fraction(case, extra) -> None:
    model, st, sy = case

    def fraction(m: int) -> float:
        c = Estimate(model, st.with_updates({"micro_batch_num": m}), sy).cost()
        return c.breakdown["bubble"] / c.duration_time_per_iter

    assert fraction(st.micro_batch_num + extra) <= fraction(st.micro_batch_num) + 1e-12


def test_uniform_1f1b_bubble_fraction() -> None:
    from simumax.schedule.one_f_one_b import pipeline_time

    for p, m in [(2, 4), (4, 8), (8, 3)]:
        t = pipeline_time([(1.0, 2.0)] * p, m)
        assert t.bubble / t.total == (p - 1) / (m + p - 1)
