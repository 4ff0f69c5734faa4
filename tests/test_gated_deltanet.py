"""Gated DeltaNet linear attention (megatron-core ``ssm/gated_delta_net``; Qwen3-Next): as a
transformer layer's attention (``experimental_attention_variant`` gated_delta_net with
``linear_attention_freq``) or a hybrid stack's G block."""

from __future__ import annotations

import types
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.dims import Dims
from simumax.graph.gdn_layer import CHUNK, gdn_ops
from simumax.graph.kernels import Collective, Gemm

SYSTEM = load_system("h100-sxm-80gb")


def _strategy(**fields):
    return load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 4096, **fields})


def _gdn_model(**fields):
    return load_model("llama3.1-8b").with_updates({"layer_num": 2, "hybrid_layer_pattern": "G-", **fields})


def _op(ops, module):
    return next(o for o in ops if o.module == module)


def _flops(kernels) -> float:
    return sum(k.flops for k in kernels if isinstance(k, Gemm))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gdn_layer_by_hand(tp) -> None:
    """One Gated DeltaNet block as megatron-core builds it: in_proj h -> 2·Hk·dk + 2·Hv·dv + 2·Hv
    with the input norm fused in, the depthwise conv over q, k, v (kernel 4, no bias), dt_bias
    and A_log per value head, the output norm over dv (one weight, the same on every TP rank),
    out_proj Hv·dv -> h; every width but the norms' split over TP. The chunked delta rule's
    products by hand, per token and value head with chunks of C = 64: forward 6·C·dk + 4·C·dv
    + 6·dk·dv, backward 16·C·dk + 10·C·dv + 16·dk·dv + 4·C² (FLA's kernels, module docstring)."""
    m = _gdn_model()
    h, hk, hv, dk, dv = m.hidden_size, m.linear_num_key_heads, m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim
    st = _strategy(tp_size=tp, enable_sequence_parallel=tp > 1)
    d = Dims.of(m, st)
    ops = gdn_ops(m, st, d, 0, ("L0.x", d.act(h, local=True)))
    width = 2 * hk * dk + 2 * hv * dv + 2 * hv
    conv = 2 * hk * dk + hv * dv
    by_hand = h + dv + (h * width + conv * 4 + 2 * hv + hv * dv * h) // tp
    assert sum(o.params for o in ops) == by_hand
    t = st.seq_len
    assert _flops(_op(ops, "gdn_in_proj").fwd) == 2 * t * h * width / tp
    assert _flops(_op(ops, "gdn_out_proj").fwd) == 2 * t * hv * dv / tp * h
    scan = _op(ops, "gdn_scan")
    c, heads = CHUNK, hv // tp
    assert _flops(scan.fwd) == t * heads * (6 * c * dk + 4 * c * dv + 6 * dk * dv)
    assert _flops(scan.bwd_input) == t * heads * (16 * c * dk + 10 * c * dv + 16 * dk * dv + 4 * c * c)
    assert scan.approximate == "gdn_scan"
    # what the kernel keeps for backward: q and k at the value heads, v, g (fp32), β and the inverted A
    assert dict(scan.saved) == {"L0.gdn_scan.q": 2 * t * heads * dk, "L0.gdn_scan.k": 2 * t * heads * dk,
                                "L0.gdn_scan.v": 2 * t * heads * dv, "L0.gdn_scan.g": 4 * t * heads,
                                "L0.gdn_scan.beta": 2 * t * heads, "L0.gdn_scan.A": 2 * t * heads * c}
    # the conv keeps its input, a view of in_proj's output: the whole buffer
    assert dict(_op(ops, "gdn_conv").saved) == {"L0.in_proj.out": 2 * t * width / tp}


def test_layer_pattern_is_megatrons() -> None:
    """linear_attention_freq N: layer i keeps softmax attention when (i + 1) % N == 0; a list
    says 1 for Gated DeltaNet. Checked against megatron-core's own get_linear_attention_pattern
    where it imports."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 8, "experimental_attention_variant": "gated_delta_net",
                                                "linear_attention_freq": 4})
    assert [int(m.linear_attention(i)) for i in range(8)] == [1, 1, 1, 0, 1, 1, 1, 0]
    assert m.softmax_attention_layers == 2
    listed = m.with_updates({"linear_attention_freq": [0, 1, 1, 0, 1, 1, 0, 1]})
    assert [int(listed.linear_attention(i)) for i in range(8)] == [0, 1, 1, 0, 1, 1, 0, 1]
    pytest.importorskip("megatron.core")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern
    except ImportError as exc:  # its module needs what megatron-core's optional extras bring
        pytest.skip(f"megatron-core's experimental attention specs do not import here: {exc}")
    for freq in (1, 2, 3, 4, [0, 1, 1, 0, 1, 1, 0, 1]):
        cfg = types.SimpleNamespace(num_layers=8, linear_attention_freq=freq, experimental_attention_variant="gated_delta_net")
        mine = m.with_updates({"linear_attention_freq": freq})
        assert [int(mine.linear_attention(i)) for i in range(8)] == get_linear_attention_pattern(cfg)


@pytest.mark.parametrize("fields", [
    {},
    {"tp_size": 2, "pp_size": 2, "enable_sequence_parallel": True},
    {"cp_size": 2, "world_size": 16, "seq_len": 8192},
    {"megatron_recompute": True, "megatron_recompute_modules": ["gdn_norm_out", "mlp"]},
])
def test_hybrid_g_blocks_are_the_gdn_transformer(fields) -> None:
    """A hybrid pattern of 'G-' pairs (a Gated DeltaNet block, an MLP block) is the transformer
    whose every layer's attention is a Gated DeltaNet: the same ops in the same order, so the
    same time, memory and parameters, whatever the parallel layout."""
    base = load_model("llama3.1-8b").with_updates({"layer_num": 4})
    gdn = base.with_updates({"experimental_attention_variant": "gated_delta_net", "linear_attention_freq": [1] * 4})
    hybrid = base.with_updates({"layer_num": 8, "hybrid_layer_pattern": "G-" * 4})
    st = _strategy(**fields)
    a, b = Estimate(gdn, st, SYSTEM), Estimate(hybrid, st, SYSTEM)
    assert b.cost(band=False).duration_time_per_iter == pytest.approx(a.cost(band=False).duration_time_per_iter, rel=1e-12)
    assert b.memory().peak_mem == a.memory().peak_mem
    assert b.params.total == a.params.total


def test_every_layer_softmax_is_the_transformer() -> None:
    """linear_attention_freq 1 keeps softmax attention on every layer: the plain transformer to the bit."""
    m = load_model("qwen3-30b-a3b").with_updates({"layer_num": 4})
    one = m.with_updates({"experimental_attention_variant": "gated_delta_net", "linear_attention_freq": 1})
    st = _strategy(ep_size=8)
    a, b = Estimate(m, st, SYSTEM), Estimate(one, st, SYSTEM)
    assert b.cost(band=False).duration_time_per_iter == a.cost(band=False).duration_time_per_iter
    assert b.memory().peak_mem == a.memory().peak_mem


@pytest.mark.parametrize("cp", [2, 4])
def test_gdn_context_parallel_by_hand(cp) -> None:
    """GatedDeltaNet's context parallelism: one all-to-all of the whole in_proj output to
    head-sharded full sequences (its heads permuted first), one of the gated output back; the
    CP ranks together run the scan of cp = 1, whatever the attention layers' CP scheme."""
    m = _gdn_model()
    st = _strategy(seq_len=8192, cp_size=cp, world_size=8 * cp, cp_comm_type="p2p")
    one = _strategy(seq_len=8192)
    d, d1 = Dims.of(m, st), Dims.of(m, one)
    ops = gdn_ops(m, st, d, 0, ("L0.x", d.act(m.hidden_size, local=True)))
    ops1 = gdn_ops(m, one, d1, 0, ("L0.x", d1.act(m.hidden_size, local=True)))
    assert cp * _flops(_op(ops, "gdn_scan").fwd) == pytest.approx(_flops(_op(ops1, "gdn_scan").fwd), rel=1e-12)
    hk, hv, dk, dv = m.linear_num_key_heads, m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim
    t = d.tokens  # this rank's share of the sequence
    a2a = [(k.bytes, k.group) for o in ops for k in o.fwd if isinstance(k, Collective) and k.op == "all2all"]
    assert a2a == [(2 * t * (2 * hk * dk + 2 * hv * dv + 2 * hv), "cp"), (2 * t * hv * dv, "cp")]


def test_packed_documents_chunk_per_document() -> None:
    """With documents packed into a sequence (FLA's cu_seqlens), chunks start at each document
    and each document's states run on their own: k documents of L in a sequence of k·L do the
    scan of a micro-batch of k sequences of L."""
    m = _gdn_model()
    packed = _strategy(seq_len=3 * 1000, document_lengths=1000)
    batch = _strategy(seq_len=1000, micro_batch_size=3)
    for st in (packed, batch):
        d = Dims.of(m, st)
        scan = _op(gdn_ops(m, st, d, 0, ("L0.x", d.act(m.hidden_size, local=True))), "gdn_scan")
        got = (_flops(scan.fwd), _flops(scan.bwd_input), scan.saved_bytes)
        if st is packed:
            first = got
    assert got == first
    # a document of 1000 tokens is 16 chunks of 64 (the last one short, padded in FLA's
    # blocks): the products within chunks run over 1024 rows, the state recurrences over 1000
    hv, dk, dv, c = m.linear_num_value_heads, m.linear_key_head_dim, m.linear_value_head_dim, CHUNK
    assert first[0] == 3 * hv * (16 * c * (6 * c * dk + 4 * c * dv + 2 * dk * dv) + 1000 * 4 * dk * dv)


@pytest.mark.parametrize("update,field", [
    ({"experimental_attention_variant": "gated_delta_net"}, "linear_attention_freq"),
    ({"linear_attention_freq": 4}, "linear_attention_freq"),
    ({"experimental_attention_variant": "gated_delta_net", "linear_attention_freq": [1, 0]}, "linear_attention_freq"),
    ({"experimental_attention_variant": "gated_delta_net", "linear_attention_freq": 4, "linear_num_value_heads": 24},
     "linear_num_value_heads"),
    ({"hybrid_layer_pattern": "G-G*", "experimental_attention_variant": "gated_delta_net", "linear_attention_freq": 4},
     "experimental_attention_variant"),
])
def test_model_rules(update, field) -> None:
    with pytest.raises(ConfigError) as exc:
        load_model("llama3.1-8b").with_updates({"layer_num": 4, **update})
    assert exc.value.field == field


@pytest.mark.parametrize("fields,field", [
    ({"tp_size": 32, "world_size": 32}, "tp_size"),  # 16 key heads over 32 TP ranks
    ({"tp_size": 4, "cp_size": 8, "world_size": 32}, "cp_size"),  # 16 key heads over 4 x 8
])
def test_strategy_rules(fields, field) -> None:
    with pytest.raises(ConfigError) as exc:
        Estimate(_gdn_model(), _strategy(**fields), SYSTEM).cost()
    assert exc.value.field == field


def test_fp8_in_proj_alignment() -> None:
    """With fp8 megatron-core asserts the in_proj width a multiple of 16 (32 under mxfp8):
    2·Hk·dk + 2·Hv·dv + 2·Hv = 2·4·64 + 2·12·64 + 24 = 2072 is not (2072 = 16·129.5)."""
    odd = _gdn_model(linear_num_key_heads=4, linear_num_value_heads=12, linear_key_head_dim=64, linear_value_head_dim=64)
    Estimate(odd, _strategy(), SYSTEM).cost()  # bf16 runs
    with pytest.raises(ConfigError) as exc:
        Estimate(odd, _strategy(fp8=True), SYSTEM).cost()
    assert exc.value.field == "linear_num_value_heads"
    Estimate(_gdn_model(), _strategy(fp8=True), SYSTEM).cost()  # 12352 = 16 x 772


def test_gdn_norm_out_recompute() -> None:
    """Megatron's --recompute-modules gdn_norm_out: the gated norm's output and its own saved
    tensors are dropped after out_proj takes them and remade in backward (its inputs, the scan
    output and z, stay): less memory, its forward once more per layer."""
    m = load_model("qwen3-30b-a3b").with_updates({"layer_num": 8, "experimental_attention_variant": "gated_delta_net",
                                                  "linear_attention_freq": 4})
    plain = Estimate(m, _strategy(ep_size=8), SYSTEM)
    st = _strategy(ep_size=8, megatron_recompute=True, megatron_recompute_modules=["gdn_norm_out"])
    rec = Estimate(m, st, SYSTEM)
    assert rec.memory().peak_mem < plain.memory().peak_mem
    assert rec.cost(band=False).duration_time_per_iter > plain.cost(band=False).duration_time_per_iter


QWEN3_NEXT_80B = {  # the keys of Qwen/Qwen3-Next-80B-A3B-Instruct's config.json that shape the model
    "architectures": ["Qwen3NextForCausalLM"], "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [], "partial_rotary_factor": 0.25,
    "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": 151936, "rope_theta": 10000000,
}


def test_qwen3_next_config_by_hand() -> None:
    """Qwen3-Next-80B-A3B reads as 36 Gated DeltaNet and 12 gated-attention layers over 512
    experts (top 10) with a gated shared expert; its parameters by hand are the 80 B of its
    model card (3.9 B active with both embeddings)."""
    from simumax.importers.hf import model_from_hf

    m, notes = model_from_hf(QWEN3_NEXT_80B)
    assert (m.experimental_attention_variant, m.linear_attention_freq, m.softmax_attention_layers) == ("gated_delta_net", 4, 12)
    assert m.attention_output_gate and m.qk_layernorm and m.moe_shared_expert_gate
    h, v, e, f = 2048, 151936, 512, 512
    gdn = h * (2 * 2048 + 2 * 4096 + 2 * 32) + 8192 * 4 + 2 * 32 + 128 + 4096 * h + h
    attention = h * (2 * 16 * 256 + 2 * 2 * 256) + 16 * 256 * h + 2 * 256 + h  # q and its gate, k, v, o, q/k norms, norm
    moe = e * 3 * h * f + 3 * h * f + h + h * e + h  # experts, shared expert, its gate, router, pre-MLP norm
    by_hand = 36 * gdn + 12 * attention + 48 * moe + 2 * v * h + h
    e80 = Estimate(m, _strategy(ep_size=8), SYSTEM)
    assert e80.params.total == by_hand
    assert 79.5e9 < by_hand < 80.0e9
    routed = 48 * e * 3 * h * f
    assert e80.params.active == by_hand - routed + routed * 10 // 512
    layer_types = ["linear_attention"] * 3 + ["full_attention"]
    m2, _ = model_from_hf({**QWEN3_NEXT_80B, "layer_types": layer_types * 12})
    assert m2.linear_attention_freq == 4
    with pytest.raises(ConfigError) as exc:
        model_from_hf({**QWEN3_NEXT_80B, "layer_types": layer_types})
    assert exc.value.field == "layer_types"


@settings(max_examples=25, deadline=None)
@given(hk=st.sampled_from([4, 8, 16]), ratio=st.sampled_from([1, 2, 4]), dk=st.sampled_from([64, 128, 256]),
       dv=st.sampled_from([64, 128]), tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([1024, 4096, 6000]))
def test_split_conserves_the_scan(hk, ratio, dk, dv, tp, cp, seq) -> None:
    """However the heads are split over TP and CP, the ranks together run the one-rank scan:
    its FLOPs, both ways, and what it keeps (the head-sharded full sequences of CP hold 1 / cp
    of the heads each)."""
    seq = seq - seq % (2 * cp)
    m = _gdn_model(linear_num_key_heads=hk, linear_num_value_heads=hk * ratio, linear_key_head_dim=dk,
                   linear_value_head_dim=dv)
    if hk % (tp * cp):
        return
    one = _strategy(seq_len=seq)
    split = _strategy(seq_len=seq, tp_size=tp, cp_size=cp, world_size=8 * tp * cp, enable_sequence_parallel=tp > 1)
    got = []
    for s in (one, split):
        d = Dims.of(m, s)
        scan = _op(gdn_ops(m, s, d, 0, ("L0.x", d.act(m.hidden_size, local=True))), "gdn_scan")
        got.append((_flops(scan.fwd), _flops(scan.bwd_input), scan.saved_bytes))
    assert got[1][0] * tp * cp == pytest.approx(got[0][0], rel=1e-12)
    assert got[1][1] * tp * cp == pytest.approx(got[0][1], rel=1e-12)
    assert got[1][2] * tp * cp == pytest.approx(got[0][2], rel=1e-12)


QWEN3_5_MOE_TEXT = {  # transformers 5.23's Qwen3_5MoeTextConfig defaults (its docstring: the Qwen3.5-35B-A3B style)
    "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256, "hidden_act": "silu",
    "tie_word_embeddings": False, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
}


def test_qwen3_5_configs_by_hand() -> None:
    """Qwen3.5's checkpoints (Qwen3_5MoeForConditionalGeneration, Qwen3_5ForConditionalGeneration)
    read as their text models: Qwen3-Next's layers (30 Gated DeltaNet, 10 gated attention of 40),
    MoE or a dense SwiGLU MLP; transformers 5's rope_parameters give the RoPE base. The MoE
    text model's parameters by hand: 34.7 B (35 B with its vision tower)."""
    from simumax.importers.hf import model_from_hf

    moe, notes = model_from_hf({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": QWEN3_5_MOE_TEXT,
                                "vision_config": {"depth": 27}})
    assert any("vision tower" in n for n in notes) and any("partial_rotary_factor 0.25" in n for n in notes)
    assert (moe.softmax_attention_layers, moe.expert_num, moe.topk, moe.rotary_base) == (10, 256, 8, 1e7)
    h, v, e, f = 2048, 248320, 256, 512
    gdn = h * (2 * 2048 + 2 * 4096 + 2 * 32) + 8192 * 4 + 2 * 32 + 128 + 4096 * h + h
    attention = h * (2 * 16 * 256 + 2 * 2 * 256) + 16 * 256 * h + 2 * 256 + h
    moe_mlp = e * 3 * h * f + 3 * h * f + h + h * e + h
    by_hand = 30 * gdn + 10 * attention + 40 * moe_mlp + 2 * v * h + h
    assert Estimate(moe, _strategy(ep_size=8), SYSTEM).params.total == by_hand
    assert 34.5e9 < by_hand < 34.8e9
    dense_text = {k: v for k, v in QWEN3_5_MOE_TEXT.items() if not k.startswith(("num_experts", "moe_", "shared_"))}
    dense, _ = model_from_hf({"architectures": ["Qwen3_5ForConditionalGeneration"],
                              "text_config": {**dense_text, "intermediate_size": 6144}})
    assert dense.model_type == "dense" and dense.linear_attention_freq == 4 and dense.attention_output_gate
    mlp = 3 * h * 6144 + h
    assert Estimate(dense, _strategy(), SYSTEM).params.total == 30 * gdn + 10 * attention + 40 * mlp + 2 * v * h + h


def test_megatron_flags_of_the_variant() -> None:
    """--linear-attention-freq takes Megatron's list expressions; without the variant flag it has
    no effect (megatron-core reads it only for gated_delta_net), said in a note; DSA needs MLA
    (tests/test_dsa_megatron.py reads it on an MLA model), an unknown variant is refused."""
    from simumax.importers.megatron_args import parse_megatron_args

    base = "--num-layers 8 --hidden-size 512 --num-attention-heads 4 --ffn-hidden-size 128 --seq-length 16 --vocab-size 100"
    m, _, _ = parse_megatron_args(base + " --experimental-attention-variant gated_delta_net "
                                  "--linear-attention-freq '([1]*3+[0]*1)*2' --linear-num-key-heads 4", world_size=1)
    assert m.linear_attention_freq == [1, 1, 1, 0] * 2 and m.linear_num_key_heads == 4 and m.softmax_attention_layers == 2
    m, _, notes = parse_megatron_args(base + " --linear-attention-freq 4", world_size=1)
    assert m.experimental_attention_variant is None and any("no effect, as in Megatron" in n for n in notes)
    with pytest.raises(ConfigError, match="dsa needs MLA"):
        parse_megatron_args(base + " --experimental-attention-variant dsa", world_size=1)
    with pytest.raises(ConfigError, match="experimental-attention-variant"):
        parse_megatron_args(base + " --experimental-attention-variant linear", world_size=1)


def test_scan_traffic_is_its_kernels_reads_and_writes() -> None:
    """The delta rule's products are inside FLA's fused kernels: no HBM bytes of their own (no
    roofline floor each); the kernels' traffic by hand, per token and value head with dk = dv =
    128, C = 64, bf16: forward cumsum 8, kkt+solve 256+2+4+128, w/u 256+256+2+4+128+256+256,
    states 256+256+256+4+512+256, output 256+256+256+512+4+256 bytes."""
    m = _gdn_model()
    st = _strategy()
    d = Dims.of(m, st)
    scan = _op(gdn_ops(m, st, d, 0, ("L0.x", d.act(m.hidden_size, local=True))), "gdn_scan")
    assert all(k.fused and k.bytes == 0 for k in scan.fwd + scan.bwd_input if isinstance(k, Gemm))
    per_token_head = 8 + 390 + 1158 + 1540 + 1540
    traffic = sum(k.bytes for k in scan.fwd if not isinstance(k, Gemm))
    assert traffic == st.seq_len * m.linear_num_value_heads * per_token_head
    assert Gemm(64, 64, 64, "NN", b=8).bytes > 0  # a plain GEMM still crosses HBM


def test_perf_says_what_the_layers_are() -> None:
    """`perf` names the layer mix of a model whose layers differ: Gated DeltaNet beside softmax
    attention, a hybrid stack's blocks (and its MTP depths); nothing for one layer kind."""
    from simumax.report.format import layer_mix
    from tests.conftest import run_cli

    assert layer_mix(load_model("qwen3-next-80b-a3b")) == "48 layers: 36 Gated DeltaNet, 12 softmax attention"
    hybrid = load_model("qwen3-30b-a3b").with_updates({"layer_num": 4, "hybrid_layer_pattern": "MEGE/*E"})
    assert layer_mix(hybrid) == "4 blocks: 1 Mamba-2, 1 Gated DeltaNet, 2 MoE; 1 MTP depth(s) of attention, MoE"
    assert layer_mix(load_model("llama3.1-8b")) is None
    out = run_cli("perf", "-m", "qwen3-next-80b-a3b", "-s", "ep8_pp1_dp8_mbs1", "-y", "h100-sxm-80gb",
                  "--set", "model.layer_num=4")
    assert out.returncode == 0 and "4 layers: 3 Gated DeltaNet, 1 softmax attention" in out.stdout


def test_scan_benchmark_predicts_what_the_estimate_does() -> None:
    """benchmarks/gdn_scan.py (for a GPU session) prints the estimate's scan times beside FLA's:
    its prediction is the scan op's, and grows with the tokens."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "gdn_scan.py"
    spec = importlib.util.spec_from_file_location("gdn_scan_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    f4, b4 = bench.predicted("h100-sxm-80gb", 1, 4096)
    f32, b32 = bench.predicted("h100-sxm-80gb", 1, 32768)
    assert 0 < f4 < b4 and 6 < f32 / f4 < 9 and 6 < b32 / b4 < 9  # linear in the tokens, less the fixed parts
