"""The exported Megatron-LM flags are Megatron-LM 0.19's: its own argument parser
(megatron.training.arguments, shipped in the megatron-core wheel) reads every flag set the
exporter writes and gets back the sizes and options we estimated; and the importer reads a
command line with that version's defaults (P2P overlap on in the interleaved schedule, off in
1F1B; a CPU-offload layer count turns offload on)."""

from __future__ import annotations

import argparse
import shlex

import pytest

from simumax.config.loader import load_model, load_strategy
from simumax.errors import ConfigError
from simumax.export.megatron_flags import megatron_flags, model_flags
from simumax.importers.megatron_args import parse_megatron_args


@pytest.fixture(scope="module")
def megatron_parser(megatron_training) -> argparse.ArgumentParser:
    return megatron_training.parser


CASES = {
    "gpt-bias-learned-positions": ("gpt3-175b", {"tp_size": 8, "pp_size": 4, "world_size": 32, "interleaving_size": 2,
                                                 "micro_batch_num": 8, "enable_sequence_parallel": True}, {"add_bias_linear": True}),
    "interleaved-blocking-p2p": ("llama3.1-8b", {"pp_size": 4, "world_size": 8, "interleaving_size": 2, "micro_batch_num": 8,
                                                 "overlap_p2p_comm": False, "microbatch_group_size_per_vp_stage": 8}, {}),
    "interleaved-overlapped-p2p": ("llama3.1-8b", {"pp_size": 4, "world_size": 8, "interleaving_size": 2, "micro_batch_num": 8,
                                                   "overlap_p2p_comm": True, "overlap_grad_reduce": True,
                                                   "overlap_param_gather": True, "zero_state": 1}, {}),
    "layer-offload": ("llama3.1-8b", {"pp_size": 1, "world_size": 8, "cpu_offloading": True, "cpu_offloading_num_layers": 4}, {}),
    "precision-aware-optimizer": ("llama3.1-8b", {"pp_size": 1, "world_size": 8, "zero_state": 1, "use_precision_aware_optimizer": True,
                                                  "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, {}),
    "fp8-cp-recompute": ("llama3.1-70b", {"tp_size": 4, "pp_size": 2, "cp_size": 2, "world_size": 16, "seq_len": 8192,
                                          "enable_sequence_parallel": True, "fp8": True, "fp8_recipe": "blockwise",
                                          "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 2,
                                          "tp_comm_overlap": True}, {}),
    "moe-mla-flex": ("deepseek-v3", {"pp_size": 1, "ep_size": 8, "world_size": 8, "moe_dispatcher_policy": "flex",
                                     "overlap_moe_expert_parallel_comm": True}, {"layer_num": 4}),
    "gpt-oss-sliding-window-sinks": ("gpt-oss-20b", {"pp_size": 1, "ep_size": 8, "world_size": 8}, {"layer_num": 4}),
    "megatron-fsdp": ("llama3.1-8b", {"pp_size": 1, "world_size": 8, "zero_state": 3, "overlap_grad_reduce": True,
                                      "overlap_param_gather": True}, {}),
    "torch-fsdp2": ("llama3.1-8b", {"pp_size": 1, "world_size": 8, "zero_state": 3, "fsdp_impl": "megatron_torch_fsdp2",
                                   "gradient_accumulation_fusion": False}, {}),
    "fp8-bf16-wgrad": ("llama3.1-8b", {"pp_size": 1, "world_size": 8, "fp8": True, "fp8_wgrad": False}, {}),
    "qkv-bias": ("qwen2.5-7b", {"pp_size": 1, "tp_size": 4, "world_size": 8, "enable_sequence_parallel": True}, {}),
    "moe-shared-expert-gate": ("deepseek-v2-lite", {"pp_size": 1, "ep_size": 8, "world_size": 8},
                               {"layer_num": 4, "moe_shared_expert_gate": True}),
    "hybrid-mamba": ("llama3.1-8b", {"pp_size": 2, "tp_size": 2, "world_size": 8, "enable_sequence_parallel": True},
                     {"layer_num": 8, "hybrid_layer_pattern": "-M-M*M-M", "mamba_num_heads": 64}),  # an MLP first: "="
    "gated-deltanet": ("qwen3-30b-a3b", {"pp_size": 1, "ep_size": 8, "world_size": 8, "megatron_recompute": True,
                                         "megatron_recompute_modules": ["gdn_norm_out"]},
                       {"layer_num": 8, "experimental_attention_variant": "gated_delta_net", "linear_attention_freq": 4,
                        "attention_output_gate": True, "linear_num_key_heads": 8}),
    "gated-deltanet-list": ("llama3.1-8b", {"pp_size": 1, "world_size": 8},
                            {"layer_num": 4, "experimental_attention_variant": "gated_delta_net",
                             "linear_attention_freq": [0, 1, 1, 0]}),
    "hybrid-gdn": ("llama3.1-8b", {"pp_size": 1, "world_size": 8}, {"layer_num": 6, "hybrid_layer_pattern": "G-G*M-"}),
    "hybrid-mtp": ("qwen3-30b-a3b", {"pp_size": 2, "ep_size": 8, "world_size": 16},
                   {"layer_num": 4, "hybrid_layer_pattern": "M*|ME/*E/*E"}),
    "dsa-index-share": ("deepseek-v3.2", {"pp_size": 2, "ep_size": 8, "world_size": 16, "dsa_kernel_backend": "tilelang"},
                        {"layer_num": 4, "dsa_indexer_topk_freq": 2, "dsa_indexer_rotate_activation": False,
                         "dsa_indexer_loss_coeff": 0.001, "dsa_indexer_use_sparse_loss": True}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_019_parses_every_exported_flag(megatron_parser: argparse.ArgumentParser, name: str) -> None:
    model_name, upd, model_upd = CASES[name]
    m = load_model(model_name).with_updates(model_upd) if model_upd else load_model(model_name)
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(upd)
    tokens = shlex.split(" ".join(model_flags(m) + megatron_flags(st, m)))
    args, rest = megatron_parser.parse_known_args(tokens)
    assert not rest, f"Megatron-LM 0.19 does not know {rest}"
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size) == (
        st.tp_size, st.pp_size, st.cp_size)
    assert (args.micro_batch_size, args.global_batch_size, args.seq_length) == (st.micro_batch_size, st.global_batch_size, st.seq_len)
    assert (args.num_layers, args.hidden_size, args.add_bias_linear) == (m.layer_num, m.hidden_size, m.add_bias_linear)
    assert args.sequence_parallel == st.sp
    assert (args.overlap_grad_reduce, args.overlap_param_gather) == (st.overlap_grad_reduce, st.overlap_param_gather)
    if st.schedule == "interleaved":  # Megatron turns P2P overlap off for 1F1B itself
        assert args.overlap_p2p_comm == st.p2p_overlapped
    assert args.cpu_offloading_num_layers == (st.cpu_offloading_num_layers if st.cpu_offloading else 0)
    assert args.microbatch_group_size_per_vp_stage == st.microbatch_group_size_per_vp_stage
    # a sliding window as TransformerEngine's (left, right), keys i - left .. i
    assert args.window_size == (None if m.window_size is None else (m.window_size - 1, 0))
    assert args.window_attn_skip_freq == m.window_attn_skip_freq
    assert args.softmax_type == ("learnable" if m.attention_sinks else "vanilla")
    assert args.fp8_wgrad == st.fp8_wgrad
    assert args.moe_shared_expert_gate == m.moe_shared_expert_gate
    assert args.add_qkv_bias == (m.add_qkv_bias and not m.add_bias_linear)  # biases everywhere include the QKV's
    # and the importer reads them back as they were
    m2, s2, _ = parse_megatron_args(tokens, world_size=st.world_size)
    assert (s2.p2p_overlapped, s2.cpu_offloading, m2.add_bias_linear) == (st.p2p_overlapped and st.pp_size > 1,
                                                                         st.cpu_offloading, m.add_bias_linear)
    assert s2.microbatch_group_size_per_vp_stage == st.microbatch_group_size_per_vp_stage
    assert s2.fp8_wgrad == st.fp8_wgrad and m2.moe_shared_expert_gate == m.moe_shared_expert_gate
    assert m2.add_qkv_bias == (m.add_qkv_bias and not m.add_bias_linear)
    assert args.hybrid_layer_pattern == m.hybrid_layer_pattern and m2.hybrid_layer_pattern == m.hybrid_layer_pattern
    assert (args.mamba_num_heads, m2.mamba_heads, m2.mamba_state_dim) == (m.mamba_num_heads, m.mamba_heads, m.mamba_state_dim)
    # Gated DeltaNet: the variant, its layer pattern and sizes both ways
    assert args.experimental_attention_variant == m.experimental_attention_variant == m2.experimental_attention_variant
    assert args.linear_attention_freq == m.linear_attention_freq == m2.linear_attention_freq
    assert (args.linear_num_key_heads, args.linear_num_value_heads) == (m.linear_num_key_heads, m.linear_num_value_heads)
    assert (m2.linear_num_key_heads, m2.linear_key_head_dim) == (m.linear_num_key_heads, m.linear_key_head_dim)
    assert args.recompute_modules == (st.megatron_recompute_modules if st.megatron_recompute else args.recompute_modules)
    assert (args.mtp_num_layers or 0) == m.mtp_num_layers == m2.mtp_num_layers and m2.layer_num == m.layer_num
    # DeepSeek sparse attention: the indexer's sizes, index sharing and the kernels both ways
    for field in ("dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk", "dsa_indexer_topk_freq",
                  "dsa_indexer_rotate_activation", "dsa_indexer_loss_coeff", "dsa_indexer_use_sparse_loss"):
        assert getattr(args, field) == getattr(m, field) == getattr(m2, field), field
    assert args.dsa_kernel_backend == s2.dsa_kernel_backend == (st.dsa_kernel_backend if m.experimental_attention_variant
                                                                 else "none")


@pytest.fixture(scope="module")
def megatron_validate(megatron_training):
    """Megatron-LM 0.19's ``validate_args`` on CPU: its device queries (the GPU architecture,
    for CUDA_DEVICE_MAX_CONNECTIONS advice and grouped GEMM) answer Hopper, its
    TransformerEngine version checks the job's ``te_version`` (a recent TE when it names
    none), and its argument printout is swallowed."""
    import contextlib
    import io

    import megatron.training.arguments as arguments
    from packaging.version import Version

    patch = pytest.MonkeyPatch()
    patch.setattr(arguments, "get_device_arch_version", lambda: 9)
    patch.setattr(arguments.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    patch.setenv("NVTE_CPU_OFFLOAD_V1", "1")  # fine-grained offload under TE >= 2.10 asks for it
    te = {"version": None}
    patch.setattr(arguments, "is_te_min_version", lambda v, check_equality=True: te["version"] is None or (
        Version(te["version"]) >= Version(v) if check_equality else Version(te["version"]) > Version(v)))

    def validate(tokens: list[str], world_size: int, te_version: str | None = None) -> argparse.Namespace:
        args, rest = megatron_training.parser.parse_known_args(tokens)
        assert not rest, rest
        args.world_size, args.rank = world_size, 0
        te["version"] = te_version
        with contextlib.redirect_stdout(io.StringIO()):
            arguments.validate_args(args)
        return args
    yield validate
    patch.undo()


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_019_validates_every_exported_job(megatron_validate, monkeypatch, name: str) -> None:
    """Megatron-LM's own start-up checks (``validate_args``) accept every exported job: the
    flags name a configuration Megatron runs, not only flags it parses."""
    model_name, upd, model_upd = CASES[name]
    m = load_model(model_name).with_updates(model_upd) if model_upd else load_model(model_name)
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(upd)
    # Megatron asks for one connection with TP / CP / SP overlap, more with its FSDPs
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8" if st.zero_state >= 2 else "1")
    args = megatron_validate(shlex.split(" ".join(model_flags(m, st.seq_len) + megatron_flags(st, m))), st.world_size,
                             st.te_version)
    assert (args.data_parallel_size, args.virtual_pipeline_model_parallel_size or 1) == (
        st.dp_size, st.interleaving_size if model_upd.get("hybrid_layer_pattern") is None else args.virtual_pipeline_model_parallel_size or 1)


def test_import_takes_megatron_019_defaults() -> None:
    """No P2P flag: overlapped with interleaving (said in a note), blocking in 1F1B even when
    the older --overlap-p2p-communication asks (Megatron turns it off there)."""
    base = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
            "--vocab-size 32000 --pipeline-model-parallel-size 4 --global-batch-size 8")
    _, s, notes = parse_megatron_args(base + " --num-layers-per-virtual-pipeline-stage 1", world_size=4)
    assert s.interleaving_size == 2 and s.overlap_p2p_comm and any("P2P overlap" in n for n in notes)
    _, s, _ = parse_megatron_args(base + " --num-layers-per-virtual-pipeline-stage 1 --no-overlap-p2p-communication", world_size=4)
    assert not s.overlap_p2p_comm
    _, s, notes = parse_megatron_args(base + " --overlap-p2p-communication", world_size=4)
    assert not s.overlap_p2p_comm and any("turns it off" in n for n in notes)
    _, s, _ = parse_megatron_args(base.replace("parallel-size 4", "parallel-size 1") + " --cpu-offloading-num-layers 2", world_size=1)
    assert s.cpu_offloading and s.cpu_offloading_num_layers == 2


def test_export_refuses_what_megatron_019_cannot_run() -> None:
    m = load_model("llama3.1-8b")
    with pytest.raises(ConfigError) as exc:
        megatron_flags(load_strategy("tp1_pp2_dp4_mbs1").with_updates({"overlap_p2p_comm": True}), m)
    assert exc.value.field == "overlap_p2p_comm"
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"use_precision_aware_optimizer": True, "store_param_remainders": False})
    with pytest.raises(ConfigError) as exc:
        megatron_flags(st, m)
    assert exc.value.field == "store_param_remainders"
    for sched in ("zb", "dualpipev"):  # Megatron-LM has neither: its flags would run 1F1B
        with pytest.raises(ConfigError) as exc:
            megatron_flags(load_strategy("tp1_pp2_dp4_mbs1").with_updates({"pp_schedule": sched}), m)
        assert exc.value.field == "pp_schedule"


def _known(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def test_importer_tables_name_megatron_019_flags(megatron_parser: argparse.ArgumentParser) -> None:
    """Every flag the importer reads is one Megatron-LM 0.19 has, or an older one it says so
    of (OLDER_FLAGS, OLDER_NO_EFFECT; NOT_MODELLED keeps older spellings of the align / gc /
    saved-activation options and TE 1.x's weight offload too)."""
    from simumax.config.megatron_names import OLDER_FLAGS, SWITCHES, VALUED
    from simumax.importers.megatron_flag_tables import NO_EFFECT, NOT_MODELLED, OLDER_NO_EFFECT

    known = _known(megatron_parser)
    assert sorted(f for f in [*VALUED, *SWITCHES] if f not in known) == sorted(OLDER_FLAGS)
    assert sorted(f for f in NO_EFFECT if f not in known) == []
    # each no-effect family names 0.19 flags, none of which the importer reads or says is not modelled
    from simumax.importers.megatron_flag_tables import NO_EFFECT_FAMILIES

    read = {*VALUED, *SWITCHES, *NOT_MODELLED}
    assert all(any(f.startswith(p) for f in known) for p in NO_EFFECT_FAMILIES)
    assert sorted(f for f in known if f.startswith(NO_EFFECT_FAMILIES) and f in read) == []
    assert all(f not in known for f in OLDER_NO_EFFECT)
    assert sorted(f for f in NOT_MODELLED if f not in known) == ["--align-grad-reduce", "--align-param-gather",
                                                                 "--cpu-offloading-weights",
                                                                 "--distribute-checkpointed-activations", "--manual-gc-eval"]


def test_importer_defaults_are_megatron_019s(megatron_parser: argparse.ArgumentParser) -> None:
    """A flag left out means what Megatron-LM 0.19's parser defaults it to."""
    from simumax.importers.megatron_flag_tables import MEGATRON_DEFAULTS

    d = megatron_parser.parse_args([])
    ours = {flag: value for flag, _, value, _ in MEGATRON_DEFAULTS}
    assert ours["--normalization"] == d.normalization.lower()
    assert ours["--position-embedding-type"] == d.position_embedding_type
    assert ours["--disable-bias-linear"] == d.add_bias_linear
    assert ours["--untie-embeddings-and-output-weights"] == d.untie_embeddings_and_output_weights
    assert (d.attention_dropout, d.hidden_dropout, d.overlap_p2p_comm, d.moe_token_dispatcher_type) == (0.1, 0.1, True, "allgather")
    m, s, _ = parse_megatron_args("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
                                  "--vocab-size 32000 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512", world_size=1)
    assert s.enable_dropout and s.moe_dispatcher_policy == "all_gather" and m.norm_type == "layernorm"


def test_megatron_019_parses_the_flags_of_random_strategies(megatron_parser: argparse.ArgumentParser, megatron_validate) -> None:
    """Hypothesis over layouts and options: whatever the exporter writes (it may refuse, with
    a ConfigError naming the field), Megatron-LM 0.19's parser knows every flag and reads
    the parallel sizes and overlap options back, and its ``validate_args`` accepts the job."""
    import os

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    models = {name: load_model(name).with_updates({"layer_num": 8}) for name in ("gpt3-175b", "llama3.1-8b", "qwen3-30b-a3b")}
    options = ("overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm", "overlap_p2p_comm_warmup_flush",
               "tp_comm_overlap", "cpu_offloading",
               "optimizer_cpu_offload", "delay_wgrad_compute", "defer_embedding_wgrad_compute", "nccl_ub", "fp8",
               "use_precision_aware_optimizer", "enable_recompute", "overlap_moe_expert_parallel_comm")

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(hs.sampled_from(sorted(models)), hs.sampled_from([1, 2, 4]), hs.sampled_from([1, 2, 4]), hs.sampled_from([1, 2]),
           hs.sampled_from([0, 1, 2, 3]), hs.fixed_dictionaries({k: hs.booleans() for k in options}),
           hs.sampled_from(["all2all", "all_gather", "flex"]), hs.sampled_from([None, "2.7", "2.11.0"]))
    def check(name, tp, pp, vp, zero, opts, dispatcher, te_version) -> None:
        m = models[name]
        # the options' own rules (each refused otherwise, and covered by its tests): keep the draws legal
        opts["overlap_moe_expert_parallel_comm"] &= m.is_moe and pp == 1 and not opts["enable_recompute"]
        opts["delay_wgrad_compute"] &= opts["overlap_moe_expert_parallel_comm"]
        opts["cpu_offloading"] &= pp == 1 and not opts["enable_recompute"]
        opts["optimizer_cpu_offload"] &= zero == 1
        opts["use_precision_aware_optimizer"] |= opts["optimizer_cpu_offload"]  # Megatron offloads only on its path
        d = {"tp_size": tp, "pp_size": pp, "world_size": tp * pp * 2, "interleaving_size": vp if pp > 2 else 1, "micro_batch_num": 8,
             "enable_sequence_parallel": tp > 1, "zero_state": zero, "te_version": te_version, **opts}
        if m.is_moe:
            d.update(ep_size=2, moe_dispatcher_policy=dispatcher)
        if opts["cpu_offloading"]:
            d["cpu_offloading_num_layers"] = 1
        if opts["enable_recompute"]:
            d.update(recompute_granularity="full_block", recompute_layer_num=1)
        try:
            st = load_strategy("tp1_pp2_dp4_mbs1").with_updates(d)
            tokens = shlex.split(" ".join(model_flags(m, st.seq_len) + megatron_flags(st, m)))
        except ConfigError:
            return
        args, rest = megatron_parser.parse_known_args(tokens)
        assert not rest, f"Megatron-LM 0.19 does not know {rest}"
        assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (tp, pp)
        assert (args.overlap_grad_reduce, args.overlap_param_gather, args.tp_comm_overlap) == (
            st.overlap_grad_reduce, st.overlap_param_gather, st.tp_comm_overlap)
        if st.schedule == "interleaved":
            assert args.overlap_p2p_comm == st.p2p_overlapped
            assert args.overlap_p2p_comm_warmup_flush == (st.p2p_overlapped and st.overlap_p2p_comm_warmup_flush)
        before = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8" if st.zero_state >= 2 else "1"  # as Megatron asks
        try:
            megatron_validate(tokens, st.world_size, st.te_version)
        finally:
            if before is None:
                del os.environ["CUDA_DEVICE_MAX_CONNECTIONS"]
            else:
                os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = before

    check()


def test_import_reads_sliding_windows_as_megatron_writes_them() -> None:
    """--window-size is TransformerEngine's (left, right) window: left + 1 keys per query;
    -1 unbounded. --window-attn-skip-freq N or its (N - 1):1 list pattern; another pattern is
    refused by name."""
    base = ("--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 4096 --micro-batch-size 1 "
            "--vocab-size 32000 --bf16")
    m, _, _ = parse_megatron_args(base + " --window-size 127,0 --window-attn-skip-freq '[1,1,1,0]*2' --softmax-type learnable")
    assert (m.window_size, m.window_attn_skip_freq, m.attention_sinks) == (128, 4, True)
    m, _, _ = parse_megatron_args(base + " --window-size '(-1,0)'")
    assert m.window_size is None
    for bad in ("--window-attn-skip-freq '[1,0,0,1]'", "--window-size x", "--window-attn-skip-freq 0"):
        with pytest.raises(ConfigError) as exc:
            parse_megatron_args(f"{base} --window-size 127,0 {bad}")
        assert exc.value.field == bad.split()[0]


def test_import_says_what_it_does_with_activation_and_optimizer_flags() -> None:
    """--quick-geglu is a gated MLP (two up-projections) whose default FFN stays 4h (Megatron's
    2/3 rule is --swiglu's only); --squared-relu and a non-Adam --optimizer are read past
    with their reason, not silently."""
    base = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
            "--vocab-size 32000 --bf16")
    m, _, notes = parse_megatron_args(base + " --quick-geglu --optimizer sgd --squared-relu", world_size=1)
    assert m.use_swiglu and m.intermediate_size == 4 * 1024
    assert any(n.startswith("--optimizer sgd: not modelled") for n in notes)
    assert any("--squared-relu" in n and "not modelled" in n for n in notes)
    m, _, notes = parse_megatron_args(base + " --swiglu --optimizer adam", world_size=1)
    assert m.intermediate_size == 2688 and not any("--optimizer" in n and "not modelled" in n for n in notes)


# Megatron-LM argument -> our strategy field, for the options a launch line may leave out
SAME_DEFAULT = {
    "gradient_accumulation_fusion": "gradient_accumulation_fusion", "apply_rope_fusion": "apply_rope_fusion",
    "bias_swiglu_fusion": "use_fused_swiglu", "check_for_nan_in_loss_and_grad": "check_for_nan_in_grad",
    "moe_permute_fusion": "moe_permute_fusion", "moe_router_fusion": "moe_router_fusion",
    "cross_entropy_loss_fusion": "cross_entropy_loss_fusion", "cross_entropy_fusion_impl": "cross_entropy_fusion_impl",
    "overlap_grad_reduce": "overlap_grad_reduce", "overlap_param_gather": "overlap_param_gather",
    "tp_comm_overlap": "tp_comm_overlap", "sequence_parallel": "enable_sequence_parallel",
    "overlap_p2p_comm_warmup_flush": "overlap_p2p_comm_warmup_flush", "defer_embedding_wgrad_compute": "defer_embedding_wgrad_compute",
    "delay_wgrad_compute": "delay_wgrad_compute", "overlap_moe_expert_parallel_comm": "overlap_moe_expert_parallel_comm",
    "moe_shared_expert_overlap": "moe_shared_expert_overlap", "ddp_average_in_collective": "ddp_average_in_collective",
    "ddp_bucket_size": "ddp_bucket_size", "use_precision_aware_optimizer": "use_precision_aware_optimizer",
    "fp8_param_gather": "fp8_param_gather", "moe_router_dtype": "moe_router_dtype", "nccl_ub": "nccl_ub", "use_sharp": "use_sharp",
}


def test_imported_options_default_as_megatron_019s(megatron_parser: argparse.ArgumentParser) -> None:
    d = megatron_parser.parse_args([])
    _, s, _ = parse_megatron_args("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
                                  "--vocab-size 32000 --bf16 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512", world_size=1)
    assert {arg: getattr(d, arg) for arg in SAME_DEFAULT} == {arg: getattr(s, field) for arg, field in SAME_DEFAULT.items()}
    assert (d.moe_grouped_gemm, s.group_linear_mode) == (False, "serial") and d.use_distributed_optimizer == (s.zero_state > 0)


def test_importer_says_what_it_does_with_newer_megatron_flags() -> None:
    """Megatron-LM 0.19's flags for other training modes (RL, serving, vision, BERT) are read past
    as without effect on a pretraining step; those with an effect the model leaves out (QK-clip,
    CUDA graphs of modules, MLA's fused down-projection, paged stash) are said with their reason,
    not as ignored."""
    base = "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 --vocab-size 1000"
    _, _, notes = parse_megatron_args(base + " --rl-prompts-per-eval 4 --flash-decode --dino-teacher-temp 0.1 --qk-clip "
                                      "--cuda-graph-modules attn --mla-down-proj-fusion --moe-paged-stash", world_size=1)
    text = " ".join(notes)
    assert "ignored" not in text
    for flag in ("--rl-prompts-per-eval", "--flash-decode", "--dino-teacher-temp", "--qk-clip", "--cuda-graph-modules",
                 "--mla-down-proj-fusion", "--moe-paged-stash"):
        assert flag in text, flag
    assert "QK-clip" in text and "paged buffers" in text


def test_export_refuses_what_megatron_019_refuses_at_start_up() -> None:
    """validate_args refuses the interleaved schedule over two pipeline stages without P2P
    overlap and TransformerEngine's cross-entropy fusion: the exporter says so rather than
    write a line that stops at start-up (both still estimate, as SimuMax files and older
    Megatron lines ask)."""
    m = load_model("llama3.1-8b").with_updates({"layer_num": 8})
    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"interleaving_size": 2, "overlap_p2p_comm": False})
    with pytest.raises(ConfigError) as exc:
        megatron_flags(st, m)
    assert exc.value.field == "overlap_p2p_comm" and "pp_size 2" in exc.value.rule
    assert "--no-overlap-p2p-communication" in megatron_flags(st.with_updates({"pp_size": 4, "world_size": 16}), m)
    te = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"})
    with pytest.raises(ConfigError) as exc:
        megatron_flags(te, m)
    assert exc.value.field == "cross_entropy_fusion_impl"
