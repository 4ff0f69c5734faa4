"""Formulas checked against published numbers and hand derivations."""

from __future__ import annotations

import pytest

from simumax import ModelConfig, StrategyConfig
from simumax.config.loader import load_model, load_strategy, load_system
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


@pytest.mark.parametrize("upd, per_param", [
    ({}, 4 + 4 + 4),
    ({"use_precision_aware_optimizer": True}, 2 + 4 + 4),  # the master's remainder bits only
    ({"use_precision_aware_optimizer": True, "store_param_remainders": False}, 4 + 4 + 4),
    ({"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, 2 + 2 + 2),
    ({"use_precision_aware_optimizer": True, "main_params_dtype": "fp16", "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "bf16"}, 2 + 1 + 2),
    # a current-scaling fp8 recipe with fp32 masters: Megatron keeps the masters (fp32), TE the moments
    ({"use_precision_aware_optimizer": True, "fp8": True, "fp8_recipe": "tensorwise", "exp_avg_dtype": "bf16"}, 4 + 2 + 4),
    ({"use_precision_aware_optimizer": True, "fp8": True, "fp8_recipe": "delayed"}, 2 + 4 + 4),
])
def test_precision_aware_optimizer_states(upd: dict, per_param: int) -> None:
    """Megatron's --use-precision-aware-optimizer (megatron-core optimizer_config.py,
    distrib_optimizer.py): TransformerEngine's FusedAdam holds the master in
    --main-params-dtype, or as the int16 remainder a bf16 parameter lacks of its fp32 master
    (store_param_remainders, the default), and the moments in --exp-avg(-sq)-dtype; the
    distributed optimizer shards them over DP."""
    from simumax.config.loader import load_strategy
    from simumax.memory.model_states import shard_params

    m = load_model("llama3.1-8b").with_updates({"layer_num": 4})
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 2048, **upd})
    est = Estimate(m, st, load_system("h100-sxm-80gb"))
    for stage, states in zip(est.stages, est.memory().stages):
        assert states.optimizer == per_param * shard_params(st, stage)


def test_precision_aware_optimizer_step_bytes() -> None:
    """The step's passes by hand (bytes; P the rank's parameters, S its optimizer shard):
    Megatron's own Adam with fp32 main grads — scale the DDP buffer 2·4P, finiteness check
    4P, norm 4S | clip 8S, Adam (4 + 2·12)S, master -> bf16 parameter 6S, zero the grads 4P.
    TE's FusedAdam on bf16 main grads with remainder masters — scale 2·2P, check 2P, norm 2S
    (the decoupled bf16 grads, no fp32 copy) | clip 4S, Adam (2 + 2·10 + 2·2)S (the bf16
    parameter read to rebuild the master and written in the kernel: no copy pass), zero 2P."""
    from simumax.config.loader import load_strategy
    from simumax.dp.optimizer_step import step_passes
    from simumax.memory.model_states import shard_params

    m = load_model("llama3.1-8b").with_updates({"layer_num": 4})
    sy = load_system("h100-sxm-80gb")
    for upd, before, after in (
        ({}, lambda P, S: 8 * P + 4 * P + 4 * S, lambda P, S: 8 * S + 28 * S + 6 * S + 4 * P),
        ({"use_precision_aware_optimizer": True, "grad_reduce_in_bf16": True},
         lambda P, S: 4 * P + 2 * P + 2 * S, lambda P, S: 4 * S + 26 * S + 2 * P),
    ):
        st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 2048, **upd})
        est = Estimate(m, st, sy)
        stage = est.stages[0]
        P, S = stage.params, shard_params(st, stage)
        got = step_passes(st, sy, stage, lambda k: k.bytes)
        assert got == pytest.approx((before(P, S), after(P, S)), rel=1e-12)


def test_precision_aware_optimizer_rules() -> None:
    from simumax.config.loader import load_strategy
    from simumax.errors import ConfigError

    base = load_strategy("tp1_pp2_dp4_mbs1")
    for upd, field in (({"exp_avg_dtype": "bf16"}, "exp_avg_dtype"), ({"main_params_dtype": "fp16"}, "main_params_dtype"),
                       ({"use_precision_aware_optimizer": True, "zero_state": 0}, "use_precision_aware_optimizer"),
                       ({"use_precision_aware_optimizer": True, "fsdp_impl": "deepspeed"}, "use_precision_aware_optimizer")):
        with pytest.raises(ConfigError) as exc:
            base.with_updates(upd)
        assert exc.value.field == field


@pytest.mark.parametrize(("system", "model", "upd", "workspaces"), [
    # one 32 MiB + 1 KiB workspace where torch reports compute capability >= 9, 4 MiB before
    ("h100-sxm-80gb", "llama3-8b", {}, 32 * 2**20 + 1024),
    ("b200-sxm-180gb", "llama3-8b", {}, 32 * 2**20 + 1024),
    ("a100_pcie", "llama3-8b", {}, 4 * 2**20),
    # userbuffers' GEMMs: one more of three times the size
    ("h100-sxm-80gb", "llama3-8b", {"tp_size": 2, "enable_sequence_parallel": True, "tp_comm_overlap": True},
     4 * (32 * 2**20 + 1024)),
    # grouped expert GEMMs: one per cuBLAS stream (4)
    ("h100-sxm-80gb", "qwen3-30b-a3b", {"ep_size": 8}, 5 * (32 * 2**20 + 1024)),
    ("a100_pcie", "qwen3-30b-a3b", {"ep_size": 8}, 5 * 4 * 2**20),
    # serial expert GEMMs run as plain ones; Megatron-Core's local modules keep no TE workspace
    ("h100-sxm-80gb", "qwen3-30b-a3b", {"ep_size": 8, "group_linear_mode": "serial"}, 32 * 2**20 + 1024),
    ("h100-sxm-80gb", "llama3-8b", {"transformer_impl": "local"}, 0),
])
def test_transformer_engine_cublas_workspaces(system: str, model: str, upd: dict, workspaces: int) -> None:
    """TransformerEngine's cuBLAS workspaces (pytorch/cpp_extensions/gemm.py,
    get_cublas_workspace) stay allocated from the first GEMM on: they are the TE buffers of a
    strategy without te_version (no dummy weight gradients) or fp8 weight copies, on every stage."""
    from simumax.config.loader import load_strategy

    m = load_model(model).with_updates({"layer_num": 2})
    st = load_strategy({"world_size": 8, "seq_len": 1024, "micro_batch_num": 2, **upd})
    mem = Estimate(m, st, load_system(system)).memory()
    for s in mem.stages:
        assert s.te_buffers == workspaces
        assert s.model_mem == s.weights + s.grads + s.optimizer + workspaces


def test_te_dummy_weight_gradients_only_with_gradient_accumulation_fusion() -> None:
    """TransformerEngine >= 2.3 returns a cached dummy weight gradient per distinct linear
    weight shape to autograd when the real one went into main_grad (fuse_wgrad_accumulation);
    without the fusion it returns the real gradient and keeps no dummy: the TE buffers differ
    by the bf16 bytes of the distinct shapes, by hand."""
    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    base = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"te_version": "2.3"})
    fused = Estimate(m, base, load_system("h100-sxm-80gb"))
    plain = Estimate(m, base.with_updates({"gradient_accumulation_fusion": False}), load_system("h100-sxm-80gb"))
    shapes = {s for ops, _ in fused.stages[0].groups() for o in ops if not o.expert_params for s in o.weight_shapes}
    assert fused.memory().stages[0].te_buffers - plain.memory().stages[0].te_buffers == sum(n * k for n, k in shapes) * 2
