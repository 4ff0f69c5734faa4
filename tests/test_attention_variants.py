"""Sliding-window attention and attention sinks (issue 22 part 3): windowed flash-attention
FLOPs by hand, the local / global layer pattern, GPT-OSS presets against the published
parameter counts."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention

SYSTEM = load_system("h100-sxm-80gb")


def test_window_flops_by_hand() -> None:
    """Causal attention over s = 4096 with a window of w = 128 keys: query i sees
    min(i + 1, w) keys, w(w + 1)/2 + (s - w) w pairs; each pair costs 2 (d_qk + d_v) FLOPs
    per head forward."""
    s, w, heads, d = 4096, 128, 8, 64
    pairs = w * (w + 1) / 2 + (s - w) * w
    win = Attention("fwd", 1, s, heads, heads, d, d, window=w)
    assert win.flops == pytest.approx(2 * heads * pairs * 2 * d)
    full = Attention("fwd", 1, s, heads, heads, d, d)
    assert full.flops == pytest.approx(2 * heads * s * (s + 1) / 2 * 2 * d)
    assert Attention("bwd", 1, s, heads, heads, d, d, window=w).flops == pytest.approx(2 * win.flops)
    # a window wider than the sequence is full causal attention
    assert Attention("fwd", 1, 64, heads, heads, d, d, window=128).flops == pytest.approx(Attention("fwd", 1, 64, heads, heads, d, d).flops)


def test_local_global_pattern_and_its_cost() -> None:
    m = load_model("gpt-oss-20b").with_updates({"layer_num": 4})
    assert [m.attention_window(i) for i in range(4)] == [128, None, 128, None]  # GPT-OSS alternates, sliding first
    st = load_strategy({"seq_len": 8192, "world_size": 8, "ep_size": 8})
    windowed = Estimate(m, st, SYSTEM)
    full = Estimate(m.with_updates({"window_size": None}), st, SYSTEM)
    attn = lambda e, layer: sum(ph["fwd"].total for o, ph in e.chunk_times[0].op_times if o.name == f"L{layer}.attn")  # noqa: E731
    assert attn(windowed, 0) < attn(full, 0) / 5 and attn(windowed, 1) == attn(full, 1)
    assert windowed.cost().duration_time_per_iter < full.cost().duration_time_per_iter
    with pytest.raises(ConfigError, match="context parallelism"):
        Estimate(m, st.with_updates({"cp_size": 2}), SYSTEM).stages


@pytest.mark.parametrize("preset, total, active", [("gpt-oss-120b", 116.83, 5.13), ("gpt-oss-20b", 20.91, 3.61)])
def test_gpt_oss_presets_match_the_published_counts(preset: str, total: float, active: float) -> None:
    """OpenAI's model card: 116.83 B / 20.91 B parameters, 5.13 B / 3.61 B active per token
    (the active count leaves out the input embedding, a lookup)."""
    m = load_model(preset)
    p = Estimate(m, load_strategy({"seq_len": 4096, "world_size": 8, "ep_size": 8}), SYSTEM).params
    assert round(p.total / 1e9, 2) == total
    assert round((p.active - m.vocab_size * m.hidden_size) / 1e9, 2) == active
