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
    # at the tables' rate: under the power curve a chunk's mix sets every kernel's clock
    # (cost/power.py), so shortening layer 0 would speed up layer 1 too
    from tests.test_power import _without_curve

    table_rate = _without_curve(SYSTEM)
    windowed = Estimate(m, st, table_rate)
    full = Estimate(m.with_updates({"window_size": None}), st, table_rate)
    attn = lambda e, layer: sum(ph["fwd"].total for o, ph in e.chunk_times[0].op_times if o.name == f"L{layer}.attn")  # noqa: E731
    assert attn(windowed, 0) < attn(full, 0) / 5 and attn(windowed, 1) == attn(full, 1) > 0
    # every layer costs its own window: the windowed model saves the difference on layers 0 and 2 only
    lt = lambda e, layer: e.layer_profiles.layer_time(layer, False).fwd.total  # noqa: E731
    assert lt(windowed, 1) == lt(full, 1) and lt(windowed, 0) < lt(full, 0)
    saved = 2 * (lt(full, 0) - lt(windowed, 0))
    assert windowed.chunk_times[0].fwd.total == pytest.approx(full.chunk_times[0].fwd.total - saved, rel=1e-12)
    assert windowed.cost().duration_time_per_iter < full.cost().duration_time_per_iter
    # TE runs a window with context parallelism under a2a and all_gather only, and attention
    # sinks (softmax_type learnable) under a2a only (attn_forward_func_with_cp)
    with pytest.raises(ConfigError, match="sliding-window attention .* only with a2a or all_gather, not p2p"):
        Estimate(m.with_updates({"attention_sinks": False}), st.with_updates({"cp_size": 2, "cp_comm_type": "p2p"}), SYSTEM).stages
    with pytest.raises(ConfigError, match="attention sinks .* only with a2a, not all_gather"):
        Estimate(m, st.with_updates({"cp_size": 2, "cp_comm_type": "all_gather"}), SYSTEM).stages
    # a window no shorter than the sequence is full attention: the ring runs (Mistral-7B v0.1's 4096 at 4096)
    plain = m.with_updates({"attention_sinks": False})
    wide = plain.with_updates({"window_size": 8192})
    ring = st.with_updates({"cp_size": 2, "cp_comm_type": "p2p"})
    assert Estimate(wide, ring, SYSTEM).cost().duration_time_per_iter == pytest.approx(
        Estimate(plain.with_updates({"window_size": None}), ring, SYSTEM).cost().duration_time_per_iter)


def _attention_kernels(e: Estimate, layer: int, phase: str = "fwd") -> list[Attention]:
    op = next(o for o in e.stages[0].ops if o.name == f"L{layer}.attn")
    return [k for k in op.kernels(phase) if isinstance(k, Attention)]


def test_window_with_context_parallelism_by_hand() -> None:
    """a2a: each rank runs the whole sequence with heads / cp, the window as without CP.
    all_gather: TE slices each local query chunk's keys to its window
    (get_kv_seq_info_after_all_gather): the rank holding the middle chunks runs two chunks of
    s / (2 cp) queries over s / (2 cp) + w - 1 keys, every query seeing w keys."""
    m = load_model("gpt-oss-20b").with_updates({"layer_num": 2, "attention_sinks": False})
    st = load_strategy({"seq_len": 32768, "world_size": 8, "ep_size": 8})
    w, heads, d = 128, m.head_num, m.head_size
    one = _attention_kernels(Estimate(m, st, SYSTEM), 0)
    assert [(k.seq_len, k.window) for k in one] == [(32768, w)]
    a2a = _attention_kernels(Estimate(m, st.with_updates({"cp_size": 4, "cp_comm_type": "a2a"}), SYSTEM), 0)
    assert [(k.seq_len, k.head_num, k.window) for k in a2a] == [(32768, heads // 4, w)]
    assert sum(k.flops for k in a2a) == pytest.approx(one[0].flops / 4)
    ag = _attention_kernels(Estimate(m, st.with_updates({"cp_size": 4, "cp_comm_type": "all_gather"}), SYSTEM), 0)
    c = 32768 // 8
    assert [(k.seq_len, k.kv_seq_len, k.window, k.causal) for k in ag] == [(c, c + w - 1, w, True)] * 2
    per_pair = 2 * heads * 2 * d  # forward FLOPs of one (query, key) pair over the heads
    assert sum(k.flops for k in ag) == pytest.approx(2 * c * w * per_pair)
    # the middle rank's share of the whole windowed attention: 1/cp but the first w queries' shortfall
    whole = (w * (w + 1) / 2 + (32768 - w) * w) * per_pair
    assert one[0].flops == pytest.approx(whole)
    assert sum(k.flops for k in ag) == pytest.approx(whole / 4 + w * (w - 1) / 2 / 4 * per_pair)
    # the full-attention layer keeps the load-balanced causal block
    full = _attention_kernels(Estimate(m, st.with_updates({"cp_size": 4, "cp_comm_type": "all_gather"}), SYSTEM), 1)
    assert [(k.seq_len, k.kv_seq_len, k.causal) for k in full] == [(2 * c, 4 * c, False)]


@pytest.mark.parametrize("preset, total, active", [("gpt-oss-120b", 116.83, 5.13), ("gpt-oss-20b", 20.91, 3.61)])
def test_gpt_oss_presets_match_the_published_counts(preset: str, total: float, active: float) -> None:
    """OpenAI's model card: 116.83 B / 20.91 B parameters, 5.13 B / 3.61 B active per token
    (the active count leaves out the input embedding, a lookup)."""
    m = load_model(preset)
    p = Estimate(m, load_strategy({"seq_len": 4096, "world_size": 8, "ep_size": 8}), SYSTEM).params
    assert round(p.total / 1e9, 2) == total
    assert round((p.active - m.vocab_size * m.hidden_size) / 1e9, 2) == active


def test_qk_layernorm_by_hand() -> None:
    """Megatron's --qk-layernorm (Qwen3): 2 x head_size parameters per layer (every TP rank
    holds them), a pass reading q and k and writing them normalised, and one fp32 rstd per
    token and head kept for backward."""
    from simumax.export.megatron_flags import model_flags
    from simumax.graph.kernels import MemBound

    m = load_model("qwen3-8b").with_updates({"layer_num": 2})
    st = load_strategy({"seq_len": 4096, "world_size": 8, "tp_size": 2, "enable_sequence_parallel": True})
    on, off = Estimate(m, st, SYSTEM), Estimate(m.with_updates({"qk_layernorm": False}), st, SYSTEM)
    assert on.params.total - off.params.total == 2 * 2 * 128
    op = next(o for o in on.stages[0].ops if o.name == "L0.qk_norm")
    qk = 4096 * (32 // 2 + 8 // 2) * 128 * 2  # tokens x (q + k heads per rank) x head_dim x bf16
    assert [k.bytes for k in op.fwd if isinstance(k, MemBound)] == [2 * qk]
    assert dict(op.saved)["L0.qk_norm.rstd"] == 4096 * (16 + 4) * 4
    assert on.cost().duration_time_per_iter > off.cost().duration_time_per_iter
    assert "--qk-layernorm" in model_flags(m)


def test_attention_output_gate_by_hand() -> None:
    """Megatron's --attention-output-gate: the QKV GEMM makes heads x head_size more columns
    (h x q_w more parameters), and ``Attention._apply_output_gate`` multiplies the attention
    output by the sigmoid of the gate in torch: the gate's contiguous copy (2 x the output's
    bf16 bytes), its fp32 cast (3), the sigmoid (4), the fp32 product (5) and its cast back
    (3); it keeps the output and the fp32 sigmoid (2 x)."""
    from simumax.export.megatron_flags import model_flags
    from simumax.graph.kernels import Gemm, MemBound

    m = load_model("llama3-8b").with_updates({"layer_num": 2, "attention_output_gate": True})
    st = load_strategy({"seq_len": 4096, "world_size": 8})
    on, off = Estimate(m, st, SYSTEM), Estimate(m.with_updates({"attention_output_gate": False}), st, SYSTEM)
    assert on.params.total - off.params.total == 2 * 4096 * 4096
    ops = {o.name: o for o in on.stages[0].ops}
    assert next(k for k in ops["L0.qkv"].fwd if isinstance(k, Gemm)).n == 4096 + 2 * 1024 + 4096
    out = 4096 * 4096 * 2  # tokens x q width x bf16
    assert [k.bytes for k in ops["L0.attn_gate"].fwd if isinstance(k, MemBound)] == [2 * out, 3 * out, 4 * out, 5 * out, 3 * out]
    assert [b for _, b in ops["L0.attn_gate"].saved] == [out, 2 * out]
    assert ops["L0.attn_proj"].input[0][0] == "L0.attn.gated"
    assert on.cost().duration_time_per_iter > off.cost().duration_time_per_iter
    assert "--attention-output-gate" in model_flags(m)


def test_qkv_bias_by_hand() -> None:
    """Megatron's --add-qkv-bias (Qwen2 / Qwen2.5): (heads + 2 kv_heads) x head_size bias
    parameters per layer, sharded over TP with the QKV columns. TransformerEngine adds them in
    the GEMM epilogue and folds their gradient into the weight-gradient GEMM (no kernel);
    Megatron's local linear adds them after the GEMM (read and write the QKV output) and
    reduces the output gradient over tokens for their gradient."""
    from simumax.graph.kernels import MemBound

    m = load_model("qwen2.5-7b").with_updates({"layer_num": 2})
    st = load_strategy({"seq_len": 4096, "world_size": 8, "tp_size": 2, "enable_sequence_parallel": True})
    on, off = Estimate(m, st, SYSTEM), Estimate(m.with_updates({"add_qkv_bias": False}), st, SYSTEM)
    width = (28 + 2 * 4) * 128
    assert on.params.total - off.params.total == 2 * width
    te = {o.name: o for o in on.stages[0].ops}["L0.qkv"]
    assert te.params - {o.name: o for o in off.stages[0].ops}["L0.qkv"].params == width // 2  # this rank's half
    assert not [k for ph in ("fwd", "bwd_input", "bwd_weight") for k in te.kernels(ph) if isinstance(k, MemBound) and "bias" in k.name]
    local = st.with_updates({"transformer_impl": "local", "use_flash_sdp": False, "use_math_sdp": True})
    qkv = {o.name: o for o in Estimate(m, local, SYSTEM).stages[0].ops}["L0.qkv"]
    out = 4096 * width // 2 * 2  # gathered tokens x this rank's QKV columns x bf16
    assert [k.bytes for k in qkv.fwd if isinstance(k, MemBound)] == [2 * out]
    assert [k.bytes for k in qkv.bwd_weight if isinstance(k, MemBound)] == [out]
    # biases on every linear include the QKV's: add_qkv_bias changes nothing then
    gpt = load_model("gpt3-175b").with_updates({"layer_num": 2, "add_bias_linear": True})
    assert Estimate(gpt.with_updates({"add_qkv_bias": True}), st.with_updates({"tp_size": 8, "world_size": 8}), SYSTEM).params.total == \
        Estimate(gpt, st.with_updates({"tp_size": 8, "world_size": 8}), SYSTEM).params.total
