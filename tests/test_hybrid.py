"""Megatron's hybrid stack (``hybrid_layer_pattern``: M Mamba-2, * attention, - MLP, E MoE,
one residual block per symbol; megatron-core models/hybrid, ssm/mamba_mixer.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.dims import Dims
from simumax.graph.kernels import Gemm
from simumax.graph.mamba_layer import CHUNK, mamba_ops

SYSTEM = load_system("h100-sxm-80gb")


def _strategy(**fields):
    return load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 4096, **fields})


@pytest.mark.parametrize("model,symbols,fields", [
    ("llama3.1-8b", "*-", {}),
    ("llama3.1-8b", "*-", {"tp_size": 2, "pp_size": 2, "enable_sequence_parallel": True}),
    ("llama3.1-8b", "*-", {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True}),
    ("qwen3-30b-a3b", "*E", {"ep_size": 8}),
])
def test_attention_and_mlp_blocks_make_the_transformer(model, symbols, fields) -> None:
    """A pattern of attention and MLP (or MoE) blocks, '*-' per transformer layer, is the
    transformer of half the layers: the same ops in the same order, so the same time, memory
    and parameters (to the bit, time to rounding), whatever the parallel layout."""
    m = load_model(model).with_updates({"layer_num": 4})
    hybrid = m.with_updates({"layer_num": 8, "hybrid_layer_pattern": symbols * 4})
    st = _strategy(**fields)
    a, b = Estimate(m, st, SYSTEM), Estimate(hybrid, st, SYSTEM)
    assert b.cost(band=False).duration_time_per_iter == pytest.approx(a.cost(band=False).duration_time_per_iter, rel=1e-12)
    assert b.memory().peak_mem == a.memory().peak_mem
    assert b.params.total == a.params.total


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_mamba_layer_by_hand(tp) -> None:
    """One Mamba-2 layer as megatron-core builds it (mamba_mixer.py): in_proj h -> 2·d_inner +
    2·G·N + H with the pre-norm fused in, the depthwise conv over x, B, C (kernel 4, with bias),
    dt_bias / A_log / D per head, the grouped RMSNorm over d_inner, out_proj d_inner -> h; every
    width but the pre-norm's split over TP. The scan's products by hand: C·Bᵀ per chunk of 128
    and group, and per chunk and head Bᵀ·x, the intra-chunk (C·Bᵀ)·x and C·state."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 2, "hybrid_layer_pattern": "M-"})
    h, n, p, g = m.hidden_size, m.mamba_state_dim, m.mamba_head_dim, m.mamba_num_groups
    heads, inner = 2 * h // p, 2 * h
    assert (m.mamba_heads, m.mamba_inner) == (heads, inner)
    st = _strategy(tp_size=tp, enable_sequence_parallel=tp > 1)
    d = Dims.of(m, st)
    ops = mamba_ops(m, st, d, 0, ("L0.x", d.act(h, local=True)))
    width = 2 * inner + 2 * g * n + heads
    by_hand = h + (h * width + (inner + 2 * g * n) * 5 + 3 * heads + inner + inner * h) // tp
    assert sum(o.params for o in ops) == by_hand
    t = st.seq_len
    gemms = {o.module: [k for k in o.fwd if isinstance(k, Gemm)] for o in ops}
    assert sum(k.flops for k in gemms["in_proj"]) == 2 * t * h * width / tp
    assert sum(k.flops for k in gemms["out_proj"]) == 2 * t * inner / tp * h
    chunks = math.ceil(t / CHUNK)
    q = CHUNK
    scan = chunks * (g // tp * 2 * q * n * q + heads // tp * (2 * n * q * p + 2 * q * q * p + 2 * q * n * p))
    assert sum(k.flops for k in gemms["mamba_ssd"]) == scan
    ssd = next(o for o in ops if o.module == "mamba_ssd")
    assert ssd.approximate == "mamba_ssd"
    # the fused function keeps its input zxBCdt (in_proj's output) and the ungated scan output
    assert dict(ssd.saved) == {"L0.in_proj.out": t * width / tp * 2, "L0.ssd.out_x": t * inner / tp * 2}


def test_hybrid_estimate_and_band() -> None:
    """A Nemotron-H-like stack runs end to end: its parameters are its blocks', SimuMax's
    6ND + attention counts its attention layers only, and the scan's seconds are counted as
    approximate (unmeasured in the 80 % band)."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 8, "hybrid_layer_pattern": "M-M*M-M-",
                                                "position_embedding_type": "none"})
    e = Estimate(m, _strategy(), SYSTEM)
    cost = e.cost()
    assert cost.duration_time_per_iter > 0 and e.memory().peak_mem > 0
    assert "mamba_ssd" in cost.efficiency_lookups["approximate"]
    tokens = e.strategy.global_batch_size * e.strategy.seq_len
    weights = e.params.active - m.padded_vocab(1) * m.hidden_size  # the input embedding is a lookup
    one_attention_layer = 6 * e.strategy.seq_len * m.head_num * 2 * m.head_size * tokens
    assert e.flops_6nd_with_attn() - 6 * weights * tokens == pytest.approx(one_attention_layer, rel=1e-12)


@pytest.mark.parametrize("update,field", [
    ({"hybrid_layer_pattern": "M-D*M-M-"}, "hybrid_layer_pattern"),
    ({"hybrid_layer_pattern": "M-M*M-M-/M-/*-"}, "hybrid_layer_pattern"),  # MTP depths must be alike
    ({"hybrid_layer_pattern": "M-M*M-M-/M-", "mtp_num_layers": 2}, "mtp_num_layers"),  # the pattern has one depth
    ({"hybrid_layer_pattern": "M-M*M-M-", "mtp_num_layers": 1}, "mtp_num_layers"),  # MTP blocks go after '/' 
    ({"hybrid_layer_pattern": "M-M*M-M"}, "layer_num"),
    ({"hybrid_layer_pattern": "M-M*M-ME"}, "hybrid_layer_pattern"),
    ({"hybrid_layer_pattern": "M-M*M-M-", "mamba_num_heads": 100}, "mamba_num_groups"),
])
def test_hybrid_model_rules(update, field) -> None:
    with pytest.raises(ConfigError) as exc:
        load_model("llama3.1-8b").with_updates({"layer_num": 8, **update})
    assert exc.value.field == field


@pytest.mark.parametrize("fields,field", [
    ({"tp_size": 16, "world_size": 16}, "tp_size"),
    ({"cp_size": 256, "world_size": 2048}, "cp_size"),  # 128 heads over 256 CP ranks
    ({"pp_size": 2, "interleaving_size": 2, "world_size": 8}, "interleaving_size"),
])
def test_hybrid_strategy_rules(fields, field) -> None:
    m = load_model("llama3.1-8b").with_updates({"layer_num": 8, "hybrid_layer_pattern": "M-M*M-M-"})
    with pytest.raises(ConfigError) as exc:
        Estimate(m, _strategy(**fields), SYSTEM).cost()
    assert exc.value.field == field


NEMOTRON_H_8B = {  # the shape of NVIDIA's Nemotron-H 8B config.json (its keys; 52 blocks)
    "architectures": ["NemotronHForCausalLM"], "hidden_size": 4096, "intermediate_size": 21504,
    "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-M-M-M-M-",
    "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
    "chunk_size": 128, "mlp_hidden_act": "relu2", "vocab_size": 131072, "tie_word_embeddings": False,
}


def test_nemotron_h_config_by_hand() -> None:
    """A Nemotron-H config.json reads as the hybrid stack it is, and its parameters are the sum
    of its blocks by hand: 24 Mamba-2 blocks, 24 squared-ReLU MLPs, 4 GQA attention blocks,
    untied 131072-row embedding and head (8.1 B)."""
    from simumax.importers.hf import model_from_hf

    m, notes = model_from_hf(NEMOTRON_H_8B)
    assert (m.layer_num, m.hybrid_layer_pattern.count("M"), m.hybrid_layer_pattern.count("*")) == (52, 24, 4)
    assert not m.use_swiglu and m.position_embedding_type == "none" and any("relu2" in n for n in notes)
    h, ffn, v = 4096, 21504, 131072
    mamba = h * (2 * 8192 + 2 * 8 * 128 + 128) + 5 * (8192 + 2 * 8 * 128) + 3 * 128 + 8192 + 8192 * h + h
    mlp = 2 * h * ffn + h
    attention = h * (32 * 128 + 2 * 8 * 128) + 32 * 128 * h + h
    by_hand = 24 * mamba + 24 * mlp + 4 * attention + 2 * v * h + h  # + the final norm
    e = Estimate(m, _strategy(), SYSTEM)
    assert e.params.total == by_hand
    assert 8.0e9 < by_hand < 8.2e9
    # the shipped preset is this config as it reads
    preset = Estimate(load_model("nemotron-h-8b"), _strategy(), SYSTEM)
    assert preset.cost(band=False).duration_time_per_iter == e.cost(band=False).duration_time_per_iter
    assert preset.memory().peak_mem == e.memory().peak_mem
    with pytest.raises(ConfigError) as exc:  # MoE blocks need the expert sizes
        model_from_hf({**NEMOTRON_H_8B, "hybrid_override_pattern": "M-M*E" * 4, "num_hidden_layers": 20})
    assert exc.value.field == "n_routed_experts"


NEMOTRON_H_MOE = {  # a Nemotron 3 style MoE hybrid, in transformers 5.23's NemotronHConfig keys
    "architectures": ["NemotronHForCausalLM"], "hidden_size": 2048, "intermediate_size": 4096,
    "layers_block_type": ["linear_attention", "moe", "linear_attention", "moe", "full_attention", "moe"],
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "mamba_num_heads": 64, "mamba_head_dim": 64,
    "ssm_state_size": 128, "n_groups": 8, "mlp_hidden_act": "relu2", "vocab_size": 131072, "tie_word_embeddings": False,
    "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1024, "n_shared_experts": 1,
    "moe_shared_expert_intermediate_size": 2048, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
    "num_nextn_predict_layers": 1,
}


def test_nemotron_h_moe_config_by_hand() -> None:
    """Nemotron-H's MoE blocks (transformers' NemotronHMoE): non-gated squared-ReLU experts, a
    sigmoid router with the score-correction bias and the routed scaling factor, one shared
    expert; the layer list of transformers 5 (layers_block_type) gives the pattern. Parameters
    by hand: Mamba blocks as above, per MoE block 128 experts x 2 matrices + the shared expert's 2
    + the router + the norm."""
    from simumax.importers.hf import model_from_hf

    m, notes = model_from_hf(NEMOTRON_H_MOE)
    assert m.hybrid_layer_pattern == "MEME*E/*E" and m.layer_num == 6
    assert (m.expert_num, m.topk, m.moe_router_score_function, m.moe_router_enable_expert_bias) == (128, 6, "sigmoid", True)
    assert m.moe_router_topk_scaling_factor == 2.5 and not m.use_swiglu
    assert (m.mtp_num_layers, m.hybrid_mtp_pattern) == (1, "*E")  # one MTP depth: attention then MoE (the default)
    h, v, inner = 2048, 131072, 64 * 64
    mamba = h * (2 * inner + 2 * 8 * 128 + 64) + 5 * (inner + 2 * 8 * 128) + 3 * 64 + inner + inner * h + h
    moe = 128 * 2 * h * 1024 + 2 * h * 2048 + h * 128 + h
    attention = h * (16 * 128 + 2 * 2 * 128) + 16 * 128 * h + h
    e = Estimate(m, _strategy(ep_size=8), SYSTEM)
    assert e.params.total == 2 * mamba + 3 * moe + attention + 2 * v * h + h
    # the MTP depth: two norms, the 2h -> h projection, its attention and MoE blocks, the final norm
    assert e.params.mtp == 2 * h + 2 * h * h + attention + moe + h
    with pytest.raises(ConfigError) as exc:
        model_from_hf({**NEMOTRON_H_MOE, "layers_block_type": ["linear_attention", "sparse"]})
    assert exc.value.field == "layers_block_type"


@pytest.mark.parametrize("cp,scheme", [(2, "p2p"), (4, "a2a"), (16, "p2p")])
def test_mamba_context_parallel_by_hand(cp, scheme) -> None:
    """megatron-core's MambaContextParallel: z, x, B, C and dt each through an all-to-all over
    CP before the scan (B and C repeated cp / G times where a rank has fewer groups than CP
    ranks), the output's all-to-all back after it; the scan runs on the whole sequence with
    1 / cp of the heads, so the CP ranks together do the scan of cp = 1, and each keeps 1 / cp
    of its input (with the repeats)."""
    from simumax.graph.kernels import Collective

    m = load_model("llama3.1-8b").with_updates({"layer_num": 2, "hybrid_layer_pattern": "M-"})
    st = _strategy(seq_len=8192, cp_size=cp, world_size=8 * cp, cp_comm_type=scheme)
    one = _strategy(seq_len=8192)
    d, d1 = Dims.of(m, st), Dims.of(m, one)
    x = ("L0.x", d.act(m.hidden_size, local=True))
    ssd = next(o for o in mamba_ops(m, st, d, 0, x) if o.module == "mamba_ssd")
    ssd1 = next(o for o in mamba_ops(m, one, d1, 0, ("L0.x", d1.act(m.hidden_size, local=True))) if o.module == "mamba_ssd")
    flops = lambda o: sum(k.flops for k in o.fwd if isinstance(k, Gemm))
    g, n, heads, inner = m.mamba_num_groups, m.mamba_state_dim, m.mamba_heads, m.mamba_inner
    repeat = cp // g if g < cp else 1
    if repeat == 1:
        assert cp * flops(ssd) == pytest.approx(flops(ssd1), rel=1e-12)
    t = d.tokens  # this rank's share of the sequence
    a2a = [k.bytes for k in ssd.fwd if isinstance(k, Collective)]
    assert a2a == [2 * t * inner, 2 * t * inner, 2 * t * g * n * repeat, 2 * t * g * n * repeat, 2 * t * heads,
                   2 * t * inner]  # z, x, B, C, dt in; y out
    kept = dict(ssd.saved)["L0.ssd.in_cp"]  # the head-sharded scan input over the whole sequence
    assert kept == 2 * t * cp * (2 * inner // cp + 2 * max(1, g // cp) * n + heads // cp)


def test_pattern_segments_are_the_virtual_stages() -> None:
    """'|' between pipeline segments (Megatron's fVPP): each segment is a virtual stage. A
    transformer-like pattern cut in four at PP2 is the interleaved transformer (2 chunks per
    rank) to the bit; cut unevenly at PP2 it is the uneven first / last split; the segment
    count must be pp x interleaving_size, and first / last stage counts go with none."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 8})
    base = _strategy(micro_batch_num=8, pp_size=2)
    vp = m.with_updates({"layer_num": 16, "hybrid_layer_pattern": "*-*-|*-*-|*-*-|*-*-"})
    st = base.with_updates({"interleaving_size": 2, "overlap_p2p_comm": True})  # Megatron: PP 2 interleaves overlapped
    a, b = Estimate(m, st, SYSTEM), Estimate(vp, st, SYSTEM)
    assert b.cost(band=False).duration_time_per_iter == a.cost(band=False).duration_time_per_iter
    assert b.memory().peak_mem == a.memory().peak_mem
    uneven = m.with_updates({"layer_num": 8, "hybrid_layer_pattern": "*-|*-*-*-"})
    plain = Estimate(m.with_updates({"layer_num": 4}), base.with_updates(
        {"num_layers_in_first_pipeline_stage": 1, "num_layers_in_last_pipeline_stage": 3}), SYSTEM)
    assert Estimate(uneven, base, SYSTEM).cost(band=False).duration_time_per_iter == plain.cost(band=False).duration_time_per_iter
    with pytest.raises(ConfigError) as exc:
        Estimate(vp, base, SYSTEM).cost()
    assert exc.value.field == "interleaving_size" and "interleaving_size 2" in exc.value.rule
    with pytest.raises(ConfigError) as exc:
        Estimate(uneven, base.with_updates({"num_layers_in_first_pipeline_stage": 2}), SYSTEM).cost()
    assert exc.value.field == "num_layers_in_first_pipeline_stage"
    with pytest.raises(ConfigError):
        m.with_updates({"layer_num": 4, "hybrid_layer_pattern": "*-||*-"})  # an empty segment
    # Megatron flags: the pattern carries the segments, no virtual-stage flag; read back the same
    from simumax.export.megatron_flags import megatron_flags, model_flags
    from simumax.importers.megatron_args import parse_megatron_args

    flags = model_flags(vp) + megatron_flags(st, vp)
    assert not any("virtual" in f for f in flags)
    m2, s2, _ = parse_megatron_args(flags, world_size=st.world_size)
    assert (m2.hybrid_layer_pattern, m2.layer_num, s2.interleaving_size) == (vp.hybrid_layer_pattern, 16, 2)


GRANITE_4_H = {  # transformers 5.23's GraniteMoeHybridConfig keys (Granite 4.0-H style, sizes chosen here)
    "architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 100352, "hidden_size": 1536, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_act": "silu",
    "num_local_experts": 64, "num_experts_per_tok": 6, "shared_intermediate_size": 1024, "position_embedding_type": "nope",
    "layer_types": ["linear_attention", "linear_attention", "attention", "linear_attention"],
    "mamba_n_heads": 48, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_head": 64, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_chunk_size": 256, "tie_word_embeddings": True,
}


def test_granite_4_hybrid_config_by_hand() -> None:
    """Granite 4.0-H (transformers' GraniteMoeHybrid): each layer's mixer (Mamba-2, or attention
    where layer_types says so) then its MoE with a shared SwiGLU MLP, each with its own norm and
    residual: the hybrid pattern's blocks in pairs ("ME ME *E ME"); without experts the shared
    MLP alone ("-"). Parameters by hand."""
    from simumax.importers.hf import model_from_hf

    m, notes = model_from_hf(GRANITE_4_H)
    assert m.hybrid_layer_pattern == "MEME*EME" and m.position_embedding_type == "none"
    assert (m.expert_num, m.topk, m.moe_ffn, m.moe_shared_expert_intermediate_size) == (64, 6, 512, 1024)
    assert any("mamba_chunk_size 256" in n for n in notes)
    h, v, inner, g, n, heads = 1536, 100352, 3072, 1, 128, 48
    mamba = h * (2 * inner + 2 * g * n + heads) + 5 * (inner + 2 * g * n) + 3 * heads + inner + inner * h + h
    attention = h * (12 * 128 + 2 * 4 * 128) + 12 * 128 * h + h
    moe = 64 * 3 * h * 512 + 3 * h * 1024 + h * 64 + h
    e = Estimate(m, _strategy(ep_size=8), SYSTEM)
    assert e.params.total == 3 * mamba + attention + 4 * moe + v * h + h  # tied embeddings
    dense, _ = model_from_hf({**GRANITE_4_H, "num_local_experts": 0})
    assert dense.hybrid_layer_pattern == "M-M-*-M-" and dense.intermediate_size == 1024 and not dense.is_moe


@pytest.mark.parametrize("fields", [{}, {"pp_size": 2, "world_size": 16}])
def test_hybrid_mtp_depths_are_the_transformer_mtp(fields) -> None:
    """Megatron's unified pattern 'main/mtp/mtp' (MultiTokenPredictionBlock with mtp_layer_pattern):
    each depth runs the blocks after '/', between the depth's projection and its head. '*E' pairs
    with '/*E' depths are the MoE transformer with as many MTP layers: the same ops in the same
    order, so the same time, memory and parameters (the MTP block's counted apart)."""
    m = load_model("qwen3-30b-a3b").with_updates({"layer_num": 4, "mtp_num_layers": 2})
    hybrid = load_model("qwen3-30b-a3b").with_updates({"layer_num": 8, "hybrid_layer_pattern": "*E" * 4 + "/*E/*E"})
    assert (hybrid.mtp_num_layers, hybrid.mtp_blocks, hybrid.hybrid_symbols) == (2, 2, "*E" * 4)
    st = _strategy(ep_size=8, **fields)
    a, b = Estimate(m, st, SYSTEM), Estimate(hybrid, st, SYSTEM)
    assert b.cost(band=False).duration_time_per_iter == pytest.approx(a.cost(band=False).duration_time_per_iter, rel=1e-12)
    assert b.memory().peak_mem == a.memory().peak_mem
    assert (b.params.total, b.params.mtp) == (a.params.total, a.params.mtp) and a.params.mtp > 0


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_hybrid_stacks_keep_the_invariants(data) -> None:
    """Random hybrid stacks (Mamba, Gated DeltaNet, attention, MLP and MoE blocks, '|' segments as
    virtual stages, MTP depths) under random TP / CP / PP / recompute: every layer renamed from
    the first of its kind is the layer built for itself, the analytic pipeline is the event
    simulation, the parameters are the unsharded model's, and full recompute keeps no more."""
    from simumax.graph.recompute import is_recomputed

    moe = data.draw(st.booleans())
    symbols = "MG*-E" if moe else "MG*-"
    tp, pp = data.draw(st.sampled_from([1, 2])), data.draw(st.sampled_from([1, 2]))
    vp = data.draw(st.sampled_from([1, 2])) if pp > 1 else 1
    n = pp * vp * data.draw(st.integers(1, 3))
    blocks = data.draw(st.lists(st.sampled_from(symbols), min_size=n, max_size=n))
    if moe and "E" not in blocks:
        blocks[-1] = "E"
    per = n // (pp * vp)
    pattern = "|".join("".join(blocks[i:i + per]) for i in range(0, n, per)) if vp > 1 else "".join(blocks)
    if data.draw(st.booleans()):
        pattern += "/" + "".join(data.draw(st.lists(st.sampled_from(symbols), min_size=1, max_size=2)))
    base = load_model("qwen3-30b-a3b" if moe else "llama3.1-8b")
    # (the vocabulary unpadded: Megatron pads it to a multiple of 128 x tp, which changes the count)
    m = base.with_updates({"layer_num": n, "hybrid_layer_pattern": pattern, "mamba_num_heads": 64,
                           "linear_num_key_heads": 8, "linear_num_value_heads": 16, "padded_vocab_size": False})
    fields = {"tp_size": tp, "pp_size": pp, "interleaving_size": vp, "world_size": 8 * tp * pp,
              "enable_sequence_parallel": tp > 1, "micro_batch_num": 2 * pp, "seq_len": 2048,
              "ep_size": 8 if moe else 1}
    if data.draw(st.booleans()):
        fields.update(enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=1)
    s = _strategy(**fields)
    e = Estimate(m, s, SYSTEM)
    t = e.cost(band=False).duration_time_per_iter
    assert math.isfinite(t) and t > 0
    src = e.layer_profiles.source
    for chunk in e.chunks:
        for pos, layer in enumerate(chunk.layers):
            rec = is_recomputed(s, pos)
            assert src.layer(layer, rec) == src.built_layer(layer, rec), (pattern, layer, rec)
    assert math.isclose(e.simulate().total, t, rel_tol=1e-9)
    flat = s.with_updates({"tp_size": 1, "pp_size": 1, "interleaving_size": 1, "world_size": 8, "enable_sequence_parallel": False,
                           "micro_batch_num": 1, "enable_recompute": False})
    whole = m.with_updates({"hybrid_layer_pattern": pattern.replace("|", "")})  # no virtual stages to fill
    assert e.params.total == Estimate(whole, flat, SYSTEM).params.total
    if s.recompute_mode == "none":
        full = Estimate(m, s.with_updates({"enable_recompute": True, "recompute_granularity": "full_block",
                                           "recompute_layer_num": None}), SYSTEM)
        assert full.memory().peak_mem <= e.memory().peak_mem


def test_mamba_scan_traffic_is_its_kernels_reads_and_writes() -> None:
    """The SSD scan's products are inside mamba_ssm's fused kernels: no HBM bytes of their own;
    its forward kernels' traffic by hand per token (H heads of P, G groups of N, chunks of Q =
    128; bf16, fp32 decays and states): cumsum 2H + 8H, chunk state 2GN + 2HP + 8H + 4HPN/Q,
    state passing 6HPN/Q, C·Bᵀ 4GN + 4GQ, chunk scan 4GQ + 8HP + 8H + 2GN + 2HPN/Q."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 2, "hybrid_layer_pattern": "M-"})
    st = _strategy()
    d = Dims.of(m, st)
    ssd = next(o for o in mamba_ops(m, st, d, 0, ("L0.x", d.act(m.hidden_size, local=True))) if o.module == "mamba_ssd")
    assert all(k.fused and k.bytes == 0 for k in ssd.fwd + ssd.bwd_input if isinstance(k, Gemm))
    h, p, g, n, q = m.mamba_heads, m.mamba_head_dim, m.mamba_num_groups, m.mamba_state_dim, CHUNK
    per_token = (10 * h) + (2 * g * n + 2 * h * p + 8 * h + 4 * h * p * n / q) + 6 * h * p * n / q \
        + (4 * g * n + 4 * g * q) + (4 * g * q + 8 * h * p + 8 * h + 2 * g * n + 2 * h * p * n / q)
    scan = sum(k.bytes for k in ssd.fwd if not isinstance(k, Gemm) and not k.name.endswith("conv1d"))
    assert scan == pytest.approx(st.seq_len * per_token, rel=1e-12)


def test_megatron_hybrid_mtp_flags() -> None:
    """The unified pattern sets the MTP depths (a different --mtp-num-layers is said and
    overruled, as Megatron does); the old --mtp-hybrid-override-pattern becomes the pattern's
    depths; --mtp-num-layers without MTP blocks builds none, said in a note."""
    from simumax.importers.megatron_args import parse_megatron_args

    base = ("--num-layers 4 --hidden-size 512 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 16 "
            "--vocab-size 100 --num-experts 8 --moe-router-topk 2 --position-embedding-type none")  # MTP: rope or none
    m, _, _ = parse_megatron_args(base + " --hybrid-layer-pattern M*ME --mtp-num-layers 2 --mtp-hybrid-override-pattern '*E'",
                                  world_size=8)
    assert (m.hybrid_layer_pattern, m.mtp_num_layers, m.layer_num) == ("M*ME/*E/*E", 2, 4)
    m, _, notes = parse_megatron_args(base + " --hybrid-layer-pattern M*ME/*E --mtp-num-layers 3", world_size=8)
    assert m.mtp_num_layers == 1 and any("1 MTP depths are used" in n for n in notes)
    m, _, notes = parse_megatron_args(base + " --hybrid-layer-pattern M*ME --mtp-num-layers 1", world_size=8)
    assert m.mtp_num_layers == 0 and any("no MTP, as Megatron" in n for n in notes)
