"""A chunk's activation walk from a shorter chunk (memory/chunk_walk.py) equals the walk of
every op of the chunk: bytes kept, both peaks and the ops they happen at, over random
models and strategies with many layers per chunk (recompute of the first layers, MoE
after dense layers, offloading, ZeRO-2/3 collectives, CP, sliding windows)."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings

import simumax.memory.chunk_walk as chunk_walk
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.memory.activation_walk import walk
from simumax.memory.chunk_walk import op_name_at, params_after
from tests.test_invariants import pairs


def _same_walks(est: Estimate) -> None:
    for chunk in est.chunks:
        got = est.chunk_walks[chunk.vstage]
        full = walk(chunk.ops)
        assert (got.stored, got.fwd_peak, got.bwd_peak) == (full.stored, full.fwd_peak, full.bwd_peak), chunk.vstage
        assert (got.fwd_peak_at, got.bwd_peak_at) == (full.fwd_peak_at, full.bwd_peak_at), chunk.vstage
        assert (op_name_at(chunk, got.fwd_peak_at), op_name_at(chunk, got.bwd_peak_at)) == (full.fwd_peak_op, full.bwd_peak_op)
        ops = chunk.ops  # the weight gradients a backward has made on reaching each op: those of the ops after it
        for at in {0, got.fwd_peak_at, got.bwd_peak_at, len(ops) // 2, len(ops) - 1} - {-1}:
            assert params_after(chunk, at) == sum(o.params for o in ops[at + 1:]), at


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pairs())
def test_shortened_walk_equals_the_full_walk(case) -> None:
    model, st, sy = case
    assume(st.num_layers_in_first_pipeline_stage is None and st.num_layers_in_last_pipeline_stage is None)
    try:  # 5x the layers: 5 to 15 per chunk
        est = Estimate(model.model_copy(update={"layer_num": model.layer_num * 5}), st, sy)
        est.chunks
    except ConfigError:
        assume(False)
    _same_walks(est)


def test_a_long_chunk_is_walked_short(monkeypatch) -> None:
    """Llama3-8B's 32-layer chunk (and 16-layer ones with partial recompute: two runs) are
    walked with a few layers, and still give the full walk."""
    lengths = []
    real = chunk_walk.walk
    monkeypatch.setattr(chunk_walk, "walk", lambda ops: lengths.append(len(ops)) or real(ops))
    sy = load_system("a100_pcie")
    est = Estimate(load_model("llama3-8b"), load_strategy("tp2_pp1_dp4_mbs1"), sy)
    _same_walks(est)
    assert lengths and max(lengths) < 5 * 11 + 4  # at most 3 layers of 11 ops, plus embedding and head
    lengths.clear()
    partial = load_strategy("tp1_pp2_dp4_mbs1").with_updates(
        {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 6})
    est = Estimate(load_model("llama3-8b"), partial, sy)
    _same_walks(est)
    assert len(lengths) == 2 * 4 and max(lengths) < 32 * 11 // 2  # per chunk: base, one step per run, both runs
