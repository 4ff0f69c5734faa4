"""``apply_rope_fusion`` (Megatron's --no-rope-fusion turns it off): RoPE as one fused kernel,
or megatron-core's torch RoPE (``rope_utils._apply_rotary_pos_emb_bshd``)."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.estimate import Estimate
from simumax.graph.kernels import MemBound

S, B = 2048, 2  # sequence, micro-batch


def _est(model: ModelConfig, **strategy) -> Estimate:
    st = StrategyConfig.init_from_dict({"seq_len": S, "world_size": 1, "micro_batch_size": B, **strategy})
    return Estimate(model, st, load_system("h100-sxm-80gb"))


def _op(est: Estimate, name: str):
    return next(o for c in est.chunks for o in c.ops if o.name == name)


def _llama() -> ModelConfig:
    return ModelConfig(hidden_size=1024, head_num=16, kv_head_num=4, intermediate_size=2048, layer_num=2,
                       vocab_size=32000, use_swiglu=True)


def test_dense_rope_fused_and_unfused_by_hand() -> None:
    """q (16 heads) and k (4 heads) of 64 dims, bf16, 4096 tokens: fused, one read and one
    write of both each way; unfused, about four passes each way and the cos / sin tables
    ([s, 1, 1, 64] bf16, one pair per call) kept for backward."""
    qk = B * S * (16 + 4) * 64 * 2
    fused, torch_rope = (_op(_est(_llama(), apply_rope_fusion=f), "L0.rope") for f in (True, False))
    assert [k.bytes for k in fused.fwd] == [k.bytes for k in fused.bwd_input] == [2 * qk] and not fused.saved
    assert [k.bytes for k in torch_rope.fwd] == [k.bytes for k in torch_rope.bwd_input] == [8 * qk]
    assert [b for _, b in torch_rope.saved] == [S * 64 * 2] * 4
    assert _est(_llama(), apply_rope_fusion=False).cost().duration_time_per_iter > _est(_llama()).cost().duration_time_per_iter
    # the local spec runs the torch RoPE whatever the flag says
    assert _op(_est(_llama(), transformer_impl="local"), "L0.rope").saved


def test_mla_rope_fused_and_unfused_by_hand() -> None:
    """DeepSeek-V3's MLA, 1024 tokens, bf16, 128 heads, q/k dims 128 + 64 (rope), v 128.
    Fused (megatron-core's YaRN kernels): q's 64-dim parts rotated in place (read + write),
    one kernel reading kv (128 + 128 per head) and k_pe (64) and writing key (192 per head) and
    value (128 per head); backward the same bytes. Unfused: four passes over each positional
    part each way, the query and key concatenations and value's contiguous copy."""
    m = load_model("deepseek-v3").with_updates({"layer_num": 4})
    ops = [_op(_est(m, apply_rope_fusion=f, seq_len=1024, micro_batch_size=1), "L0.rope") for f in (True, False)]
    by = [{k.name.rsplit(".", 1)[1]: k.bytes for k in [*o.fwd, *o.bwd_input] if isinstance(k, MemBound)} for o in ops]
    t, heads, b = 1024, m.head_num, 2
    q_pe, k_pe = t * heads * 64 * b, t * 64 * b
    kv, key, value = t * heads * 256 * b, t * heads * 192 * b, t * heads * 128 * b
    assert by[0] == {"rope_q": 2 * q_pe, "rope_kv": kv + k_pe + key + value,
                     "rope_q_bwd": 2 * q_pe, "rope_kv_bwd": key + value + kv + k_pe}
    assert by[1]["rope_q"] == by[1]["rope_q_bwd"] == 8 * q_pe and by[1]["rope_k"] == 8 * k_pe
    assert by[1]["cat_query"] == 2 * key and by[1]["cat_key"] == 2 * key and by[1]["contiguous_value"] == 2 * value
    assert ops[0].bwd_transient == kv + k_pe < ops[1].bwd_transient


def test_no_rope_fusion_flag_round_trip() -> None:
    from simumax.export.megatron_flags import megatron_flags
    from simumax.importers.megatron_args import parse_megatron_args

    st = _est(_llama(), apply_rope_fusion=False).strategy
    flags = megatron_flags(st, _llama())
    assert "--no-rope-fusion" in flags
    _, back, notes = parse_megatron_args(flags + ["--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "16",
                                                  "--vocab-size", "32000", "--position-embedding-type", "rope"])
    assert back.apply_rope_fusion is False and not any("rope-fusion" in n for n in notes)
    assert "--no-rope-fusion" not in megatron_flags(_est(_llama()).strategy, _llama())


def test_nope_layers_have_no_rope() -> None:
    """no_rope_freq (Megatron --no-rope-freq; Llama 4's NoPE layers): N makes layer i NoPE when
    (i + 1) % N == 0, a list names them; those layers build no RoPE op (q and k stay views of
    the QKV output) and cost less; the flag round-trips; a bad value is a ConfigError."""
    from simumax.errors import ConfigError
    from simumax.export.megatron_flags import model_flags
    from simumax.importers.megatron_args import parse_megatron_args

    m = _llama().with_updates({"layer_num": 4, "no_rope_freq": 2})
    assert [m.uses_rope(i) for i in range(4)] == [True, False, True, False]
    assert m.with_updates({"no_rope_freq": [0, 0, 1, 0]}).uses_rope(2) is False
    est = _est(m)
    assert sorted(o.layer for c in est.chunks for o in c.ops if o.module == "rope") == [0, 2]
    assert est.cost().duration_time_per_iter < _est(_llama().with_updates({"layer_num": 4})).cost().duration_time_per_iter
    back, _, _ = parse_megatron_args(model_flags(m) + ["--seq-length", "2048"], world_size=1)
    assert back.no_rope_freq == 2
    for bad in (3, [0, 1], 0):
        with pytest.raises(ConfigError, match="no_rope_freq"):
            _llama().with_updates({"layer_num": 4, "no_rope_freq": bad})
