"""Megatron-Core DDP's gradient buckets (dp/buckets.py): reverse parameter order, a bucket
closing at ``bucket_size``, no bucketing where ``DistributedDataParallel`` turns it off, and
when each bucket's reduce and gather run on the event engine. Hand derivations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.dp.buckets import MEGATRON_MIN_BUCKET, ParamOrder, bucket_size, fill
from simumax.estimate import Estimate
from simumax.graph.kernels import Collective
from simumax.simulate.iteration import bucket_readiness, lm_head_wgrad, simulate_iteration


def test_fill_takes_head_and_embedding_whole_and_layers_as_a_continuum() -> None:
    # LM head 524, layers 3700, embedding 524, buckets of 40 (Nemotron-8B TP2 in millions)
    got = fill(ParamOrder(524, 3700, 524), 40)
    assert got[0] == (524, 524, 1)  # the head alone: one parameter over a bucket closes it
    assert got[1:-1] == [(524 + 40 * (i + 1), 40, 1) for i in range(92)]  # 3700 = 92·40 + 20
    assert got[-1] == (4748, 20 + 524, 1)  # the layers' remainder rides with the embedding
    assert sum(e * k for _, e, k in got) == 4748
    # a small head joins the first layers' bucket; a small embedding the last one
    assert fill(ParamOrder(10, 100, 5), 40) == [(40, 40, 1), (80, 40, 1), (115, 35, 1)]
    assert fill(ParamOrder(3, 10, 5), None) == [(18, 18, 1)]  # no bucketing: one bucket
    assert fill(ParamOrder(0, 0, 0), 40) == []


@settings(max_examples=200, deadline=None)
@given(head=hs.integers(0, 10**6), layers=hs.integers(0, 10**7), embedding=hs.integers(0, 10**6),
       size=hs.one_of(hs.none(), hs.integers(1, 10**6)))
def test_fill_invariants(head: int, layers: int, embedding: int, size: int | None) -> None:
    """Every element in exactly one bucket, buckets in fill order, each closed bucket at
    least ``size`` (Megatron closes a bucket once it holds that many), one bucket without
    bucketing."""
    order = ParamOrder(head, layers, embedding)
    got = fill(order, size)
    assert sum(e * k for _, e, k in got) == order.total
    positions = [p for p, _, _ in got]
    assert positions == sorted(set(positions)) and (not got or positions[-1] == order.total)
    if size is None:
        assert len(got) == (1 if order.total else 0)
    else:
        assert all(e >= size for _, e, _ in got[:-1])
        assert len(got) <= 1024 + 3


def test_fill_merges_full_buckets_past_the_modelled_count_and_keeps_totals() -> None:
    got = fill(ParamOrder(0, 10**6, 0), 1)
    assert len(got) <= 1026 and sum(e * k for _, e, k in got) == 10**6
    assert [p for p, _, _ in got] == sorted({p for p, _, _ in got}) and got[-1][0] == 10**6


def test_readiness_head_first_layers_pro_rata_embedding_last() -> None:
    o = ParamOrder(100, 800, 100)
    got = o.ready_all([100, 500, 900, 901, 1000], 0.1, 0.85)
    assert got[0] == 0.1  # after the head's backward
    assert got[1] == pytest.approx(0.1 + 0.85 * 0.5)
    assert got[2] == pytest.approx(0.95)  # the first layer's, before the embedding's backward
    assert got[3:] == [1.0, 1.0]  # any embedding gradient: the end of the pass
    assert ParamOrder(0, 0, 50).ready_all([50], 0.0, 1.0) == [1.0]
    assert ParamOrder(50, 0, 0).ready_all([50], 0.2, 0.0) == [0.2]


def _est(**kw) -> Estimate:
    base = {"world_size": 8, "pp_size": 1, "micro_batch_num": 4, "zero_state": 1}
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    return Estimate(m, load_strategy("tp1_pp2_dp4_mbs1").with_updates({**base, **kw}), load_system("a100_pcie"))


def test_bucketing_is_off_where_megatron_turns_it_off() -> None:
    on = _est(overlap_grad_reduce=True)
    dp = on.network.groups["dp"].size
    assert bucket_size(on.strategy, on.network, "dp", 0, 0) == max(MEGATRON_MIN_BUCKET, 1_000_000 * dp)
    assert bucket_size(on.strategy, on.network, "dp", 1, 0) is None  # pipeline rank > 0
    assert bucket_size(on.strategy, on.network, "dp", 0, 1) is None  # model chunk > 0
    off = _est()
    assert bucket_size(off.strategy, off.network, "dp", 0, 0) is None  # no overlap_grad_reduce
    assert len(off.grad_buckets(off.chunks[0])) == 1
    assert off.grad_buckets(off.chunks[0])[0].position == off.chunks[0].params
    ds = _est(fsdp_impl="deepspeed", ds_reduce_bucket_size=10**8)  # DeepSpeed ZeRO-1: its own reduce buckets
    assert bucket_size(ds.strategy, ds.network, "dp", 1, 0) == 10**8


def test_overlapped_reduce_leaves_the_embedding_bucket_exposed_and_its_gather_first() -> None:
    est = _est(overlap_grad_reduce=True, overlap_param_gather=True)
    chunk = est.chunks[0]
    dense, _ = est.param_orders(chunk)
    pre, _, post = chunk.sections()
    assert dense.embedding == sum(o.params for o in pre) > 0 and dense.head == sum(o.params for o in post) > 0
    size = bucket_size(est.strategy, est.network, "dp", 0, 0)
    assert dense.head >= size  # the LM head fills a bucket alone; the layers start the next
    last = dense.layers % size + dense.embedding
    filled, forward = bucket_readiness(est, 0, 0.0)
    buckets = [b for _, b in filled]
    assert forward == buckets[::-1]  # gathered in forward order: the embedding's first
    assert buckets[-1].position == dense.total  # ready last
    rs = est.network.time(Collective("reduce_scatter", last * est.strategy.main_grad_bytes, "dp"))
    ag = est.network.time(Collective("all_gather", last * est.strategy.dtype_bytes, "dp"))
    assert buckets[-1].reduce == pytest.approx(rs) and buckets[-1].gather == pytest.approx(ag)
    run = simulate_iteration(est)
    evs = run.events[0]
    first_fwd = min(e.start for e in evs if e.stream == "compute")
    assert first_fwd == pytest.approx(ag)  # the embedding's bucket is gathered first, waited on
    reduces = [e for e in evs if e.kind == "grad_sync"]
    assert reduces[-1].start >= run.end_of_backward[0] - 1e-12  # its gradient is the pass's last
    assert reduces[-1].end - reduces[-1].start == pytest.approx(rs)
    # the LM head's bucket reduces first, after the head's backward, inside the pass
    assert reduces[0].start < run.end_of_backward[0]


def test_deferred_head_gradients_hold_their_bucket_to_the_end() -> None:
    est = _est(overlap_grad_reduce=True, defer_embedding_wgrad_compute=True)
    fr, forward = bucket_readiness(est, 0, lm_head_wgrad(est))
    head = est.param_orders(est.chunks[0])[0].head
    assert fr[-1][0] == -1.0 and fr[-1][1].position == head  # reduced last
    assert forward[-1].position == head  # but still gathered last: the forward needs it last


def test_param_gather_with_optimizer_step() -> None:
    """Megatron --overlap-param-gather-with-optimizer-step (megatron-core ChainedOptimizer:
    the first model chunk steps first and starts its parameter all-gathers while the other
    chunks step): a rank's first forward, gated by its first bucket's gather, starts earlier
    by the other chunks' share of the step after the gradient norm; refused without
    interleaving, overlap_param_gather or the distributed optimizer."""
    import pytest

    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.errors import ConfigError
    from simumax.estimate import Estimate

    m = load_model("llama3-70b").with_updates({"layer_num": 8})
    sy = load_system("h100-sxm-80gb")
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(
        {"seq_len": 4096, "world_size": 64, "tp_size": 8, "pp_size": 2, "interleaving_size": 2, "micro_batch_num": 4,
         "enable_sequence_parallel": True, "overlap_grad_reduce": True, "overlap_param_gather": True})
    off, on = Estimate(m, st, sy), Estimate(m, st.with_updates({"overlap_param_gather_with_optimizer_step": True}), sy)
    first = lambda e: next(x.start for x in e.iteration.events[0] if x.stream == "compute")  # noqa: E731
    chunks = [c for c in on.chunks if c.index == 0]
    later = sum(c.params for c in chunks[1:]) / sum(c.params for c in chunks)
    shift = on.optimizer_passes[0][1] * later
    assert 0 < shift < first(off)
    assert first(on) == pytest.approx(first(off) - shift, rel=1e-9)
    assert on.cost().duration_time_per_iter <= off.cost().duration_time_per_iter
    for upd in ({"interleaving_size": 1, "micro_batch_num": 4}, {"overlap_param_gather": False}, {"zero_state": 0}):
        with pytest.raises(ConfigError) as exc:
            st.with_updates({"overlap_param_gather_with_optimizer_step": True, **upd})
        assert exc.value.field == "overlap_param_gather_with_optimizer_step"
