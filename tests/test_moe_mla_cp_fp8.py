"""MoE, MLA, context parallelism and FP8: published counts, hand-derived volumes, invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax import StrategyConfig
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention, Collective, GroupGemm
from simumax.graph.moe_rows import busiest_rank_factor


def _est(model, **strategy) -> Estimate:
    st = StrategyConfig.init_from_dict({"seq_len": 4096, "world_size": 1, **strategy})
    return Estimate(model, st, load_system("b200_bf16_ceperm"))


def _kernels(est: Estimate, phase: str = "fwd"):
    return [k for s in est.stages for o in s.ops for k in o.kernels(phase)]


# ---- parameter counts (published figures) ---------------------------------------------
@pytest.mark.parametrize(
    "name, total_b, active_b, digits",
    [("deepseek-v3", 671, 37, 0), ("mixtral-8x7b", 46.7, 12.9, 1), ("mixtral-8x22b", 141, 39, 0), ("qwen3-235b-a22b", 235, 22, 0)],
)
def test_moe_parameter_counts_match_published(name: str, total_b: float, active_b: float, digits: int) -> None:
    m = load_model(name).with_updates({"padded_vocab_size": False})
    p = _est(m).params
    assert round(p.total / 1e9, digits) == total_b
    # "37B activated" is quoted rounded down; accept the published figure's rounding either way
    assert math.floor(p.active / 1e9 * 10**digits) / 10**digits == active_b or round(p.active / 1e9, digits) == active_b


def test_parameter_count_is_independent_of_sharding() -> None:
    m = load_model("deepseek-v3").with_updates({"layer_num": 8, "dense_layers": 3})
    one = _est(m).params
    split = _est(m, world_size=64, tp_size=2, pp_size=4, ep_size=8, etp_size=2, enable_sequence_parallel=True).params
    tp_pad = (m.padded_vocab(2) - m.padded_vocab(1)) * m.hidden_size * 2  # vocab padding differs with tp
    assert split.total - tp_pad == one.total
    assert split.expert == one.expert


# ---- MoE sizes and volumes by hand ----------------------------------------------------
def test_dispatch_all_to_all_volume_padded_to_capacity() -> None:
    """DeepSeek-V3, EP8, capacity factor 1 padded: each expert gets ceil(4096*8/256) = 128
    rows from each source, so every rank sends 256 * 128 rows of 7168 bf16."""
    m = load_model("deepseek-v3").with_updates({"layer_num": 2, "dense_layers": 1, "capacity": 1, "moe_pad_expert_input_to_capacity": True})
    est = _est(m, world_size=8, ep_size=8)
    a2a = [k for k in _kernels(est) if isinstance(k, Collective) and k.op == "all2all"]
    assert len(a2a) == 2  # dispatch and combine of the one MoE layer
    assert {k.bytes for k in a2a} == {256 * 128 * 7168 * 2}
    gg = [k for k in _kernels(est) if isinstance(k, GroupGemm)]
    assert {(k.ng, k.M) for k in gg} == {(32, 8 * 128)}


def test_dispatch_volume_dropless_with_imbalance() -> None:
    """Mixtral, EP4, dropless: a rank sends tokens * topk rows; the busiest receives that
    times random routing's spread over the 4 ranks (graph/moe_rows.py) and the
    imbalance, and its experts compute imbalance x the rows without it."""
    m = load_model("mixtral-8x7b").with_updates({"layer_num": 1, "moe_pad_expert_input_to_capacity": False, "capacity": None})
    base = _est(m, world_size=4, ep_size=4)
    hot = _est(m.with_updates({"moe_load_imbalance": 1.5}), world_size=4, ep_size=4)
    rows, h = 4096 * 2, 4096
    spread = busiest_rank_factor(4096 * 4, 8, 2, 2, 4)
    assert 1.005 < spread < 1.02  # 16,384 tokens over 4 ranks: about 1 %
    assert [k.bytes for k in _kernels(base) if isinstance(k, Collective) and k.op == "all2all"] == [math.ceil(rows * spread) * h * 2] * 2
    assert [k.bytes for k in _kernels(hot) if isinstance(k, Collective) and k.op == "all2all"] == [math.ceil(1.5 * rows * spread) * h * 2] * 2
    f = lambda e: sum(k.flops for k in _kernels(e) if isinstance(k, GroupGemm))  # noqa: E731
    assert f(hot) == pytest.approx(1.5 * f(base), rel=1e-3)


@settings(max_examples=20, deadline=None)
@given(ep=hs.sampled_from([1, 2, 4, 8, 16, 32]))
def test_ep_per_rank_expert_flops_are_total_over_ep_at_the_busiest_rank(ep: int) -> None:
    """Qwen3-30B-A3B (dropless): the busiest of ep ranks computes the total expert FLOPs over
    ep, times random routing's spread over the ranks (1 at ep 1)."""
    m = load_model("qwen3-30b-a3b").with_updates({"layer_num": 1})
    per_rank_routed = sum(k.flops for k in _kernels(_est(m, world_size=ep)) if isinstance(k, GroupGemm))
    total = per_rank_routed * ep  # every one of the ep ranks routes its own tokens
    split = sum(k.flops for k in _kernels(_est(m, world_size=ep, ep_size=ep)) if isinstance(k, GroupGemm))
    spread = busiest_rank_factor(4096 * ep, 128, 128 // ep, 8, ep)
    assert split == pytest.approx(total / ep * spread, rel=5e-3)  # rows rounded up per expert


def test_dense_layers_land_on_the_stages_that_hold_them() -> None:
    m = load_model("deepseek-v3").with_updates({"layer_num": 8, "dense_layers": 3})
    est = _est(m, world_size=4, pp_size=4)
    kinds = [{("moe" if any(o.module == "router" for o in s.ops if o.layer == layer) else "dense") for layer in s.layers} for s in est.stages]
    assert kinds == [{"dense"}, {"dense", "moe"}, {"moe"}, {"moe"}]


def test_expert_optimizer_states_shard_over_expert_data_parallel() -> None:
    m = load_model("mixtral-8x7b").with_updates({"layer_num": 2})
    est = _est(m, world_size=16, ep_size=4, pp_size=1)
    s = est.stages[0]
    mem = est.memory().stages[0]
    dense, expert = s.params - s.expert_params, s.expert_params
    assert mem.optimizer == pytest.approx(12 * (dense / 16 + expert / 4))


# ---- MLA with tensor parallelism --------------------------------------------------------
def test_mla_runs_with_tp_and_splits_attention_by_heads() -> None:
    m = load_model("deepseek-v2-lite").with_updates({"layer_num": 2})
    one = _est(m)
    two = _est(m, world_size=2, tp_size=2, enable_sequence_parallel=True)
    attn = lambda e: sum(k.flops for k in _kernels(e) if isinstance(k, Attention))  # noqa: E731
    assert attn(two) * 2 == pytest.approx(attn(one))
    assert two.cost().duration_time_per_iter > 0 and two.memory().peak_mem < one.memory().peak_mem


def test_mla_down_projections_by_implementation() -> None:
    """TransformerEngine's down-projections are duplicated (every TP rank holds the whole
    weight and runs it on its own tokens); the local spec's ColumnParallelLinear splits the
    weight over TP, gathers the input under SP and the output over TP (megatron-core
    multi_latent_attention.MLASelfAttention). tests/test_megatron_reference.py checks both
    against Megatron-Core itself."""
    m = load_model("deepseek-v3").with_updates({"layer_num": 1, "dense_layers": 1})
    h, q, kv = m.hidden_size, m.q_lora_rank, m.kv_lora_rank + m.qk_pos_emb_head_dim
    common = dict(world_size=2, tp_size=2, enable_sequence_parallel=True, seq_len=1024)

    def down(impl: str):
        est = _est(m, transformer_impl=impl, **common)
        return {o.name.rsplit(".", 1)[1]: o for s in est.stages for o in s.ops if o.name.endswith(("q_down", "kv_down"))}

    te, local = down("transformer_engine"), down("local")
    tokens = 1024  # a micro-batch of one sequence; SP shards it over the two ranks
    for name, n in (("q_down", q), ("kv_down", kv)):
        assert te[name].params == h * n and local[name].params == h * n // 2
        assert not [k for k in te[name].fwd if isinstance(k, Collective)]
        gathers = [k for k in local[name].fwd if isinstance(k, Collective)]
        # the hidden state's all-gather (SP), then the output's all-gather over TP
        assert [(g.op, g.group) for g in gathers] == [("all_gather", "tp")] * 2
        assert gathers[1].bytes == tokens * n * 2
    with pytest.raises(ConfigError, match="kv_lora_rank"):
        _est(m.with_updates({"kv_lora_rank": 511}), transformer_impl="local", **common)


# ---- context parallelism ----------------------------------------------------------------
@pytest.mark.parametrize("cp_type", ["a2a", "all_gather", "p2p"])
def test_context_parallel_attention_work_is_split(cp_type: str) -> None:
    m = load_model("llama3-8b").with_updates({"layer_num": 1})
    kw = {"seq_len": 32768}
    one = _est(m, **kw)
    four = _est(m, world_size=4, cp_size=4, cp_comm_type=cp_type, **kw)
    attn = lambda e: sum(k.flops for k in _kernels(e) if isinstance(k, Attention))  # noqa: E731
    # causal work per CP rank is 1/cp of the whole, whatever the blocks it is cut into
    assert attn(four) == pytest.approx(attn(one) / 4, rel=0.01)
    assert any(isinstance(k, Collective) and k.group == "cp" for k in _kernels(four))
    assert four.memory().stages[0].fwd_activation_cache_per_micro_batch < one.memory().stages[0].fwd_activation_cache_per_micro_batch / 3


def test_context_parallel_checks() -> None:
    m = load_model("llama3-8b")
    with pytest.raises(ConfigError, match="seq_len"):
        _est(m, world_size=4, cp_size=4, seq_len=4100)
    with pytest.raises(ConfigError, match="cp"):
        _est(m, world_size=64, cp_size=64, seq_len=65536, cp_comm_type="a2a")


# ---- FP8 ----------------------------------------------------------------------------------
def test_fp8_uses_fp8_tables_and_quantizes() -> None:
    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    bf16, fp8 = _est(m), _est(m, fp8=True)
    fams = {k.family for k in _kernels(fp8) if hasattr(k, "family") and "matmul" in str(k.family)}
    assert "fp8_matmul" in fams and "matmul" in fams  # LM head stays bf16
    assert any("quantize" in getattr(k, "name", "") for k in _kernels(fp8))
    assert fp8.memory().stages[0].fwd_activation_cache_per_micro_batch < bf16.memory().stages[0].fwd_activation_cache_per_micro_batch
    assert fp8.memory().stages[0].te_buffers > bf16.memory().stages[0].te_buffers  # fp8 weight copies


def test_fp8_parameters_by_hand() -> None:
    """Megatron --fp8-param-gather (TE fp8_model_init): an fp8 linear's weight is its
    row-wise fp8 data (1 B) and TE keeps only the other layout beside it (1 B): 2 B per
    parameter where a bf16 weight and its two fp8 copies held 4. The step writes the fp8
    parameters from the fp32 master (4 + 1 B, and a 4 B amax read under current scaling)
    and makes the other layout from the gathered data (read 1, write 1) instead of casting
    bf16 weights (read 2, write 2); the distributed optimizer gathers them in fp8 (the
    chunk's dense parameters at their mean stored bytes)."""
    from simumax.config.loader import load_strategy
    from simumax.dp.optimizer_step import step_passes
    from simumax.memory.model_states import fp8_weight_params, shard_params

    m = load_model("llama3.1-8b").with_updates({"layer_num": 4})
    sy = load_system("h100-sxm-80gb")
    for recipe, amax in (("delayed", 0), ("tensorwise", 4)):
        st0 = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 2048, "fp8": True, "fp8_recipe": recipe})
        plain, fp8p = Estimate(m, st0, sy), Estimate(m, st0.with_updates({"fp8_param_gather": True}), sy)
        for s0, s1, stage in zip(plain.memory().stages, fp8p.memory().stages, fp8p.stages):
            F = fp8_weight_params(stage)
            assert s0.weights - s1.weights == F and s0.te_buffers - s1.te_buffers == F
            P, S = stage.params, shard_params(fp8p.strategy, stage)
            after0 = step_passes(plain.strategy, sy, stage, lambda k: k.bytes)[1]
            after1 = step_passes(fp8p.strategy, sy, stage, lambda k: k.bytes)[1]
            cast = F * ((2 if amax else 1) * 2 + 2)  # bf16 weights read (twice: amax pass), both layouts written
            assert after0 - after1 == pytest.approx(S * F / P * (2 - 1 - amax) + cast - 2 * F, rel=1e-12)
        for chunk in fp8p.chunks:  # one bucket per chunk here (no overlap_grad_reduce)
            (b0,), (b1,) = plain.grad_buckets(chunk), fp8p.grad_buckets(chunk)
            mean_bytes = (2 * chunk.params - fp8_weight_params(chunk)) / chunk.params
            assert b1.gather / b0.gather == pytest.approx(mean_bytes / 2, rel=0.02)  # (less the latency term)
            assert b1.reduce == b0.reduce
    with pytest.raises(ConfigError) as exc:
        load_strategy("tp1_pp2_dp4_mbs1").with_updates({"fp8_param_gather": True})
    assert exc.value.field == "fp8_param_gather"


def test_shared_expert_overlap_by_hand() -> None:
    """--moe-shared-expert-overlap: in each pass of a MoE layer the shared experts' time
    (FC1, activation, FC2 with their TP collectives) hides under the layer's EP all-to-all,
    min(shared, all-to-all) of it, the rest exposed; their weight gradients stay exposed.
    Refused without shared experts, with the all-gather dispatcher, or beside the 1F1B
    all-to-all overlap."""
    from simumax.config.loader import load_strategy
    from simumax.profiles import SHARED_EXPERT_MODULES

    m = load_model("deepseek-v2-lite").with_updates({"layer_num": 4})
    sy = load_system("h100-sxm-80gb")
    st = load_strategy("ep4_pp2_dp4_mbs1").with_updates({"seq_len": 4096, "pp_size": 1, "world_size": 8, "ep_size": 8})
    off, on = Estimate(m, st, sy), Estimate(m, st.with_updates({"moe_shared_expert_overlap": True}), sy)
    layer = m.layer_num - 1  # a MoE layer
    t0, t1 = off.layer_profiles.layer_time(layer, False), on.layer_profiles.layer_time(layer, False)
    ops = on.layer_profiles.source.layer(layer, False)
    shared = [on.layer_profiles.op_time(o) for o in ops if o.module in SHARED_EXPERT_MODULES]
    assert len(shared) == 3
    for name in ("fwd", "bwd_input"):
        side = sum(ph[name].total for ph in shared)
        a2a = getattr(t0, name).comm["ep"]
        hidden = min(side, a2a)
        assert 0 < hidden
        assert getattr(t1, name).total == pytest.approx(getattr(t0, name).total - hidden, rel=1e-12)
        assert getattr(t1, name).comm["ep"] == pytest.approx(a2a - hidden, rel=1e-12, abs=1e-15)
    assert t1.bwd_weight.total == t0.bwd_weight.total
    assert on.cost().duration_time_per_iter < off.cost().duration_time_per_iter
    for upd in ({"moe_dispatcher_policy": "all_gather"}, {"overlap_moe_expert_parallel_comm": True}):
        with pytest.raises(ConfigError) as exc:
            Estimate(m, st.with_updates({"moe_shared_expert_overlap": True, **upd}), sy).cost()
        assert exc.value.field == "moe_shared_expert_overlap"
    with pytest.raises(ConfigError):
        Estimate(load_model("mixtral-8x7b").with_updates({"layer_num": 2}), st.with_updates({"moe_shared_expert_overlap": True}), sy).cost()


def test_expert_all_to_all_overlap_refuses_what_megatron_asserts() -> None:
    """megatron-core TransformerConfig with overlap_moe_expert_parallel_comm asserts: no
    'moe' recompute module, at most one MTP layer (each a ConfigError naming its field; its
    bf16 / fp16 rule holds everywhere here: fp32 training is refused); one MTP layer and other
    recompute modules are fine."""
    sy = load_system("h100-sxm-80gb")
    m = load_model("deepseek-v3-mtp").with_updates({"layer_num": 4})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"overlap_moe_expert_parallel_comm": True})
    assert Estimate(m, st, sy).cost().duration_time_per_iter > 0
    assert Estimate(m, st.with_updates({"megatron_recompute": True, "megatron_recompute_modules": ["moe_act"]}), sy).cost()
    for model, upd, field in (
        (m, {"megatron_recompute": True, "megatron_recompute_modules": ["moe_act", "moe"]}, "megatron_recompute_modules"),
        (m.with_updates({"mtp_num_layers": 2}), {}, "overlap_moe_expert_parallel_comm"),
    ):
        with pytest.raises(ConfigError) as exc:
            Estimate(model, st.with_updates(upd), sy).cost()
        assert exc.value.field == field and "Megatron" in exc.value.rule


def test_hierarchical_context_parallelism_by_hand() -> None:
    """cp_comm_type a2a+p2p with hierarchical_context_parallel_sizes [a, p] (Megatron
    --hierarchical-context-parallel-sizes; TE's AttnFuncWithCPAndKVP2P given the all-to-all
    group): q, k, v and the output cross the all-to-all group (a consecutive CP ranks, one
    node here), the ring runs over the p groups on a x the local sequence with 1/a of the
    heads — p - 1 forward and 2 (p - 1) backward sends of K and V. [1, cp] is the ring."""
    from simumax.config.loader import load_strategy

    m = load_model("llama3.1-8b").with_updates({"layer_num": 2})
    sy = load_system("h100-sxm-80gb")
    base = load_strategy("tp1_pp1_dp8_mbs1").with_updates(
        {"seq_len": 65536, "world_size": 16, "tp_size": 2, "enable_sequence_parallel": True, "cp_size": 8})
    a, p = 4, 2
    est = Estimate(m, base.with_updates({"cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [a, p]}), sy)
    groups = est.network.groups
    assert (groups["cp_a2a"].size, groups["cp_a2a"].stride, groups["cp_a2a"].intra_node) == (a, 2, True)
    assert (groups["cp_p2p"].size, groups["cp_p2p"].stride, groups["cp_p2p"].intra_node) == (p, 2 * a, False)
    attn = next(o for o in est.stages[0].ops if o.module == "core_attn")
    s = 65536 // 8  # tokens per CP rank
    heads, kv_heads, hd = 32 // 2, 8 // 2, 128
    q_b, kv_b = s * heads * hd * 2, 2 * s * kv_heads * hd * 2
    coll = lambda ks, g: [k.bytes for k in ks if isinstance(k, Collective) and k.group == g]  # noqa: E731
    assert coll(attn.fwd, "cp_a2a") == [q_b, kv_b / 2, kv_b / 2, q_b]
    assert coll(attn.bwd_input, "cp_a2a") == [q_b, q_b, q_b, kv_b / 2, kv_b / 2]
    assert coll(attn.fwd, "cp_p2p") == [kv_b] * (p - 1) and coll(attn.bwd_input, "cp_p2p") == [kv_b] * 2 * (p - 1)
    kernels = [k for k in attn.fwd if isinstance(k, Attention)]
    assert [(k.seq_len, k.kv_seq_len or k.seq_len, k.head_num, k.kv_head_num, k.causal) for k in kernels] == \
        [(s * a, s * a, heads // a, kv_heads // a, True)] + [(s * a, s * a // 2, heads // a, kv_heads // a, False)] * (p - 1)
    ring = Estimate(m, base.with_updates({"cp_comm_type": "p2p"}), sy)
    flat = Estimate(m, base.with_updates({"cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [1, 8]}), sy)
    assert flat.cost().duration_time_per_iter == ring.cost().duration_time_per_iter
    assert flat.memory().peak_mem == ring.memory().peak_mem
    assert "cp_a2a_comm" not in est.cost().breakdown and est.cost().breakdown["cp_comm"] > 0
    for upd, field in (({"cp_comm_type": "a2a+p2p", "hierarchical_context_parallel_sizes": [4, 4]}, "hierarchical_context_parallel_sizes"),
                       ({"cp_comm_type": "p2p", "hierarchical_context_parallel_sizes": [4, 2]}, "hierarchical_context_parallel_sizes")):
        with pytest.raises(ConfigError) as exc:
            base.with_updates(upd)
        assert exc.value.field == field
    with pytest.raises(ConfigError) as exc:  # 32 heads / tp 2 = 16 per rank: not over an all-to-all of 32
        Estimate(m, base.with_updates({"world_size": 64, "cp_size": 32, "cp_comm_type": "a2a+p2p",
                                       "hierarchical_context_parallel_sizes": [32, 1]}), sy).cost()
    assert exc.value.field == "hierarchical_context_parallel_sizes"


def _hits_by_enumeration(units: int, experts: int, topk: int, groups: int = 0, group_topk: int = 0) -> float:
    """Mean distinct units over every equally likely routing (all group choices, then all
    expert choices inside them)."""
    import itertools
    from fractions import Fraction

    per_unit, total, count = experts // units, Fraction(0), 0
    group_sets = itertools.combinations(range(groups), group_topk) if groups else [None]
    for gs in group_sets:
        pool = [e for g in gs for e in range(g * experts // groups, (g + 1) * experts // groups)] if gs else range(experts)
        for chosen in itertools.combinations(pool, topk):
            total += len({e // per_unit for e in chosen})
            count += 1
    return float(total / count)


@pytest.mark.parametrize("units, experts, topk, groups, group_topk", [
    (4, 16, 3, 0, 0), (8, 16, 4, 0, 0), (4, 16, 3, 4, 2), (2, 16, 3, 4, 2), (8, 16, 3, 4, 2), (4, 24, 4, 6, 3),
])
def test_flex_dispatch_fanout_exact(units: int, experts: int, topk: int, groups: int, group_topk: int) -> None:
    """The expected ranks / nodes a token reaches, against every routing enumerated (groups
    nested in units, units nested in groups, no group limit)."""
    from simumax.cost.moe_fanout import expected_units_hit

    assert expected_units_hit(units, experts, topk, groups, group_topk) == pytest.approx(
        _hits_by_enumeration(units, experts, topk, groups, group_topk), rel=1e-12)


def test_flex_dispatcher_sends_once_per_destination() -> None:
    """moe_dispatcher_policy flex (DeepEP's normal kernels): per token one copy through the
    NICs per remote node reached, one over NVLink per destination rank — DeepSeek-V3 on EP64
    (8 nodes, node-limited routing to 4 of 8 groups) reaches 3.63 nodes and 7.36 ranks of its
    8 experts; the all-to-all sends 7 of its 8 copies across nodes. Inside one node only the
    rank dedup remains. Refused with padding to capacity, as Megatron."""
    from simumax.config.loader import load_strategy
    from simumax.cost.moe_fanout import expected_units_hit
    from simumax.graph.kernels import Collective

    m = load_model("deepseek-v3").with_updates({"layer_num": 3, "dense_layers": 1})
    sy = load_system("h100-sxm-80gb")
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": 4096, "world_size": 64, "ep_size": 64, "micro_batch_num": 2})
    flat, flex = Estimate(m, st, sy), Estimate(m, st.with_updates({"moe_dispatcher_policy": "flex"}), sy)
    a2a = lambda e: next(k for o in e.stages[0].ops if o.module == "dispatch" for k in o.fwd if isinstance(k, Collective) and k.op == "all2all")  # noqa: E731
    c0, c1 = a2a(flat), a2a(flex)
    assert c0.bytes == c1.bytes and c1.fanout == (256, 8, 8, 4) and c0.fanout is None
    net = flex.network
    nodes, ranks = expected_units_hit(8, 256, 8, 8, 4), expected_units_hit(64, 256, 8, 8, 4)
    assert nodes == pytest.approx(3.629, abs=1e-3) and ranks == pytest.approx(7.359, abs=1e-3)
    per_copy = c1.bytes / 8
    remote = net._flat("inter_node", "p2p", per_copy * nodes * 7 / 8, 2, steps=7)
    nvlink = net._flat(net._intra_tier(8, 1), "p2p", per_copy * ranks * 63 / 64, 2)
    assert net.time(c1) == pytest.approx(max(remote, nvlink), rel=1e-12)
    assert net.time(c1) < 0.6 * net.time(c0)
    one_node = Estimate(m, st.with_updates({"world_size": 8, "ep_size": 8, "moe_dispatcher_policy": "flex"}), sy)
    c8 = a2a(one_node)
    assert one_node.network.time(c8) == pytest.approx(one_node.network._flat(
        one_node.network.groups["ep"].tier, "all2all", c8.bytes / 8 * expected_units_hit(8, 256, 8, 8, 4), 8, "ep"), rel=1e-12)
    with pytest.raises(ConfigError) as exc:
        Estimate(m.with_updates({"moe_pad_expert_input_to_capacity": True, "capacity": 1.0}),
                 st.with_updates({"moe_dispatcher_policy": "flex"}), sy).cost()
    assert exc.value.field == "moe_dispatcher_policy"


def test_flex_dispatcher_sms_slow_the_compute_it_overlaps() -> None:
    """The flex dispatcher's kernels hold moe_flex_dispatcher_num_sms SMs (Megatron's 20 by
    default) while they run: overlapped with compute (shared-expert overlap, the 1F1B
    all-to-all overlap) the GEMMs beside them slow by the accelerator's slowdown_beside (the
    H100's measured curve: 0.273 at 20 SMs; without a curve c / (SMs - c)), where NCCL's
    all-to-all takes its tier's processor_usage (0 in the presets). By hand for the shared
    experts: the hidden all-to-all time leaves 0.273 of itself exposed on an H100."""
    from simumax.config.loader import load_strategy
    from simumax.cost.moe_fanout import ep_compute_usage
    from simumax.profiles import SHARED_EXPERT_MODULES

    sy = load_system("h100-sxm-80gb")
    acc = sy.accelerator
    plain = acc.model_copy(update={"sm_contention": None})
    st = load_strategy("ep4_pp2_dp4_mbs1").with_updates({"seq_len": 4096, "pp_size": 1, "world_size": 8, "ep_size": 8})
    flex = st.with_updates({"moe_dispatcher_policy": "flex"})
    assert ep_compute_usage(st, acc, 0.0) == 0.0 and ep_compute_usage(st, acc, 0.1) == 0.1
    assert ep_compute_usage(flex, acc, 0.1) == pytest.approx(0.273)
    assert ep_compute_usage(flex, plain, 0.1) == pytest.approx(20 / 112)
    assert ep_compute_usage(flex.with_updates({"moe_flex_dispatcher_num_sms": 33}), plain, 0.0) == pytest.approx(1 / 3)
    assert ep_compute_usage(flex, acc.model_copy(update={"sm_count": None}), 0.1) == 0.1  # no SM count: the tier's figure
    m = load_model("deepseek-v2-lite").with_updates({"layer_num": 4, "moe_pad_expert_input_to_capacity": False})
    off = Estimate(m, flex, sy)
    on = Estimate(m, flex.with_updates({"moe_shared_expert_overlap": True}), sy)
    layer = m.layer_num - 1
    t0, t1 = off.layer_profiles.layer_time(layer, False), on.layer_profiles.layer_time(layer, False)
    shared = [on.layer_profiles.op_time(o) for o in on.layer_profiles.source.layer(layer, False)
              if o.module in SHARED_EXPERT_MODULES]
    side = sum(ph["fwd"].total for ph in shared)
    hidden = min(side, t0.fwd.comm["ep"])
    assert t1.fwd.total == pytest.approx(t0.fwd.total - hidden * (1 - 0.273), rel=1e-12)
    # the 1F1B all-to-all overlap: more SMs for the dispatcher, less left to the GEMMs beside it
    pair = flex.with_updates({"overlap_moe_expert_parallel_comm": True})
    times = [Estimate(m, pair.with_updates({"moe_flex_dispatcher_num_sms": n}), sy).cost().duration_time_per_iter
             for n in (8, 20, 64)]
    assert times[0] < times[1] < times[2]


def test_slowdown_beside_a_kernel_holding_sms() -> None:
    """accelerator.sm_contention: linear between the measured points and from (0, 0), the
    last segment carried on, at most 1; without points c / (SMs - c); bad points refused."""
    sy = load_system("h100-sxm-80gb")
    acc = sy.accelerator
    assert acc.slowdown_beside(0) == 0.0
    assert acc.slowdown_beside(4) == pytest.approx(0.169 / 2)
    assert acc.slowdown_beside(18) == pytest.approx((0.271 + 0.273) / 2)
    assert acc.slowdown_beside(64) == pytest.approx(0.525 + (0.525 - 0.369) / 16 * 16)
    assert acc.slowdown_beside(1000) == 1.0
    plain = acc.model_copy(update={"sm_contention": None})
    assert plain.slowdown_beside(32) == pytest.approx(32 / 100) and plain.slowdown_beside(132) == 1.0
    for bad in ([[8, 0.1], [8, 0.2]], [[0, 0.1]], [[8, -0.1]], [[8]]):
        with pytest.raises(ConfigError, match="sm_contention"):
            sy.with_updates({"accelerator": {**acc.model_dump(), "sm_contention": bad}})


@settings(max_examples=60, deadline=None)
@given(hs.lists(hs.tuples(hs.integers(1, 64), hs.floats(0.0, 0.9)), min_size=1, max_size=6, unique_by=lambda p: p[0]),
       hs.integers(0, 200))
def test_slowdown_beside_stays_in_bounds_and_grows_with_the_sms_held(points, held) -> None:
    """For any non-decreasing measured curve, slowdown_beside is in [0, 1], zero at 0 SMs and
    never falls as more SMs are held; without a curve likewise (c / (SMs - c), capped)."""
    pts = sorted(points)
    ys = sorted(u for _, u in pts)  # a curve that does not fall
    acc = load_system("h100-sxm-80gb").accelerator
    for a in (acc.model_copy(update={"sm_contention": [[float(c), u] for (c, _), u in zip(pts, ys)]}),
              acc.model_copy(update={"sm_contention": None})):
        lo, hi = a.slowdown_beside(held), a.slowdown_beside(held + 1)
        assert 0.0 <= lo <= hi <= 1.0
        assert a.slowdown_beside(0) == 0.0


def test_h100_sm_contention_is_the_measurement() -> None:
    """The H100 presets' curve is the median, per SM count, of the GEMM slowdowns measured
    beside a kernel holding that many SMs (benchmarks/sm_share_contention.py on the lent
    H100: four GEMM shapes, a spinning and a copying side kernel). Each point is well above
    the SM share c / SMs the flex dispatcher was charged before, and above c / (SMs - c):
    GEMMs planned for every SM leave a tail when some are taken."""
    import json
    from pathlib import Path

    from simumax.calibrate.sm_hold import contention_curve

    data = json.loads((Path(__file__).parents[1] / "docs" / "calibration" / "sm_share_2026-11-27" / "h100.json").read_text())
    assert all(b["side_outlasted"] for row in data["rows"] for b in row["beside"])
    sms = data["meta"]["sms"]
    for name in ("nvidia_h100_80gb_hbm3", "h100-sxm-80gb", "h200-sxm-141gb"):
        assert load_system(name).accelerator.sm_contention == contention_curve(data["rows"]), name
    for c, u in load_system("h100-sxm-80gb").accelerator.sm_contention[:-1]:
        print(f"{int(c)} SMs held: GEMMs {u:+.3f} (SM share {c / sms:.3f}, c/(SMs-c) {c / (sms - c):.3f})")
        assert u > c / (sms - c)
    assert load_system("b200-sxm-180gb").accelerator.sm_contention is None  # not measured there
    # the H200 (the same die) measured its own within 0.015 of the H100's curve it carries
    h200 = json.loads((Path(__file__).parents[1] / "docs" / "calibration" / "sm_share_2026-11-27" / "h200.json").read_text())
    for (c, u), (c2, u2) in zip(load_system("h200-sxm-141gb").accelerator.sm_contention, contention_curve(h200["rows"])):
        assert c == c2 and abs(u - u2) < 0.015, (c, u, u2)


def test_contention_curve_is_the_median_per_sm_count() -> None:
    """calibrate's accelerator.sm_contention: per SM count, the median over GEMMs and side
    kernels of the runs whose side kernel outlasted the loop (3 decimals)."""
    from simumax.calibrate.sm_hold import contention_curve

    def b(c: int, u: float, outlasted: bool = True) -> dict:
        return {"ctas": c, "u": u, "side_outlasted": outlasted}

    rows = [{"beside": [b(8, 0.1), b(8, 0.3), b(16, 0.2), b(16, 0.9, outlasted=False)]},
            {"beside": [b(8, 0.2), b(16, 0.4)]}]
    assert contention_curve(rows) == [[8.0, 0.2], [16.0, 0.3]]
    assert contention_curve([{"beside": [b(8, 0.1, outlasted=False)]}]) == []


def test_fp8_parameters_need_no_per_micro_batch_cast() -> None:
    """With fp8 parameters there are no bf16 weights to cast: fp8_weight_caching off adds
    no per-micro-batch weight casts then."""
    from simumax.config.loader import load_strategy

    m = load_model("llama3.1-8b").with_updates({"layer_num": 2})
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 2048, "fp8": True, "fp8_param_gather": True})
    casts = lambda s: [k for o in Estimate(m, s, load_system("h100-sxm-80gb")).stages[0].ops  # noqa: E731
                       for k in o.fwd if "cast_weight" in getattr(k, "name", "")]
    assert casts(st) == casts(st.with_updates({"fp8_weight_caching": False})) == []
    assert casts(st.with_updates({"fp8_param_gather": False, "fp8_weight_caching": False}))


def test_fp8_weight_gradient_in_bf16_by_hand() -> None:
    """Megatron --no-fp8-wgrad (TE DelayedScaling override_linear_precision.wgrad): each fp8
    linear's weight-gradient GEMM runs in BF16 on the BF16 input it keeps (2 B an element
    saved where the column-wise fp8 copy was 1 B), and the input and output gradient are cast
    row-wise only: read 2 B, write 1 B where both layouts wrote 2. Dense and grouped (expert)
    linears alike; the data-gradient GEMM stays fp8; other recipes ignore it, as Megatron does."""
    from simumax.config.loader import load_strategy
    from simumax.graph.kernels import Gemm

    sy = load_system("h100-sxm-80gb")
    for name, preset in (("llama3.1-8b", "tp1_pp1_dp8_mbs1"), ("mixtral-8x7b", "ep8_pp1_dp8_mbs1")):
        m = load_model(name).with_updates({"layer_num": 2})
        on = load_strategy(preset).with_updates({"seq_len": 2048, "fp8": True})
        off = on.with_updates({"fp8_wgrad": False})
        e_on, e_off = Estimate(m, on, sy), Estimate(m, off, sy)
        checked = 0
        for o_on, o_off in zip(e_on.stages[0].ops, e_off.stages[0].ops):
            q_on = {k.name.split(".")[-1]: k.bytes for k in (*o_on.fwd, *o_on.bwd_input) if "quantize" in getattr(k, "name", "")}
            if not q_on:
                continue
            q_off = {k.name.split(".")[-1]: k.bytes for k in (*o_off.fwd, *o_off.bwd_input) if "quantize" in getattr(k, "name", "")}
            for kind in ("quantize_input", "quantize_grad"):
                elems = q_on[kind] / 4  # 2 B read + 2 x 1 B written (delayed: no scales, no amax pass)
                assert q_off[kind] == pytest.approx(elems * 3, rel=1e-12)
            w_on = [k for k in o_on.bwd_weight if isinstance(k, (Gemm, GroupGemm))]
            w_off = [k for k in o_off.bwd_weight if isinstance(k, (Gemm, GroupGemm))]
            assert {k.family for k in w_on} <= {"fp8_matmul", "fp8_group_matmul"}
            assert {k.family for k in w_off} <= {"matmul", "group_matmul"}
            d_off = [k for k in o_off.bwd_input if isinstance(k, (Gemm, GroupGemm))]
            assert {k.family for k in d_off} <= {"fp8_matmul", "fp8_group_matmul"}
            (x,) = o_off.input
            assert x in o_off.saved and not any(t[0].endswith((".fp8", ".fp8_col")) for t in o_off.saved)
            checked += 1
        assert checked >= 4
        kept_off, kept_on = (e.memory().stages[0].fwd_activation_cache_per_micro_batch for e in (e_off, e_on))
        # more unless other ops keep the same BF16 inputs anyway (Mixtral: the router's and the
        # grouped GEMMs' norm output, the attention output flash attention keeps)
        assert kept_off > kept_on if name == "llama3.1-8b" else kept_off >= kept_on
        assert e_off.cost().duration_time_per_iter > e_on.cost().duration_time_per_iter
        current = on.with_updates({"fp8_recipe": "tensorwise"})
        assert Estimate(m, current.with_updates({"fp8_wgrad": False}), sy).cost().duration_time_per_iter == \
            Estimate(m, current, sy).cost().duration_time_per_iter


def test_shared_expert_gate_by_hand() -> None:
    """Megatron --moe-shared-expert-gate (Qwen2-MoE), ``SharedExpertMLP.forward``: per MoE
    layer the gate's logits are a GEMM with one output column over the layer's local input,
    and the product reads + writes the shared output (2 passes of [local tokens, h]); it keeps
    that output and the sigmoid's [tokens, 1] output for its gradient; backward reads the
    gradient and the kept output and writes one (4), the outer product (a GEMM with inner
    size 1) is added into the input gradient (3), and the weight gradient is a GEMM with one
    output row; one weight row of h per layer, the same on every TP rank. (Megatron-Core
    itself agrees on the parameters, FLOPs and saved bytes: tests/test_megatron_reference.py.)"""
    from simumax.config.loader import load_strategy
    from simumax.graph.kernels import Gemm, MemBound

    m0 = load_model("deepseek-v2-lite").with_updates({"layer_num": 4})
    m1 = m0.with_updates({"moe_shared_expert_gate": True})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": 2048, "tp_size": 2, "world_size": 16,
                                                          "enable_sequence_parallel": True})
    sy = load_system("h100-sxm-80gb")
    e0, e1 = Estimate(m0, st, sy), Estimate(m1, st, sy)
    t, h = 2048 // 2, m0.hidden_size  # local tokens (SP over TP 2)
    th = t * h * 2
    gates = [o for o in e1.stages[0].ops if o.module == "shared_gate"]
    moe_layers = sum(m0.is_moe_layer(i) for i in range(m0.layer_num))
    assert len(gates) == moe_layers == 3 and not any(o.module == "shared_gate" for o in e0.stages[0].ops)
    for g in gates:
        passes = lambda ks: sum(k.bytes for k in ks if isinstance(k, MemBound)) / th  # noqa: E731
        gemms = lambda ks: [(k.m, k.k, k.n) for k in ks if isinstance(k, Gemm)]  # noqa: E731
        assert (passes(g.fwd), passes(g.bwd_input), passes(g.bwd_weight)) == (2, 7, 0)
        assert (gemms(g.fwd), gemms(g.bwd_input), gemms(g.bwd_weight)) == ([(t, h, 1)], [(t, 1, h)], [(1, t, h)])
        assert [b for _, b in g.saved] == [th, t * 2] and g.params == g.tp_replicated_params == h
    kept = lambda e: e.memory().stages[0].fwd_activation_cache_per_micro_batch  # noqa: E731
    assert kept(e1) - kept(e0) == pytest.approx(moe_layers * (th + t * 2), rel=1e-12)
    assert e1.params.total - e0.params.total == moe_layers * m0.hidden_size
    assert e1.cost().duration_time_per_iter > e0.cost().duration_time_per_iter
    # recomputing the shared experts (or the whole MoE layer) drops the kept copy
    rec = st.with_updates({"enable_recompute": True, "megatron_recompute": True, "megatron_recompute_modules": ["shared_experts"]})
    assert kept(Estimate(m1, rec, sy)) == pytest.approx(kept(Estimate(m0, rec, sy)), rel=1e-12)


def test_fp8_expert_rows_padded_for_the_quantized_gemms() -> None:
    """megatron-core experts.py with fp8 (or fp4): TE's Fp8Padding copies each expert's rows
    into the quantized GEMMs' alignment before FC1 and Fp8Unpadding copies them back after
    FC2; backward copies their gradients the same way: four copies of the busiest rank's
    [rows, h] per layer (read and write), the probabilities padded beside. The router can
    pad instead (--moe-router-padding-for-quantization): no copies; bf16: none."""
    from simumax.export.megatron_flags import megatron_flags, model_flags
    from simumax.graph.kernels import MemBound
    from simumax.importers.megatron_args import parse_megatron_args

    m = load_model("mixtral-8x7b").with_updates({"layer_num": 1, "moe_pad_expert_input_to_capacity": False, "capacity": None})

    def copies(**st):
        e = _est(m, world_size=8, ep_size=8, **st)
        out = {}
        for o in e.stages[0].ops:
            for k in (*o.fwd, *o.bwd_input):
                if isinstance(k, MemBound) and ".quant_" in k.name:
                    out[k.name] = k.bytes
        return e, out

    e, fp8 = copies(fp8=True)
    rows = next(o for o in e.stages[0].ops if o.module == "expert_fc1").input[0][1] / (4096 * 2)
    big = 2 * rows * 4096 * 2
    assert fp8 == {"expert_fc1.quant_pad": big + rows * 8, "expert_fc1.quant_unpad_grad": big,
                   "expert_fc2.quant_unpad": big, "expert_fc2.quant_pad_grad": big}
    assert copies(fp8=True, moe_router_padding_for_quantization=True)[1] == {} and copies()[1] == {}
    padded = _est(m, world_size=8, ep_size=8, fp8=True, moe_router_padding_for_quantization=True)
    assert padded.cost().duration_time_per_iter < e.cost().duration_time_per_iter
    flags = model_flags(m) + megatron_flags(padded.strategy, m)
    assert "--moe-router-padding-for-quantization" in flags
    assert parse_megatron_args(flags, world_size=8)[1].moe_router_padding_for_quantization
    old = model_flags(m) + ["--seq-length", "4096", "--bf16", "--fp8-format", "e4m3", "--moe-token-dispatcher-type", "alltoall",
                           "--moe-router-padding-for-fp8"]
    assert parse_megatron_args(old, world_size=8)[1].moe_router_padding_for_quantization


def test_latent_moe_by_hand() -> None:
    """--moe-latent-size w (megatron-core 0.19 moe_layer.py): hidden -> w before the dispatch and
    w -> hidden after the combine (duplicated TE linears, 2·h·w parameters per MoE layer); the
    all-to-all moves w-wide rows and the experts' GEMMs run K = w (FC1) and N = w (FC2); router
    and shared experts keep the hidden width. Refused with the shared-expert overlap (Megatron
    asserts it in training); Megatron's flag both ways."""
    from simumax.export.megatron_flags import megatron_flags, model_flags
    from simumax.importers.megatron_args import parse_megatron_args

    m = load_model("deepseek-v2-lite").with_updates({"layer_num": 2})  # layer 0 dense, layer 1 MoE: h 2048, 64 experts of 1408
    lat = m.with_updates({"moe_latent_size": 512})
    full, small = (_est(x, world_size=8, ep_size=8) for x in (m, lat))

    def a2a(e):
        return [k.bytes for k in _kernels(e) if isinstance(k, Collective) and k.op == "all2all"]

    assert [b * 2048 / 512 for b in a2a(small)] == a2a(full)
    gg = {k.stage: k for k in _kernels(small) if isinstance(k, GroupGemm)}
    assert (gg["fwd"].K, gg["fwd"].N) in {(512, 2 * 1408), (1408, 512)}
    shapes = {(k.K, k.N) for k in _kernels(small) if isinstance(k, GroupGemm)}
    assert shapes == {(512, 2 * 1408), (1408, 512)}
    experts_full = 64 * 3 * 2048 * 1408
    assert full.params.total - small.params.total == experts_full - experts_full * 512 // 2048 - 2 * 2048 * 512
    with pytest.raises(ConfigError, match="moe_latent_size"):
        _est(lat, world_size=8, ep_size=8, moe_shared_expert_overlap=True).cost()
    flags = model_flags(lat) + megatron_flags(small.strategy, lat)
    assert "--moe-latent-size 512" in flags
    assert parse_megatron_args(flags, world_size=8)[0].moe_latent_size == 512
