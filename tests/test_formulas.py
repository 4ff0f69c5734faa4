"""Formulas checked against published numbers and hand derivations."""

from __future__ import annotations

import pytest

from simumax import ModelConfig, StrategyConfig
from simumax.config.loader import load_model, load_system
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention
from simumax.memory.activation_walk import walk


def _estimate(model: ModelConfig, **strategy) -> Estimate:
    st = StrategyConfig.init_from_dict({"seq_len": 4096, "world_size": 1, **strategy})
    return Estimate(model, st, load_system("a100_pcie"))


@pytest.mark.parametrize("name, expected", [("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496)])
def test_llama3_parameter_count_exact(name: str, expected: int) -> None:
    m = load_model(name).with_updates({"vocab_size": 128256, "padded_vocab_size": False})
    assert sum(s.params for s in _estimate(m).stages) == expected


def test_parameters_split_over_stages_and_tp() -> None:
    m = load_model("llama3-8b")
    whole = sum(s.params for s in _estimate(m).stages)
    split = _estimate(m, world_size=8, tp_size=2, pp_size=4)
    norms = m.hidden_size * (2 * m.layer_num + 1)  # replicated on every TP rank
    assert sum(s.params for s in split.stages) * 2 - norms == whole + (m.padded_vocab(2) - m.padded_vocab(1)) * m.hidden_size * 2


def test_model_flops_are_6nd_plus_causal_attention() -> None:
    """Per iteration: 6 x (GEMM weights) x tokens + 3 x causal attention forward."""
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    est = _estimate(m, micro_batch_num=2)
    s, h, L = 4096, m.hidden_size, m.layer_num
    vocab = m.padded_vocab(1)
    gemm_weights = sum(s_.params for s_ in est.stages) - vocab * h - h * (2 * L + 1)  # minus embedding, norms
    tokens = 2 * s
    attn_fwd = 2 * m.head_num * s * s * 2 * m.head_size * (s + 1) / (2 * s)
    expected = 6 * gemm_weights * tokens + 3 * L * attn_fwd * 2
    assert est.model_flops_per_iter() == pytest.approx(expected, rel=1e-12)


def test_attention_flops_conventions() -> None:
    a = Attention("fwd", batch=1, seq_len=4096, head_num=32, kv_head_num=8, qk_head_dim=128, v_head_dim=128)
    assert a.table_flops() == 4 * 4096**2 * 32 * 128  # SimuMax: no causal halving
    assert a.flops == pytest.approx(a.table_flops() * 4097 / 8192)
    b = Attention("bwd", batch=1, seq_len=4096, head_num=32, kv_head_num=8, qk_head_dim=128, v_head_dim=128)
    assert b.flops == pytest.approx(2 * a.flops)


def _gpt(h: int = 1024, a: int = 16) -> ModelConfig:
    """The paper's GPT layer: LayerNorm, GeLU 4h MLP, MHA, learned positions, biases."""
    return ModelConfig(
        hidden_size=h, head_num=a, intermediate_size=4 * h, layer_num=2, vocab_size=51200,
        norm_type="layernorm", position_embedding_type="learned_absolute", add_bias_linear=True,
    )


def _layer_bytes(est: Estimate) -> float:
    ops = [o for o in est.stages[0].ops if o.layer == 0]
    return walk(ops).stored


KORTHIKANTI = dict(use_math_sdp=True, use_flash_sdp=False, enable_dropout=True)


def test_korthikanti_activation_memory_no_recompute() -> None:
    """Korthikanti et al. 2022, eq. (1): sbh(34 + 5as/h) bytes per layer (+ LN mean/rstd)."""
    s, b, h, a = 2048, 2, 1024, 16
    est = _estimate(_gpt(h, a), seq_len=s, micro_batch_size=b, **KORTHIKANTI)
    ln_stats = 2 * (s * b * 8)  # two LayerNorms keep fp32 mean and rstd per token
    assert _layer_bytes(est) == s * b * h * (34 + 5 * a * s / h) + ln_stats


@pytest.mark.parametrize("t", [2, 4, 8])
def test_korthikanti_sp_selective_is_34_over_t(t: int) -> None:
    """Korthikanti et al. 2022, table 2: sequence parallel + selective recompute: 34 sbh / t."""
    s, b, h, a = 2048, 1, 1024, 16
    est = _estimate(
        _gpt(h, a), seq_len=s, micro_batch_size=b, world_size=t, tp_size=t, enable_sequence_parallel=True,
        enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True, **KORTHIKANTI,
    )
    ln_stats = 2 * (s * b * 8) / t
    assert _layer_bytes(est) == pytest.approx(s * b * h * 34 / t + ln_stats)


def test_full_block_recompute_keeps_only_layer_input() -> None:
    s, h = 4096, 4096
    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    est = _estimate(m, enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=1)
    first = [o for o in est.stages[0].ops if o.layer == 0]
    second = [o for o in est.stages[0].ops if o.layer == 1]
    assert walk(first).stored == s * h * 2
    assert walk(second).stored > 20 * s * h


def _uniform_chunks(n: int | None, method: str = "uniform", **upd) -> Estimate:
    """Llama3-8B with 12 layers on PP2 x VP2: chunks of 3 layers (the middle ones hold
    neither the embedding nor the head)."""
    from simumax.config.loader import load_strategy

    m = load_model("llama3-8b").with_updates({"layer_num": 12})
    full = {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": n, "recompute_method": method}
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(
        {"world_size": 2, "interleaving_size": 2, "micro_batch_num": 4, **(full if n != 0 else {}), **upd})
    return Estimate(m, st, load_system("a100_pcie"))


def test_uniform_recompute_checkpoints_groups_of_layers() -> None:
    """Megatron's --recompute-method uniform (megatron/core/recompute.py: one checkpoint over
    layers [i, i + n) of the chunk, i = 0, n, 2n ...): every layer recomputes; a micro-batch
    keeps each group's input only (a 3-layer chunk with n = 2: groups [0, 1] and [2], two
    inputs); backward re-runs a whole group, so the backward peak grows with n, and one group
    over the chunk re-materialises all of it (no recompute's backward peak). n = 1 is block
    recompute of every layer; the compute is the same for every n."""
    from simumax.graph.dims import Dims

    none, every = _uniform_chunks(0), _uniform_chunks(None, "block")
    runs = {n: _uniform_chunks(n) for n in (1, 2, 3)}
    d = Dims.of(every.model, every.strategy)
    middle = every.chunks[1].vstage
    assert len(every.chunks[1].layers) == 3 and every.chunks[1].ops[0].layer >= 0  # no embedding in it
    layer_input = d.act(d.h, local=True)
    for n, est in runs.items():
        assert est.chunk_walks[middle].stored == -(-3 // n) * layer_input
        assert est.cost().duration_time_per_iter == pytest.approx(every.cost().duration_time_per_iter, rel=1e-12)
    assert runs[1].chunk_walks[middle] == every.chunk_walks[middle]
    peaks = [runs[n].chunk_walks[middle].bwd_peak for n in (1, 2, 3)]
    assert peaks[0] < peaks[1] < peaks[2] == none.chunk_walks[middle].bwd_peak
    assert every.cost().duration_time_per_iter > none.cost().duration_time_per_iter


def test_uniform_recompute_rules() -> None:
    """uniform groups whole layers (Megatron: --recompute-granularity full) of at least one layer."""
    from simumax.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        _uniform_chunks(1, recompute_granularity="selective_recompute", attn_recompute=True)
    assert exc.value.field == "recompute_method"
    with pytest.raises(ConfigError) as exc:
        _uniform_chunks(None, recompute_layer_num=0)
    assert exc.value.field == "recompute_layer_num"


def test_in_flight_micro_batches_1f1b() -> None:
    from simumax.schedule.one_f_one_b import order

    def in_flight(pp: int, rank: int, mbc: int) -> int:
        """Most micro-batches between their forward and backward on the rank."""
        held = peak = 0
        for t in order(pp, mbc)[rank]:
            held += 1 if t.kind == "F" else -1
            peak = max(peak, held)
        return peak

    assert [in_flight(4, r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert [in_flight(4, r, 2) for r in range(4)] == [2, 2, 2, 1]


def test_full_recompute_keeps_only_layer_inputs_on_moe_layers() -> None:
    """A fully recomputed MoE chunk keeps one layer input per layer between forward and
    backward; tensors produced and consumed inside a checkpoint (router, dispatch,
    permute buffers nobody saves) are not held."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate
    from simumax.graph.dims import Dims

    m = load_model("deepseek-v2-lite").with_updates({"layer_num": 8})
    st = load_strategy("ep4_pp2_dp4_mbs1").with_updates(
        {"pp_size": 4, "world_size": 16, "enable_recompute": True, "recompute_granularity": "full_block"}
    )
    est = Estimate(m, st, load_system("a100_pcie"))
    d = Dims.of(m, st)
    middle = est.chunks[1]  # no embedding, no head
    assert est.chunk_walks[middle.vstage].stored == len(middle.layers) * d.act(d.h, local=True)


def test_simumax_6nd_flops_leave_out_the_input_embedding() -> None:
    """SimuMax's mfu_6nd_with_attn: 6 x (parameters but the input embedding) + 6 L s a (dqk + dv)
    per token: 51.5 GFLOP per token for Llama3-8B at 4096 (54.6 with the embedding)."""
    m = load_model("llama3-8b").with_updates({"vocab_size": 128256, "padded_vocab_size": False})
    est = _estimate(m)
    per_token = est.flops_6nd_with_attn() / (4096 * est.strategy.global_batch_size)
    params = 8_030_261_248 - 128256 * 4096
    assert per_token == pytest.approx(6 * params + 6 * 32 * 4096 * 32 * 256)
    assert round(per_token / 1e9, 1) == 51.5
