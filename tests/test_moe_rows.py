"""The busiest EP rank under random routing (graph/moe_rows.py): a dropless MoE layer runs
at the rank that received the most rows, which lies above the mean even when routing favours
no expert (Megatron's --moe-router-force-load-balancing routes so)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph.dims import Dims
from simumax.graph.moe_rows import MoeDims
from simumax.graph.moe_rows import busiest_rank_factor, expected_max_normal


def test_expected_max_of_normals_closed_forms() -> None:
    """n = 2: 1/√π; n = 3: 3/(2√π); n = 4, 5: the tabulated 1.029375, 1.162965."""
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-7)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-7)
    assert expected_max_normal(4) == pytest.approx(1.029375, abs=1e-6)
    assert expected_max_normal(5) == pytest.approx(1.162965, abs=1e-6)


def test_busiest_rank_by_hand() -> None:
    """Mixtral-like: 8 experts, top-2, one expert per rank at EP8, 2048 tokens into the group.
    Per token a rank gets a hypergeometric count: mean 2/8, variance 2 (1/8)(7/8)(6/7) =
    0.1875; over the tokens mean 512, sd √384 = 19.6, and the busiest of 8 ranks lies 1.4236 sd
    above: 1 + 19.6 x 1.4236 / 512 = 1.0545. EP 1 or every expert on the rank: 1."""
    sd = math.sqrt(2048 * 0.1875)
    assert busiest_rank_factor(2048, 8, 1, 2, 8) == pytest.approx(1 + sd * expected_max_normal(8) / 512, rel=1e-12)
    assert busiest_rank_factor(2048, 8, 1, 2, 8) == pytest.approx(1.0545, abs=1e-4)
    assert busiest_rank_factor(2048, 8, 8, 2, 1) == 1.0
    # group-limited: a rank inside one group is reached only when its group is chosen (q = 1/2
    # here), then by a hypergeometric draw of 8 from the 128 experts of the chosen groups
    q, m = 0.5, 8 * 4 / 128
    v = 8 * (4 / 128) * (124 / 128) * 120 / 127
    per_token_var = q * (v + m * m) - (q * m) ** 2
    mean = 512 * q * m
    want = 1 + math.sqrt(512 * per_token_var) * expected_max_normal(64) / mean
    assert busiest_rank_factor(512, 256, 4, 8, 64, 8, 4) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("tokens,experts,local,topk,ep", [(2048, 8, 1, 2, 8), (1024, 64, 8, 6, 8), (512, 256, 4, 8, 64)])
def test_busiest_rank_against_sampling(tokens, experts, local, topk, ep) -> None:
    """Uniform random top-k (top-k of normal logits, as the forced-balancing router draws
    them), 300 layers: the mean of the busiest rank's rows over the mean rows is within 2 %
    of the normal approximation (which runs slightly low: the counts are skewed)."""
    rng = np.random.default_rng(0)
    busiest = []
    for _ in range(300):
        picks = np.argpartition(rng.standard_normal((tokens, experts)), -topk, axis=1)[:, -topk:]
        rows = np.bincount(picks.ravel() // local, minlength=ep)
        busiest.append(rows.max())
    sampled = float(np.mean(busiest)) / (tokens * topk * local / experts)
    got = busiest_rank_factor(tokens, experts, local, topk, ep)
    print(f"sampled {sampled:.4f} normal approximation {got:.4f}")
    assert got == pytest.approx(sampled, rel=0.02) and got > 1


@settings(max_examples=60, deadline=None)
@given(tokens=hs.integers(16, 10**6), log_ep=hs.integers(0, 7), log_local=hs.integers(0, 5), topk=hs.integers(1, 8))
def test_busiest_rank_is_above_the_mean_and_shrinks_with_tokens(tokens, log_ep, log_local, topk) -> None:
    ep, local = 2**log_ep, 2**log_local
    experts = ep * local
    if topk > experts:
        return
    f = busiest_rank_factor(tokens, experts, local, topk, ep)
    assert f >= 1.0
    assert busiest_rank_factor(4 * tokens, experts, local, topk, ep) <= f
    if ep == 1:
        assert f == 1.0


def test_dropless_rows_on_the_busiest_rank() -> None:
    """The grouped GEMM's rows per local expert: dropless, the balanced mean times random
    routing's spread and moe_load_imbalance; padded to capacity, exactly the capacity from
    every source; one EP rank, the mean."""
    base = {"model_type": "moe", "hidden_size": 1024, "head_num": 8, "intermediate_size": 2048, "layer_num": 2,
            "vocab_size": 32000, "expert_num": 64, "topk": 6, "moe_pad_expert_input_to_capacity": False, "capacity": None}
    st = StrategyConfig.init_from_dict({"seq_len": 2048, "world_size": 8, "micro_batch_size": 1, "ep_size": 8})
    for skew in (1.0, 1.3):
        model = ModelConfig.init_from_dict({**base, "moe_load_imbalance": skew})
        d = Dims.of(model, st)
        md = MoeDims.of(model, st, d)
        mean = 2048 * 6 / 64  # per source rank and expert
        f = busiest_rank_factor(2048 * 8, 64, 8, 6, 8)
        assert md.rows_per_expert == math.ceil(mean * f * skew * 8)
        assert md.rows_sent == 2048 * 6  # what a rank sends is its own tokens' copies
    padded = ModelConfig.init_from_dict({**base, "moe_pad_expert_input_to_capacity": True, "capacity": 1.0})
    assert MoeDims.of(padded, st, Dims.of(padded, st)).rows_per_expert == math.ceil(2048 * 6 / 64) * 8
    one = st.with_updates({"ep_size": 1, "world_size": 1})
    model = ModelConfig.init_from_dict(base)
    assert MoeDims.of(model, one, Dims.of(model, one)).rows_per_expert == math.ceil(2048 * 6 / 64)


def test_dropless_dispatchers_wait_on_the_host() -> None:
    """Megatron's all-to-all dispatcher without padding to capacity copies the token counts
    to the host and waits before the all-to-all (token_dispatcher.py
    ``_maybe_dtoh_and_synchronize``), once per MoE layer forward and again in its recompute,
    after gathering every rank's counts; padded to capacity it does not; the all-gather
    dispatcher's ``.cpu()`` waits either way. With nothing beside the forward (PP 1) each wait
    adds ``host_sync_us`` to the iteration: 2 layers x 4 micro-batches x 130 us, twice that
    with full recompute."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate
    from simumax.graph.kernels import HOST_SYNC, Collective

    sy = load_system("a100-sxm-80gb")  # no power curve: an idle GPU's faster clock apart
    dropless = load_model("mixtral-8x7b").with_updates({"layer_num": 2, "moe_pad_expert_input_to_capacity": False})
    padded = dropless.with_updates({"moe_pad_expert_input_to_capacity": True, "capacity": 1})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": 4096, "micro_batch_num": 4, "check_for_nan_in_grad": False})

    def extra(model, strategy) -> float:
        t = [Estimate(model, strategy, sy.with_updates({"host_sync_us": us})).cost(band=False).duration_time_per_iter
             for us in (130.0, 0.0)]
        return t[0] - t[1]

    assert extra(dropless, st) == pytest.approx(2 * 4 * 130e-6, rel=1e-6)
    assert extra(dropless, st.with_updates({"enable_recompute": True, "recompute_granularity": "full_block",
                                            "recompute_layer_num": 2})) == pytest.approx(2 * 2 * 4 * 130e-6, rel=1e-6)
    assert extra(padded, st) == pytest.approx(0.0, abs=1e-12)
    assert extra(padded, st.with_updates({"moe_dispatcher_policy": "all_gather"})) == pytest.approx(2 * 4 * 130e-6, rel=1e-6)
    dispatch = next(o for o in Estimate(dropless, st, sy).stages[0].ops if o.module == "dispatch")
    kinds = [(k.family if not isinstance(k, Collective) else k.op) for k in dispatch.fwd]
    assert kinds.index("all_gather") < kinds.index(HOST_SYNC) < kinds.index("all2all")  # counts, wait, send
