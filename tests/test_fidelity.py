"""Mechanisms behind predictions outside the validation files (issue 19), each checked
against a hand derivation: the attention-backward FLOP convention of efficiency tables,
and the validation reader's memory conventions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.calibrate.system_writer import merge_compute
from simumax.config.loader import load_system
from simumax.config.system import SystemConfig
from simumax.cost.efficiency import ComputeModel
from simumax.graph.kernels import Attention


def _attn(phase: str) -> Attention:
    return Attention(phase, batch=1, seq_len=4096, head_num=64, kv_head_num=8, qk_head_dim=128, v_head_dim=128)


# ---- attention backward FLOP convention --------------------------------------------------
def test_simumax_tables_count_attention_backward_as_two_and_a_half_forwards() -> None:
    """SimuMax's measuring script counts bwd = 5 x base against fwd = 2 x base: a measured
    sdp_bwd efficiency e means time = 2.5 x forward table FLOPs / (peak x e)."""
    y = load_system("a100_pcie")  # a SimuMax file: no bwd_flops_ratio, so 2.5
    spec = y.accelerator.op["sdp_bwd"]
    assert spec.bwd_flops_ratio is None and spec.sdp_bwd_ratio == 2.5
    key, eff = next(iter(spec.accurate_efficient_factor.items()))
    fields = dict(p.split("=") for p in key.split(", "))
    k = Attention("bwd", batch=int(fields["batch"]), seq_len=int(fields["seq_len"]), head_num=int(fields["head_num"]),
                  kv_head_num=int(fields["kv_head_num"]), qk_head_dim=int(fields["qk_head_dim"]),
                  v_head_dim=int(fields["v_head_dim"]), qkv_contiguous=fields["qkv_contiguous"] == "True")
    assert k.key == key
    s, h = k.seq_len, k.head_num
    fwd_flops = 2.0 * k.batch * h * s * s * (k.qk_head_dim + k.v_head_dim)  # QK^T and PV, whole score matrix
    t, _ = ComputeModel(y).compute(k)
    assert t == pytest.approx(2.5 * fwd_flops / (spec.tflops * 1e12 * eff), rel=1e-12)


def test_a_table_in_the_model_convention_says_so() -> None:
    data = load_system("a100_pcie").to_dict()
    data["accelerator"]["op"]["sdp_bwd"]["bwd_flops_ratio"] = 2.0
    y2 = SystemConfig.init_from_dict(data)
    k = _attn("bwd")
    t25, _ = ComputeModel(load_system("a100_pcie")).compute(k)
    t20, _ = ComputeModel(y2).compute(k)
    assert t20 == pytest.approx(t25 * 2.0 / 2.5, rel=1e-12)
    # forward attention does not depend on the convention
    assert ComputeModel(y2).compute(_attn("fwd"))[0] == ComputeModel(load_system("a100_pcie")).compute(_attn("fwd"))[0]


def test_field_absent_from_dumps_of_simumax_files() -> None:
    assert "bwd_flops_ratio" not in json.dumps(load_system("a100_pcie").to_dict())
    assert load_system("nvidia_h100_80gb_hbm3").accelerator.op["sdp_bwd"].sdp_bwd_ratio == 2.0  # calibrate's


def test_calibration_writes_in_the_familys_convention() -> None:
    """calibrate times the kernel and counts 2 x forward; merged into a SimuMax file (2.5) the
    entry is scaled so the estimate reproduces the measured time."""
    k = _attn("bwd")
    seconds = 0.0123
    cal = SimpleNamespace(timings=[SimpleNamespace(family="sdp_bwd", key=k.key, flops=k.table_flops(2.0), seconds=seconds)],
                          bandwidth={}, peak_tflops=312.0, hbm_gbps=1600.0)
    for base in ("a100_pcie", "nvidia_h100_80gb_hbm3"):
        merged = SystemConfig.init_from_dict(merge_compute(load_system(base).to_dict(), cal))
        assert ComputeModel(merged).compute(k)[0] == pytest.approx(seconds, rel=1e-5)


# ---- unfused attention, GEMM roofline, GPT-style extras ----------------------------------
from simumax import ModelConfig, StrategyConfig  # noqa: E402
from simumax.estimate import Estimate  # noqa: E402
from simumax.graph.blocks import megatron_ce_traffic  # noqa: E402
from simumax.graph.kernels import Collective, Gemm, GroupGemm, MemBound  # noqa: E402


def _gpt(**model) -> ModelConfig:
    return ModelConfig(**{
        "hidden_size": 1024, "head_num": 16, "intermediate_size": 4096, "layer_num": 2, "vocab_size": 51200,
        "norm_type": "layernorm", "position_embedding_type": "learned_absolute", "add_bias_linear": True,
        "untie_embeddings_and_output_weights": False, **model,
    })


def _est(model: ModelConfig, system: str = "a100-sxm-80gb", **strategy) -> Estimate:
    st = StrategyConfig.init_from_dict({"seq_len": 2048, "world_size": 1, "micro_batch_size": 2, **strategy})
    return Estimate(model, st, load_system(system))


def _op(est: Estimate, name: str):
    return next(o for c in est.chunks for o in c.ops if o.name == name)


def test_attention_dropout_kernels_over_the_probabilities() -> None:
    """Dropout on the b x a x s x s probabilities: forward reads them (2 B) and writes the
    dropped ones (2 B) and the mask (1 B); backward reads gradient and mask, writes the
    gradient: 5 B per element each way (fp16)."""
    est = _est(_gpt(), use_math_sdp=True, use_flash_sdp=False, enable_dropout=True, dtype="fp16")
    attn = _op(est, "L0.attn")
    elems = 2 * 16 * 2048 * 2048
    fwd = [k for k in attn.fwd if isinstance(k, MemBound) and k.name.endswith(".dropout")]
    bwd = [k for k in attn.bwd_input if isinstance(k, MemBound) and k.name.endswith(".dropout_bwd")]
    assert [k.bytes for k in fwd] == [5 * elems] and [k.bytes for k in bwd] == [5 * elems]
    plain = _op(_est(_gpt(), use_math_sdp=True, use_flash_sdp=False, enable_dropout=False, dtype="fp16"), "L0.attn")
    assert not [k for k in plain.fwd + plain.bwd_input if isinstance(k, MemBound) and "dropout" in k.name]
    # full recompute runs the forward dropout a second time
    rec = _op(_est(_gpt(), use_math_sdp=True, use_flash_sdp=False, enable_dropout=True, dtype="fp16", enable_recompute=True,
                   recompute_granularity="full_block", recompute_layer_num=2), "L0.attn")
    assert any(isinstance(k, MemBound) and k.name.endswith(".dropout") for k in rec.kernels("recompute"))


def test_gemm_bytes_and_the_roofline_floor() -> None:
    g = Gemm(2048, 96, 2048, "TN", b=32)  # QK^T of 32 heads: intensity ~ head_dim FLOP/B
    assert g.bytes == 32 * ((2048 * 96 + 96 * 2048) * 2 + 2048 * 2048 * 2)
    w = Gemm(4096, 8192, 1024, "NT", accumulate=True, out_dtype="fp32", family="fp8_matmul")
    assert w.bytes == (4096 * 8192 + 8192 * 1024) * 1 + 4096 * 1024 * 4 * 2
    gg = GroupGemm(4, 1024, 2048, 512, "bwd_grad_w")
    assert gg.bytes == 4 * ((512 * 1024 + 1024 * 2048) * 2 + 512 * 2048 * 4 * 2)
    y = load_system("a100-sxm-80gb")
    hbm = y.accelerator.bandwidth["default"]
    t, _ = ComputeModel(y).compute(g)
    assert t >= g.bytes / (hbm.gbps * 1e9 * hbm.efficient_factor) * (1 - 1e-12)
    assert t == pytest.approx(g.bytes / (hbm.gbps * 1e9 * hbm.efficient_factor), rel=1e-12)  # memory-bound on A100
    big = Gemm(8192, 8192, 8192, "TN")  # compute-bound: the floor does not bind
    tb, eff = ComputeModel(y).compute(big)
    assert tb > big.bytes / (hbm.gbps * 1e9 * hbm.efficient_factor) and eff > 0.5


def test_unfused_loss_is_megatrons_kernel_chain() -> None:
    """Megatron's VocabParallelCrossEntropy over bf16 logits, per logit: forward the fp32
    copy (2 + 4), max (4), subtract in place (8), exp in place (8), sum (4), divide in place
    (8) = 38 B in 6 kernels; backward scale in place (8) and the cast back (4 + 2) = 14 B in
    2. fp32 logits skip the copy and the cast: 32 B / 5 and 8 B / 1."""
    assert megatron_ce_traffic(2) == ((38.0, 6), (14.0, 2))
    assert megatron_ce_traffic(4) == ((32.0, 5), (8.0, 1))
    est = _est(_gpt(), tp_size=2, world_size=2)
    loss = _op(est, "loss")
    n = 2 * 2048 * (51200 // 2)  # tokens x vocab / tp
    fwd = next(k for k in loss.fwd if isinstance(k, MemBound))
    bwd = next(k for k in loss.bwd_input if isinstance(k, MemBound))
    assert (fwd.bytes, fwd.launches, fwd.table_bytes) == (38 * n, 6, 14 * n)  # 14: SimuMax's convention, 2 + 3 x 4
    assert (bwd.bytes, bwd.launches, bwd.table_bytes) == (14 * n, 2, 6 * n)
    assert len([k for k in loss.fwd if isinstance(k, Collective)]) == 3  # max, target logit, sum-exp over TP


def test_a_measured_ce_line_times_the_chain_in_its_convention() -> None:
    """Without a ce line the chain runs on the default HBM line with a latency per kernel;
    a measured line (SimuMax's files) times it as the one unit it was measured as."""
    k = MemBound("loss.fwd", 38e9, family="ce", table_bytes=14e9, launches=6)
    blind = load_system("a100-sxm-80gb")
    hbm = blind.accelerator.bandwidth["default"]
    assert "ce" not in blind.accelerator.bandwidth
    assert ComputeModel(blind).membound(k) == pytest.approx(38e9 / (hbm.gbps * 1e9 * hbm.efficient_factor) + 6 * hbm.latency_us * 1e-6)
    simumax = load_system("a100_pcie")
    ce = simumax.accelerator.bandwidth["ce"]
    key, t = ComputeModel(simumax).membound_source(k)
    assert key == "memory/ce/measured"
    assert t == pytest.approx(14e9 / (ce.gbps * 1e9 * ce.efficient_factor) + ce.latency_us * 1e-6)


def test_learned_positions_add_and_their_gradient() -> None:
    """Word and position tables take F.embedding's dense gradient (zero-fill 2 B per table
    element, scatter-add the 4096 tokens' gradients: read 2 B, fp32 partials 4 B per token
    element) and Megatron's hook adds it to the fp32 main gradient (4 + 2 + 4 B per table
    element). Tied on one pipeline stage, the head's zero-filled dummy gradient (2 B) is
    added to it (2 + 2 + 2 B)."""
    est = _est(_gpt())
    emb = _op(est, "embedding")
    tokens, h, vocab, positions = 2 * 2048, 1024, 51200, 2048
    full = tokens * h * 2
    assert [k.bytes for k in emb.fwd if k.name == "embedding.position_add"] == [3 * full]

    def table(rows: int) -> float:
        return rows * h * 2 + tokens * h * (2 + 4) + rows * h * (4 + 2 + 4)

    assert [(k.name, k.bytes) for k in emb.bwd_weight] == [
        ("embedding.wgrad", table(vocab)), ("embedding.tied_wgrad_sum", vocab * h * (2 + 6)),
        ("embedding.position_wgrad", table(positions))]
    assert emb.bwd_transient == full + 2 * vocab * h * 2  # the dense gradient and the dummy
    rope = _op(_est(_gpt(position_embedding_type="rope", untie_embeddings_and_output_weights=True)), "embedding")
    assert [k.name for k in rope.fwd] == ["embedding.fwd"] and [k.name for k in rope.bwd_weight] == ["embedding.wgrad"]
    # with PP the head keeps its own copy of the tied weight: no dummy to add
    piped = _op(_est(_gpt(), pp_size=2, world_size=2), "embedding")
    assert "embedding.tied_wgrad_sum" not in [k.name for k in piped.bwd_weight]


def test_residual_gradients_are_summed_after_each_pre_norm() -> None:
    """A layer's input and its post-attention residual each feed a norm and a residual add:
    in backward autograd adds the two gradients, 3 x [tokens, h] bytes, once per norm (of
    the rank's own tokens with SP); the final norm's input has one consumer."""
    tokens, h = 2 * 2048, 1024
    for tp, sp in ((1, False), (2, True)):
        est = _est(_gpt(), tp_size=tp, world_size=tp, enable_sequence_parallel=sp)
        local = tokens // tp if sp else tokens
        for name in ("L0.attn_norm", "L0.mlp_norm", "L1.attn_norm"):
            added = [k.bytes for k in _op(est, name).bwd_input if k.name.endswith("grad_accumulate")]
            assert added == [3 * local * h * 2], (name, tp)
        assert not [k for k in _op(est, "final_norm").bwd_input if k.name.endswith("grad_accumulate")]
        # it costs what any memory-bound kernel of its bytes costs
        norm = _op(est, "L0.attn_norm")
        extra = est.layer_profiles.coster.kernel(norm.bwd_input[-1])
        assert extra == est.compute_model.membound(norm.bwd_input[-1]) > 0


def test_tied_embedding_gradient_all_reduce_between_first_and_last_stage() -> None:
    tied = _est(_gpt(layer_num=4), world_size=2, pp_size=2, micro_batch_num=4)
    untied = _est(_gpt(layer_num=4, untie_embeddings_and_output_weights=True), world_size=2, pp_size=2, micro_batch_num=4)
    vocab = tied.model.padded_vocab(1)
    expected = tied.network.time(Collective("all_reduce", float(vocab * 1024 * 4), "pp"))  # fp32 main grads
    assert expected > 0
    assert tied.embedding_grad_sync == [expected, expected]
    assert untied.embedding_grad_sync == [0.0, 0.0]
    assert _est(_gpt()).embedding_grad_sync == [0.0]  # one stage: the head adds into the same gradient
    assert tied.dp_reduce_time(tied.stages[0]) == pytest.approx(expected)
    # the simulator runs it too: with an overlap option on, the same iteration time up to rounding
    sim = _est(_gpt(layer_num=4), world_size=2, pp_size=2, micro_batch_num=4, overlap_grad_reduce=True)
    names = [e.name for r in sim.simulate().events for e in r]
    assert names.count("pp all_reduce tied embedding grads") == 2


def test_local_linears_pay_their_bias_kernels() -> None:
    te = _est(_gpt())
    local = _est(_gpt(), transformer_impl="local")
    tokens, h = 2 * 2048, 1024
    qkv = _op(local, "L0.qkv")
    assert [k.bytes for k in qkv.fwd if isinstance(k, MemBound)] == [2 * tokens * 3 * h * 2]
    for name, n in (("L0.qkv", 3 * h), ("L0.attn_proj", h), ("L0.fc1", 4 * h), ("L0.fc2", h)):
        assert [k.bytes for k in _op(local, name).bwd_weight if isinstance(k, MemBound)] == [tokens * n * 2]
        assert not [k for k in _op(te, name).bwd_weight if isinstance(k, MemBound)]  # TE: GEMM epilogue


# ---- FP8 as each recipe runs --------------------------------------------------------------
import logging  # noqa: E402

from simumax.config.loader import load_strategy  # noqa: E402
from simumax.errors import ConfigError  # noqa: E402
from simumax.graph import fp8  # noqa: E402


def _llama(**model) -> ModelConfig:
    return ModelConfig(**{"hidden_size": 1024, "head_num": 16, "kv_head_num": 4, "intermediate_size": 2048, "layer_num": 2,
                          "vocab_size": 32000, "use_swiglu": True, **model})


@pytest.mark.parametrize(("recipe", "per_elem"), [
    ("delayed", 2 + 1 + 1),  # read bf16, write fp8 row-wise + column-wise (fused amax)
    ("tensorwise", 2 + 2 + 1 + 1),  # + the amax pass before the cast
    ("blockwise", 2 + 2 * (1 + 4 / 128)),  # + one fp32 scale per 1 x 128 tile, both layouts
    ("mxfp8", 2 + 2 * (1 + 1 / 32)),  # + one E8M0 byte per 32 elements, both layouts
])
def test_fp8_quantize_bytes_per_recipe(recipe: str, per_elem: float) -> None:
    est = _est(_llama(), "b200-sxm-180gb", fp8=True, fp8_recipe=recipe, seq_len=1024, micro_batch_size=1)
    tokens, h, ffn = 1024, 1024, 2048
    fc1 = _op(est, "L0.fc1")
    assert [k.bytes for k in fc1.fwd if isinstance(k, MemBound)] == [pytest.approx(tokens * h * per_elem)]
    assert [k.bytes for k in fc1.bwd_input if isinstance(k, MemBound)] == [pytest.approx(tokens * 2 * ffn * per_elem)]
    r = fp8.recipe(recipe)
    assert fc1.saved[0][1] == pytest.approx(tokens * h * (1 + r.act_scale_bytes))  # the column-wise fp8 input
    assert all(k.family == "fp8_matmul" for k in fc1.fwd + fc1.bwd_input + fc1.bwd_weight if isinstance(k, Gemm))


def test_fp8_weight_cast_once_per_iteration_or_per_micro_batch() -> None:
    cached = _est(_llama(), "h100-sxm-80gb", fp8=True, micro_batch_num=4)
    per_mb = _est(_llama(), "h100-sxm-80gb", fp8=True, micro_batch_num=4, fp8_weight_caching=False)
    fc2 = _op(per_mb, "L0.fc2")
    assert [k.bytes for k in fc2.fwd if isinstance(k, MemBound) and k.name.endswith("cast_weight")] == [2048 * 1024 * 4.0]
    assert not [k for k in _op(cached, "L0.fc2").fwd if isinstance(k, MemBound) and k.name.endswith("cast_weight")]
    # cached: one cast of every TE-linear weight per iteration, with the step
    linear_params = sum(o.params for o in cached.stages[0].ops if o.weight_shapes)
    no_fp8 = _est(_llama(), "h100-sxm-80gb", micro_batch_num=4)
    extra = cached.optimizer_passes[0][1] - no_fp8.optimizer_passes[0][1]
    line = cached.compute_model.membound(MemBound("x", linear_params * 4.0)) - cached.compute_model.membound(MemBound("x", 0.0))
    assert extra == pytest.approx(line + cached.compute_model.membound(MemBound("x", 0.0)))


def test_delayed_scaling_reduces_amaxes_once_per_chunk_and_pass() -> None:
    est = _est(_llama(layer_num=4), "h100-sxm-80gb", fp8=True, world_size=8, pp_size=2, micro_batch_num=4)
    amax = [o for c in est.chunks for o in c.ops if o.module == "fp8_amax"]
    assert len(amax) == len(est.chunks) == 2
    linears = sum(1 for o in est.chunks[0].ops if o.weight_shapes)
    assert amax[0].fwd == amax[0].bwd_input == (Collective("all_reduce", 3 * 4.0 * linears, "dp"),)
    other = _est(_llama(layer_num=4), "h100-sxm-80gb", fp8=True, fp8_recipe="tensorwise", world_size=8, pp_size=2,
                 micro_batch_num=4, tp_size=2, enable_sequence_parallel=True)
    assert not [o for c in other.chunks for o in c.ops if o.module == "fp8_amax"]
    # current scaling of sequence-parallel inputs all-reduces each amax over TP first
    assert Collective("all_reduce", 4.0, "tp") in _op(other, "L0.qkv").fwd
    assert Collective("all_reduce", 4.0, "tp") in _op(other, "L0.fc2").bwd_input


@pytest.mark.parametrize(("recipe", "per_elem"), [
    (None, 2.0),  # bf16: the gathered activation
    ("delayed", 1.0), ("tensorwise", 1.0),  # FP8, one layout, no per-block scales
    ("mxfp8", 1 + 1 / 32), ("blockwise", 1 + 4 / 128),  # + the row-wise scales
])
def test_sequence_parallel_gathers_carry_the_quantized_tensor(recipe: str | None, per_elem: float) -> None:
    """TE quantizes a sequence-parallel linear's local shard and all-gathers the FP8 data
    (forward input, its re-gather for the weight gradient, and a row-parallel linear's
    output gradient); reduce-scatters keep bf16, and the LM head (Megatron's own linear,
    not TE) gathers bf16 whatever the recipe."""
    fp8_on = {"fp8": True, "fp8_recipe": recipe} if recipe else {}
    est = _est(_llama(), "b200-sxm-180gb", world_size=8, tp_size=4, enable_sequence_parallel=True, seq_len=1024,
               micro_batch_size=1, **fp8_on)
    tokens, h, ffn = 1024, 1024, 2048

    def tp(ks: tuple, op: str) -> list[float]:
        return [k.bytes for k in ks if isinstance(k, Collective) and k.group == "tp" and k.op == op]

    fc1, fc2 = _op(est, "L0.fc1"), _op(est, "L0.fc2")
    assert tp(fc1.fwd, "all_gather") == tp(fc1.bwd_input, "all_gather") == [pytest.approx(tokens * h * per_elem)]
    assert tp(fc2.bwd_input, "all_gather") == [pytest.approx(tokens * h * per_elem)]
    assert tp(fc1.bwd_input, "reduce_scatter") == tp(fc2.fwd, "reduce_scatter") == [tokens * h * 2.0]
    assert fc1.fwd_transient == pytest.approx(tokens * h * per_elem)  # the gathered input buffer
    assert fc2.bwd_transient == pytest.approx(tokens * h * per_elem + tokens * ffn // 4 * 2.0)
    assert tp(_op(est, "lm_head").fwd, "all_gather") == [tokens * h * 2.0]


@pytest.mark.parametrize("fp8_on", [False, True])
def test_weight_gradients_without_accumulation_fusion(fp8_on: bool) -> None:
    """Megatron's --no-gradient-accumulation-fusion (SimuMax's use_accm_weight false): each
    weight-gradient GEMM writes a 2 B gradient instead of accumulating into the fp32 main
    grad, and DDP's hook adds it (read 2 + 4, write 4 B per parameter), every micro-batch;
    the gradient is held between the two. Expert linears (grouped GEMM) get the same add."""
    kw = {"fp8": True} if fp8_on else {}
    fused = _est(_llama(), "h100-sxm-80gb", seq_len=1024, micro_batch_size=1, **kw)
    plain = _est(_llama(), "h100-sxm-80gb", seq_len=1024, micro_batch_size=1, gradient_accumulation_fusion=False, **kw)
    tokens, h, ffn = 1024, 1024, 2048
    fam = "fp8_matmul" if fp8_on else "matmul"
    fc2 = _op(plain, "L0.fc2")
    assert _op(fused, "L0.fc2").bwd_weight == (Gemm(h, tokens, ffn, "NT", accumulate=True, out_dtype="fp32", family=fam),)
    assert fc2.bwd_weight == (Gemm(h, tokens, ffn, "NT", accumulate=False, out_dtype="bf16", family=fam),
                              MemBound("fc2.main_grad_add", h * ffn * (2 + 4 + 4)))
    assert fc2.bwd_transient == _op(fused, "L0.fc2").bwd_transient + h * ffn * 2
    assert plain.cost().duration_time_per_iter > fused.cost().duration_time_per_iter
    # SimuMax's names for the same switch
    base = {"seq_len": 1024, "world_size": 1}
    assert load_strategy(base).gradient_accumulation_fusion is True
    assert load_strategy({**base, "use_accm_weight": False}).gradient_accumulation_fusion is False
    assert load_strategy({**base, "use_fused_grad_accumulation": False}).gradient_accumulation_fusion is False


def test_expert_weight_gradients_without_accumulation_fusion() -> None:
    m = load_model_preset("mixtral-8x1b").with_updates({"layer_num": 1})
    st = {"world_size": 8, "ep_size": 8, "seq_len": 1024, "micro_batch_size": 1, "group_linear_mode": "grouped"}
    fused = _est(m, "h100-sxm-80gb", **st)
    plain = _est(m, "h100-sxm-80gb", gradient_accumulation_fusion=False, **st)
    a = next(o for o in fused.stages[0].ops if o.expert_params)
    b = next(o for o in plain.stages[0].ops if o.name == a.name)
    assert b.bwd_weight[:-1] == a.bwd_weight  # the grouped GEMM as before, then the hook's add
    assert b.bwd_weight[-1].bytes == pytest.approx(a.expert_params * (2 + 4 + 4))


def test_fp8_needs_a_peak_and_a_device_that_runs_the_recipe(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="fp8: system 'a100-sxm-80gb' has no FP8 peak"):
        _est(_llama(), "a100-sxm-80gb", fp8=True)
    with pytest.raises(ConfigError, match="fp8_recipe: mxfp8 needs Blackwell"):
        _est(_llama(), "h100-sxm-80gb", fp8=True, fp8_recipe="mxfp8")
    with pytest.raises(ConfigError, match="fp8_recipe: blockwise needs Hopper"):
        _est(_llama(), "mi300x", fp8=True, fp8_recipe="blockwise")
    _est(_llama(), "b200-sxm-180gb", fp8=True, fp8_recipe="mxfp8")
    # a file claiming an FP8 peak for a device without FP8 units runs, warning once per system
    y = load_system("a100_pcie")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            Estimate(_llama(), StrategyConfig(seq_len=1024, fp8=True), y)
    lines = [r.getMessage() for r in caplog.records if "FP8" in r.getMessage()]
    assert len(lines) == 1 and "accelerator.op.fp8_matmul.tflops" in lines[0] and "a100_pcie" in lines[0]


def test_fp8_gemm_gains_less_on_small_shapes() -> None:
    """Hopper fp8 from the bf16 shape: large GEMMs gain p8·e8 / (p16·e16) over bf16, small
    ones (fixed costs a bf16 kernel already pays) gain less."""
    y = load_system("h100-sxm-80gb")
    cm = ComputeModel(y)
    p16, e16 = y.accelerator.op["matmul"].tflops, y.accelerator.op["matmul"].efficient_factor
    p8, e8 = y.accelerator.op["fp8_matmul"].tflops, y.accelerator.op["fp8_matmul"].efficient_factor

    def gain(m: int, k: int, n: int) -> float:
        return cm.compute(Gemm(m, k, n, "TN"))[0] / cm.compute(Gemm(m, k, n, "TN", family="fp8_matmul"))[0]

    big, small = gain(8192, 8192, 8192), gain(256, 256, 256)
    print(f"\nfp8 over bf16 on H100: 8192^3 {big:.2f}x, 256^3 {small:.2f}x (asymptote {p8 * e8 / (p16 * e16):.2f}x)")
    assert 1.0 < small < big <= p8 * e8 / (p16 * e16) * (1 + 1e-9)
    assert big > 1.5


# ---- EP all-to-all overlap (Megatron's paired 1F1B) ----------------------------------------
from simumax.config.loader import load_model as load_model_preset  # noqa: E402
from simumax.simulate.ep_overlap import MoeSlots, hidden_all_to_all, layer_slots  # noqa: E402


def test_all_to_all_hides_only_under_the_compute_of_its_slot() -> None:
    f = [MoeSlots(attn=1.0, dispatch=5.0, mlp=2.0, combine=5.0)]
    b = [MoeSlots(attn=3.0, dispatch=4.0, mlp=1.0, mlp_wgrad=1.5, combine=0.5)]
    # b.combine|f.attn: 0.5; f.dispatch|b.mlp(+wgrad): 2.5; b.dispatch|f.mlp: 2; f.combine|b.attn: 3
    assert hidden_all_to_all(f, b, delay_wgrad=False) == pytest.approx(0.5 + 2.5 + 2.0 + 3.0)
    # delayed wgrad: the experts' weight gradients run under the backward's dispatch instead
    assert hidden_all_to_all(f, b, delay_wgrad=True) == pytest.approx(0.5 + 1.0 + 3.5 + 3.0)
    # layer i of the forward pairs with layer n-1-i of the backward
    f2 = [MoeSlots(dispatch=1.0), MoeSlots(dispatch=0.0)]
    b2 = [MoeSlots(mlp=0.0), MoeSlots(mlp=1.0)]
    assert hidden_all_to_all(f2, b2, False) == pytest.approx(1.0)
    assert hidden_all_to_all(f2, list(reversed(b2)), False) == 0.0


def test_layer_slots_split_a_moe_pass() -> None:
    m = load_model_preset("deepseekv2").with_updates({"layer_num": 3})
    st = StrategyConfig.init_from_dict({"seq_len": 4096, "world_size": 8, "ep_size": 8, "micro_batch_num": 4,
                                         "moe_dispatcher_policy": "all2all"})
    est = Estimate(m, st, load_system("a100_pcie"))
    t = est.chunk_times[0]
    fwd = layer_slots(t.op_times, ("fwd",))
    bwd = layer_slots(t.op_times, ("recompute", "bwd_input", "bwd_weight"))
    assert len(fwd) == len(bwd) == m.layer_num - (m.dense_layers or 0)
    assert sum(s.dispatch + s.combine for s in fwd) == pytest.approx(t.fwd.comm["ep"])
    assert sum(s.dispatch + s.combine for s in bwd) == pytest.approx(t.bwd_input.comm["ep"] + t.recompute.comm.get("ep", 0.0))
    assert all(s.attn > 0 and s.mlp > 0 for s in fwd) and all(s.mlp_wgrad > 0 for s in bwd)
    assert not any(s.mlp_wgrad for s in fwd)


# ---- context parallelism as TransformerEngine runs it --------------------------------------
def _cp_est(cp_comm: str, **strategy) -> Estimate:
    m = _llama(hidden_size=8192, head_num=64, kv_head_num=8, intermediate_size=28672, layer_num=2)
    st = StrategyConfig.init_from_dict({"seq_len": 131072, "world_size": 8, "cp_size": 8, "cp_comm_type": cp_comm,
                                        "micro_batch_num": 2, **strategy})
    return Estimate(m, st, load_system("h100-sxm-80gb"))


def test_cp_a2a_moves_q_k_v_separately_and_saves_what_they_produce() -> None:
    """Llama3-70B, CP8, 128K: per rank 16384 tokens; q 8192 wide, k and v 1024 each (GQA)."""
    est = _cp_est("a2a")
    attn = _op(est, "L0.attn")
    s_local, bf16 = 16384, 2
    q, kv, out = s_local * 8192 * bf16, s_local * 1024 * bf16, s_local * 8192 * bf16
    fwd_a2a = [k.bytes for k in attn.fwd if isinstance(k, Collective)]
    bwd_a2a = [k.bytes for k in attn.bwd_input if isinstance(k, Collective)]
    assert fwd_a2a == [q, kv, kv, out]  # q, k, v to heads; the output back
    assert bwd_a2a == [out, out, q, kv, kv]  # O and dO to heads; dq, dk, dv back
    assert all(k.op == "all2all" and k.group == "cp" for k in attn.fwd + attn.bwd_input if isinstance(k, Collective))
    # a layout copy (read + write) before and after each all-to-all
    layout = [k.bytes for k in attn.fwd if isinstance(k, MemBound)]
    assert layout == [2 * q, 2 * q, 2 * kv, 2 * kv, 2 * kv, 2 * kv, 2 * out, 2 * out]
    # saved: the post-all-to-all q, k, v (each its own size), the output, the fp32 lse
    saved = dict(attn.saved)
    lse = 64 * s_local * 4
    assert sorted(saved.values()) == sorted([q, kv, kv, out, lse])
    assert "L0.qkv.out" not in saved  # v no longer keeps the fused QKV buffer
    # the ring (p2p) takes q, k, v made contiguous by TE: RoPE's q, k and a copy of v (a
    # strided view of the QKV buffer), which is what it keeps, not the buffer
    plain = _op(_cp_est("p2p"), "L0.attn")
    assert dict(plain.saved)["L0.v_contiguous"] == kv and "L0.qkv.out" not in dict(plain.saved)
    assert [k.bytes for k in plain.fwd if isinstance(k, MemBound) and k.name == "attn.contiguous"] == [2 * kv]


def test_cp_ring_hides_the_next_chunk_under_this_steps_attention() -> None:
    est = _cp_est("p2p")
    attn = _op(est, "L0.attn")
    kernels = attn.fwd
    steps = [k for k in kernels if isinstance(k, Attention)]
    sends = [k for k in kernels if isinstance(k, Collective)]
    assert len(steps) == 8 and len(sends) == 7
    assert steps[0].causal and steps[0].seq_len == 16384 and not steps[1].causal and steps[1].kv_seq_len == 8192
    assert sends[0].bytes == 2 * 16384 * 1024 * 2 and sends[0].op == "p2p"  # K and V of one step
    coster = est.layer_profiles.coster
    ph = coster.sequence(kernels)
    t_attn = [coster.kernel(k) for k in steps]
    t_send = coster.kernel(sends[0])
    t_mem = [coster.kernel(k) for k in kernels if isinstance(k, MemBound)]
    exposed = sum(max(0.0, t_send - a) for a in t_attn[:-1])  # each send under the step before it
    assert ph.comm.get("cp", 0.0) == pytest.approx(exposed, abs=1e-12)
    assert ph.total == pytest.approx(sum(t_attn) + exposed + sum(t_mem))


def test_cp_ring_elementwise_work_as_transformer_engine_does_it() -> None:
    """Llama3-70B, CP8, 128K, per rank 16384 tokens: Q and O 8192 wide, K and V 1024 each.
    Forward: cat(K, V) into the ring buffer (2 KV), per later step half of KV or of Q made
    contiguous ((KV + Q) / 2 on average), the output merge (2 O, then 2.25 O a step).
    Backward: KV into the ring buffer (2 KV), dQ and dKV first copies (2 (Q + KV)), per
    later step the halves of q, out, dout or KV ((KV + Q + 2 O) / 2) and the adds
    (2.25 (Q + KV))."""
    attn = _op(_cp_est("p2p"), "L0.attn")
    s_local, bf16, later = 16384, 2, 7
    q = out = s_local * 8192 * bf16
    kv = 2 * s_local * 1024 * bf16
    fwd = sum(k.bytes for k in attn.fwd if isinstance(k, MemBound) and ".cp_" in k.name)
    bwd = sum(k.bytes for k in attn.bwd_input if isinstance(k, MemBound) and ".cp_" in k.name)
    assert fwd == pytest.approx(2 * kv + later * (kv + q) / 2 + 2 * out + later * 2.25 * out)
    assert bwd == pytest.approx(2 * kv + 2 * (q + kv) + later * ((kv + q + 2 * out) / 2 + 2.25 * (q + kv)))
    # launches: cat, one copy a later step, the merge of cp partial outputs
    assert sum(k.launches for k in attn.fwd if isinstance(k, MemBound) and ".cp_" in k.name) == 1 + later + 8
    # the partial outputs live until the merge, beside the ring's two KV buffers
    assert attn.fwd_transient == pytest.approx(2 * kv + 8 * out)
    # none of it without CP
    plain = _op(_cp_est("p2p", cp_size=1), "L0.attn")
    assert not [k for k in plain.fwd + plain.bwd_input if isinstance(k, MemBound) and ".cp_" in k.name]


def test_cp_groups_across_nodes_use_the_inter_node_tier() -> None:
    inside = _cp_est("p2p")
    across = _cp_est("p2p", tp_size=2, world_size=16)
    assert inside.network.groups["cp"].intra_node and not across.network.groups["cp"].intra_node
    assert across.network.groups["cp"].tier == "inter_node"


# ---- TP overlap as userbuffers run it -------------------------------------------------------
from simumax.cost import userbuffers  # noqa: E402


def test_userbuffers_method_per_linear_and_phase() -> None:
    est = _est(_llama(), "h100-sxm-80gb", world_size=4, tp_size=4, enable_sequence_parallel=True, tp_comm_overlap=True)
    qkv, proj = _op(est, "L0.qkv"), _op(est, "L0.attn_proj")
    assert userbuffers.overlap_method(qkv.fwd) == "ring"  # all-gather feeding the GEMM
    assert userbuffers.overlap_method(proj.fwd) == "pipeline"  # GEMM feeding the reduce-scatter
    assert userbuffers.overlap_method(proj.bwd_input) == "ring"  # all-gather of dY feeding the dgrad GEMM
    assert userbuffers.overlap_method(qkv.bwd_input) == "bulk"  # re-gather and dgrad reduce-scatter beside it
    assert userbuffers.overlap_method(_op(est, "L0.attn_norm").fwd) is None


def test_userbuffers_times_by_hand() -> None:
    est = _est(_llama(), "h100-sxm-80gb", world_size=4, tp_size=4, enable_sequence_parallel=True, tp_comm_overlap=True)
    coster = est.layer_profiles.coster
    qkv, proj = _op(est, "L0.qkv"), _op(est, "L0.attn_proj")
    # ring exchange, tp = 4 (these transfers outlast a chunk GEMM: each chunk waits for its
    # rows, none run side by side): 3 steps of one transfer + the last chunk GEMM
    g = next(k for k in qkv.fwd if isinstance(k, Gemm))
    ag = sum(coster.kernel(k) for k in qkv.fwd if isinstance(k, Collective) and k.op == "all_gather")
    chunk = coster.kernel(Gemm(g.m // 4, g.k, g.n, g.layout))
    assert ag / 3 > chunk
    ph = coster.sequence(qkv.fwd)
    others = sum(coster.kernel(k) for k in qkv.fwd if not isinstance(k, (Gemm, Collective)))
    assert ph.total == pytest.approx(3 * ag / 3 + chunk + others)
    # pipeline, 4 splits on 132 - 16 SMs, three side by side then the fourth, each split's
    # reduce-scatter after its round (cost/userbuffers.py: by hand in the test below)
    g2 = next(k for k in proj.fwd if isinstance(k, Gemm))
    rs = sum(coster.kernel(k) for k in proj.fwd if isinstance(k, Collective))
    three = coster.kernel(Gemm(3 * g2.m // 4, g2.k, g2.n, g2.layout)) * 132 / 116
    one = coster.kernel(Gemm(g2.m // 4, g2.k, g2.n, g2.layout)) * 132 / 116
    ph2 = coster.sequence(proj.fwd)
    total = max(three + 3 * rs / 4, three + one) + rs / 4
    assert ph2.total == pytest.approx(total)
    assert ph2.comm["tp"] == pytest.approx(total - three - one)
    # bulk (the column-parallel backward): its GEMMs planned for 132 - 16 SMs (TE's
    # set_sm_margin), the input re-gather and gradient reduce-scatter under them
    gemms = sum(coster.kernel(k) for k in qkv.bwd_input if isinstance(k, Gemm))
    tp = sum(coster.kernel(k) for k in qkv.bwd_input if isinstance(k, Collective) and k.group == "tp")
    rest = sum(coster.kernel(k) for k in qkv.bwd_input if not isinstance(k, Gemm) and not (isinstance(k, Collective) and k.group == "tp"))
    ph3 = coster.sequence(qkv.bwd_input)
    assert tp > 0 and ph3.total == pytest.approx(rest + max(gemms * 132 / 116, tp))
    assert ph3.comm.get("tp", 0.0) == pytest.approx(max(0.0, tp - gemms * 132 / 116))
    # the output layer is Megatron's ColumnParallelLinear, not a TE linear: its collectives
    # stay off userbuffers, the forward all-gather exposed as without tp_comm_overlap
    head = _op(est, "lm_head")
    assert not head.weight_shapes and userbuffers.overlap_method(head.fwd) == "ring"
    times = coster.op(head)
    assert times["fwd"].total == pytest.approx(sum(coster.kernel(k) for k in head.fwd))
    assert times["fwd"].comm["tp"] == pytest.approx(sum(coster.kernel(k) for k in head.fwd if isinstance(k, Collective)))


def test_userbuffers_chunks_share_te_streams_by_hand() -> None:
    """TE runs the chunk GEMMs round-robin on three compute streams (_NUM_MAX_UB_STREAMS):
    chunks whose rows are there run side by side, j of them sharing the SMs as one GEMM of
    their rows does (each finishes its part in that GEMM's time)."""
    g = Gemm(4096, 8192, 8192, "TN")
    cost = {1024: 1.0, 2048: 1.6, 3072: 2.1, 4096: 2.6}  # seconds by rows: small chunks fill the SMs worse
    time_of = lambda k: cost[k.m]  # noqa: E731
    # rows there at once (no transfer time): tp 3 runs its three chunks together
    assert userbuffers.ring_time(g._replace(m=3072), 0.0, 3, time_of) == pytest.approx((2.1, 0.0))
    # tp 4: chunks 0-2 together, chunk 3 on stream 0 after chunk 0
    assert userbuffers.ring_time(g, 0.0, 4, time_of) == pytest.approx((2.1 + 1.0, 0.0))
    # rows slower than a chunk (step 1.5): every chunk waits for its rows and runs alone
    assert userbuffers.ring_time(g, 3 * 1.5, 4, time_of) == pytest.approx((3 * 1.5 + 1.0, 3 * 1.5 + 1.0 - 4 * 1.0))
    # tp 2, step 0.5: chunk 0 alone to 0.5 (half done), both at 1/1.6 a second until chunk 0
    # ends at 1.3 (chunk 1 half done), chunk 1 alone to 1.8
    assert userbuffers.ring_time(g._replace(m=2048), 0.5, 2, time_of) == pytest.approx((1.8, 0.0))
    # step 0.1: chunk 0 alone to 0.1, with chunk 1 to 0.2, the three until chunk 0 ends at
    # 0.2 + 0.8375 x 2.1; chunk 3 starts then (stream 0), chunk 1 ends 0.21 later, chunk 2
    # 0.1 after that (two running), chunk 3's last 0.8375 alone
    assert userbuffers.ring_time(g, 3 * 0.1, 4, time_of) == pytest.approx((1.95875 + 0.21 + 0.1 + 0.8375, 0.0))
    # pipeline, 4 splits: three together (2.1), then the fourth (1.0); each split's quarter of
    # the reduce-scatter (0.5 each) after its round on one stream: 2.1 + 3 x 0.5, then the last
    total, exposed = userbuffers.pipeline_time(g, 4 * 0.5, None, time_of)
    assert (total, exposed) == pytest.approx((2.1 + 1.5 + 0.5, 2.1 + 1.5 + 0.5 - 3.1))
    # a short reduce-scatter hides under the fourth split but its own quarter
    total, exposed = userbuffers.pipeline_time(g, 4 * 0.1, None, time_of)
    assert (total, exposed) == pytest.approx((2.1 + 1.0 + 0.1, 0.1))
    # on the SMs a 16-SM communication kernel leaves: every split x 132 / 116
    total, _ = userbuffers.pipeline_time(g, 4 * 0.1, 132, time_of)
    assert total == pytest.approx((2.1 + 1.0) * 132 / 116 + 0.1)


@settings(max_examples=200, deadline=None)
@given(hs.lists(hs.floats(0.0, 5.0), min_size=1, max_size=9), hs.integers(1, 4),
       hs.lists(hs.floats(0.0, 1.0), min_size=8, max_size=8))
def test_shared_streams_invariants(gaps: list[float], streams: int, growth: list[float]) -> None:
    """Chunks ready at non-decreasing times on round-robin streams, j running together each
    taking together(j) (from a lone chunk's t1 up to j lone chunks' time, never less than
    j - 1 together): the last ends at least t1 after its rows and at most n·t1 after them
    (something always runs once all are ready), no sooner than all the work at the best
    sharing rate; the idle time is waiting for rows only; one stream is the chunks one by one."""
    from simumax.cost.userbuffers import shared_streams

    n, t1 = len(gaps), 1.0
    ready = [sum(gaps[1:i + 1]) for i in range(n)]  # chunk 0 at 0
    together = [t1]
    for j in range(2, 10):  # nondecreasing, at most j lone chunks
        together.append(together[-1] + growth[j - 2] * (j * t1 - together[-1]))
    done, idle = shared_streams(ready, streams, lambda j: together[j - 1])
    end = max(done)
    assert end >= ready[-1] + t1 - 1e-9
    assert end <= ready[-1] + n * t1 + 1e-9
    assert end >= n / max(j / together[j - 1] for j in range(1, min(n, streams) + 1)) - 1e-9
    assert -1e-12 <= idle <= ready[-1] + 1e-9
    serial = 0.0
    for r in ready:
        serial = max(serial, r) + t1
    assert max(shared_streams(ready, 1, lambda j: together[j - 1])[0]) == pytest.approx(serial)


def test_cp_all_gather_gathers_reorders_and_reduce_scatters() -> None:
    est = _cp_est("all_gather")
    attn = _op(est, "L0.attn")
    kv_local = 2 * 16384 * 1024 * 2  # K and V of one rank
    gathered = 8 * kv_local
    assert [k.bytes for k in attn.fwd if isinstance(k, Collective)] == [gathered]
    assert [(k.op, k.bytes) for k in attn.bwd_input if isinstance(k, Collective)] == [("all_gather", gathered), ("reduce_scatter", gathered)]
    v_copy = 2 * 16384 * 1024 * 2  # TE's contiguous copy of v (RoPE made q and k new)
    assert [k.bytes for k in attn.fwd if isinstance(k, MemBound)] == [v_copy, 2 * gathered, 2 * 16384 * 8192 * 2]
    assert [k.bytes for k in attn.bwd_input if isinstance(k, MemBound)] == [2 * gathered, 2 * gathered]


def test_fp8_gemms_derived_from_bf16_shapes_count_as_default() -> None:
    """On a preset whose bf16 GEMMs were measured, an fp8 GEMM of the same shape still runs
    at a low-precision rate nobody measured there: its source is 'default' (uncertainty.py)."""
    from simumax.config.loader import load_model, load_strategy

    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"fp8": True})
    cost = Estimate(load_model("llama3-8b").with_updates({"layer_num": 2}), st, load_system("h100-sxm-80gb")).cost()
    sources = cost.efficiency_lookups["sources"]
    assert sources["fp8_matmul"]["default"] > 0
    assert sources["fp8_matmul"]["measured"] == sources["fp8_matmul"]["fitted"] == 0
    assert sources["matmul"]["measured"] > 0  # the bf16 LM head's shape is in the H100 table


# ---- q, k, v between the QKV GEMM and attention (Megatron-Core split, TE layouts) ---------
def _names(ops) -> list[str]:
    return [o.name for o in ops]


def test_gqa_rope_layer_reshapes_q_copies_v_and_concatenates_the_gradients() -> None:
    """Llama-like GQA (16 heads, 4 KV heads, head_dim 64) with RoPE and TE flash attention,
    2 x 2048 tokens: Megatron-Core's reshape of the split q copies it (2 Q); TE copies the
    strided v beside RoPE's contiguous q, k (2 V) and keeps the copy, not the QKV buffer;
    backward concatenates dq, dk, dv into the QKV gradient (2 (Q + K + V))."""
    est = _est(_llama(), system="h100-sxm-80gb")
    tokens, bf16 = 2 * 2048, 2
    q, kv = tokens * 1024 * bf16, tokens * 256 * bf16
    split = _op(est, "L0.qkv_split")
    assert [k.bytes for k in split.fwd] == [2 * q]
    assert [k.bytes for k in split.bwd_input] == [2 * (q + 2 * kv)]
    attn = _op(est, "L0.attn")
    assert [k.bytes for k in attn.fwd if isinstance(k, MemBound)] == [2 * kv]
    saved = dict(attn.saved)
    assert saved["L0.v_contiguous"] == kv and "L0.qkv.out" not in saved
    assert ("L0.v_contiguous", kv) in attn.also_outputs


def test_mha_without_rope_on_te_flash_keeps_views_and_needs_no_copy() -> None:
    """GPT-style MHA, learned positions, TE flash attention: q, k, v are views of the QKV
    output in TE's sbh3d layout, so nothing is copied, the gradients come back as views of
    one buffer (``_SplitAlongDim``'s no-op) and attention keeps the QKV buffer."""
    est = _est(_gpt(), system="h100-sxm-80gb")
    assert "L0.qkv_split" not in _names(est.chunks[0].ops)
    attn = _op(est, "L0.attn")
    assert not [k for k in attn.fwd if isinstance(k, MemBound)]
    assert "L0.qkv.out" in dict(attn.saved)


def test_unfused_attention_concatenates_its_separate_gradients() -> None:
    """The math path's dq, dk, dv come from separate GEMMs: the split's backward is a cat."""
    est = _est(_gpt(), use_math_sdp=True, use_flash_sdp=False)
    split = _op(est, "L0.qkv_split")
    tokens = 2 * 2048
    assert not split.fwd and [k.bytes for k in split.bwd_input] == [2 * tokens * 3 * 1024 * 2]
