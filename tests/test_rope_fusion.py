"""``apply_rope_fusion`` (Megatron's --no-rope-fusion turns it off): RoPE as one fused kernel,
or megatron-core's torch RoPE (``rope_utils._apply_rotary_pos_emb_bshd``)."""

from __future__ import annotations

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


def test_mla_rope_parts_fused_and_unfused() -> None:
    """MLA's positional parts (heads x 64 of q, one 64-dim k_pe): four times the passes
    unfused, the concatenations unchanged."""
    m = load_model("deepseek-v3").with_updates({"layer_num": 4})
    ops = [_op(_est(m, apply_rope_fusion=f, seq_len=1024, micro_batch_size=1), "L0.rope") for f in (True, False)]
    by = [{k.name.rsplit(".", 1)[1]: k.bytes for k in [*o.fwd, *o.bwd_input] if isinstance(k, MemBound)} for o in ops]
    q_pe = 1024 * m.head_num * m.qk_pos_emb_head_dim * 2
    assert by[0]["rope_q"] == 2 * q_pe and by[1]["rope_q"] == 8 * q_pe
    assert by[1]["rope_q_bwd"] == 4 * by[0]["rope_q_bwd"] and by[1]["rope_k"] == 4 * by[0]["rope_k"]
    assert by[0]["cat_query"] == by[1]["cat_query"]


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
