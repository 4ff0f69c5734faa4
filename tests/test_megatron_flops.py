"""The TFLOP/s Megatron-LM's log prints (report/megatron_flops.py) against Megatron-LM 0.19's
own ``num_floating_point_operations``, given the flags the exporter writes for each model (its
own parser reads them; the fields ``validate_args`` derives are set as it sets them)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags, model_flags
from simumax.report.megatron_flops import megatron_logged_flops


CASES = {
    "llama-gqa-swiglu": ("llama3.1-8b", {}, {}),
    "gpt-mha-bias-learned": ("gpt3-175b", {"tp_size": 8, "pp_size": 4, "world_size": 32}, {"layer_num": 8}),
    "qwen-qk-norm": ("qwen3-8b", {}, {}),
    "mixtral-moe": ("mixtral-8x7b", {"ep_size": 8}, {}),
    "deepseek-mla-moe-shared-dense-first": ("deepseek-v3", {"ep_size": 8}, {"layer_num": 6}),
    "deepseek-mla-full-rank-q": ("deepseek-v2-lite", {"ep_size": 8}, {}),
    "mtp-moe": ("deepseek-v3-mtp", {"ep_size": 8}, {"layer_num": 6}),
    "latent-moe": ("qwen3-30b-a3b", {"ep_size": 8}, {"layer_num": 4, "moe_latent_size": 1024}),
    "output-gate": ("llama3.1-8b", {}, {"attention_output_gate": True}),
    "gated-deltanet": ("qwen3-next-80b-a3b", {"ep_size": 8}, {"layer_num": 8}),
    "hybrid-mamba": ("nemotron-h-8b", {}, {}),
    "hybrid-moe-gdn-mtp": ("qwen3-30b-a3b", {"ep_size": 8, "pp_size": 2, "world_size": 16},
                           {"layer_num": 4, "hybrid_layer_pattern": "M*|GE/*E/*E"}),
    "packed-documents": ("llama3.1-8b", {"document_lengths": [2048, 1024, 1024]}, {}),
    # DeepSeek sparse attention: Megatron counts its layers as dense MLA, and a hybrid stack's
    # + (MLA) and D (DSA) blocks not at all
    "dsa-index-share": ("deepseek-v3.2", {"ep_size": 8, "dsa_kernel_backend": "tilelang"},
                        {"layer_num": 6, "dsa_indexer_topk_freq": 2}),
    "hybrid-mla-dsa": ("deepseek-v3.2", {"ep_size": 8, "dsa_kernel_backend": "tilelang"},
                       {"layer_num": 6, "dense_layers": 0, "hybrid_layer_pattern": "MD-DME", "mamba_num_heads": 112}),
    "hybrid-mla": ("deepseek-v3", {"ep_size": 8}, {"layer_num": 5, "dense_layers": 0, "hybrid_layer_pattern": "M+M-E",
                                                   "mamba_num_heads": 112}),
}


def _megatron_args(parser: argparse.ArgumentParser, m, st):
    args, rest = parser.parse_known_args(shlex.split(" ".join(model_flags(m) + megatron_flags(st, m))))
    assert not rest, rest
    # what megatron.training.arguments.validate_args derives before training
    if args.kv_channels is None:
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if args.num_query_groups is None or not args.group_query_attention:
        args.num_query_groups = args.num_attention_heads
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    args.padded_vocab_size = m.padded_vocab(st.tp_size)
    return args


@pytest.mark.parametrize("name", list(CASES))
def test_flops_as_megatron_counts_them(megatron_training, name: str) -> None:
    parser, num_floating_point_operations = megatron_training.parser, megatron_training.num_floating_point_operations
    model, upd, model_upd = CASES[name]
    m = load_model(model).with_updates(model_upd) if model_upd else load_model(model)
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 4096, **upd})
    args = _megatron_args(parser, m, st)
    docs = st.document_lengths
    kw = {}
    if docs:  # Megatron's THD path passes the real sums
        kw = dict(seqlen_squared_sum_in_batch=st.global_batch_size * sum(x * x for x in docs),
                  total_real_tokens_in_batch=st.global_batch_size * st.seq_len)
    theirs = num_floating_point_operations(args, st.global_batch_size, **kw)
    ours = megatron_logged_flops(m, st)
    print(f"{name}: {ours:.6e} FLOPs per iteration (Megatron {theirs:.6e})")
    assert ours == pytest.approx(theirs, rel=1e-12)


def test_perf_reports_it_over_the_predicted_time() -> None:
    """tflops_per_gpu_megatron = those FLOPs / (iteration time x GPUs); on a dense causal model
    it is the model's own FLOP rate (Megatron halves causal attention as the package does)."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 4})
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 4096})
    cost = Estimate(m, st, load_system("h100-sxm-80gb")).cost(band=False)
    expected = megatron_logged_flops(m, st) / (cost.duration_time_per_iter * st.world_size) / 1e12
    assert cost.tflops_per_gpu_megatron == pytest.approx(expected, rel=1e-12)
    assert cost.tflops_per_gpu_megatron == pytest.approx(cost.tflops_per_gpu, rel=0.01)


def test_random_models_count_as_megatron_does(megatron_training) -> None:
    """Random dense and MoE transformers (GQA, SwiGLU or GeLU, MoE frequency, shared experts,
    MTP, the output gate, packed documents) give Megatron's own count."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    parser, count = megatron_training.parser, megatron_training.num_floating_point_operations

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(heads=hs.sampled_from([4, 8, 16]), kv=hs.sampled_from([1, 2, 4]), head=hs.sampled_from([32, 64, 128]),
           layers=hs.integers(2, 6), ffn=hs.sampled_from([512, 1024, 2816]), swiglu=hs.booleans(),
           experts=hs.sampled_from([0, 4, 8]), topk=hs.sampled_from([1, 2]), shared=hs.sampled_from([0, 256]),
           freq=hs.sampled_from([1, 2]), mtp=hs.sampled_from([0, 1]), gate=hs.booleans(), docs=hs.booleans())
    def check(heads, kv, head, layers, ffn, swiglu, experts, topk, shared, freq, mtp, gate, docs):
        h = heads * head
        fields = {"hidden_size": h, "head_num": heads, "kv_head_num": min(kv, heads), "head_size": head, "layer_num": layers,
                  "intermediate_size": ffn, "use_swiglu": swiglu, "vocab_size": 32000, "attention_output_gate": gate,
                  "mtp_num_layers": mtp, "model_type": "dense", "expert_num": None}
        if experts:
            fields.update(model_type="moe", expert_num=experts, topk=topk, moe_ffn_hidden_size=ffn // 2,
                          moe_shared_expert_intermediate_size=shared or None, moe_layer_freq=freq)
        m = load_model("llama3.1-8b").with_updates(fields)
        upd = {"seq_len": 2048, **({"ep_size": 8 if experts == 8 else 4} if experts else {})}
        if docs:
            upd["document_lengths"] = [1024, 512, 512]
        st = load_strategy("tp1_pp1_dp8_mbs1").with_updates(upd)
        args = _megatron_args(parser, m, st)
        kw = {}
        if docs:
            kw = dict(seqlen_squared_sum_in_batch=st.global_batch_size * (1024**2 + 2 * 512**2),
                      total_real_tokens_in_batch=st.global_batch_size * st.seq_len)
        assert megatron_logged_flops(m, st) == pytest.approx(count(args, st.global_batch_size, **kw), rel=1e-12)

    check()
