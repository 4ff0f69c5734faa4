"""Reliability at the edges (issue 25): what a file is, JSON as the standard says, bounded
numbers, no infinite result printed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from simumax.atomic import dumps_finite
from simumax.config.base import read_json
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from tests.conftest import run_cli


def test_files_that_are_not_json_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory"):
        read_json(tmp_path)
    with pytest.raises(ConfigError, match="is a device"):
        read_json("/dev/null")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is a FIFO"):
        read_json(fifo)  # not opened: reading it would block
    with pytest.raises(ConfigError, match="file not found"):
        read_json(tmp_path / "missing.json")


def test_json_as_the_standard_says(tmp_path: Path) -> None:
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"seq_len": 4096}).encode())
    assert load_strategy(str(bom)).seq_len == 4096  # a UTF-8 BOM is accepted
    for text, rule in (('{"seq_len": NaN}', "NaN"), ('{"seq_len": Infinity}', "Infinity"), ("[" * 100_000, "deeply")):
        f = tmp_path / "x.json"
        f.write_text(text)
        with pytest.raises(ConfigError, match=rule):
            read_json(f)
    bad = tmp_path / "bytes.json"
    bad.write_bytes(b'{"seq_len": 4096, "x": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_json(bad)
    r = run_cli("perf", "-m", "llama3-8b", "-y", "a100_pcie", "-s", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_booleans_and_strings_are_not_integers() -> None:
    st = load_strategy("tp1_pp2_dp4_mbs1")
    for value in (True, "2", 2.0):
        with pytest.raises(ConfigError, match="tp_size"):
            st.with_updates({"tp_size": value})
    with pytest.raises(ConfigError, match="mem_factor"):
        st.with_updates({"mem_factor": float("nan")})


def test_no_infinite_result_and_json_never_has_nan() -> None:
    y = load_system("a100-sxm-80gb").to_dict()
    y["accelerator"]["op"]["matmul"]["efficient_factor"] = 0.0  # no table, no efficiency: infinite GEMMs
    with pytest.raises(ConfigError, match="accelerator.op.matmul"):
        Estimate(load_model("llama3-8b"), load_strategy("tp1_pp2_dp4_mbs1"), load_system(y)).cost()
    with pytest.raises(ConfigError, match="infinite or NaN"):
        dumps_finite({"t": float("inf")})
    assert dumps_finite({"b": 1, "a": [0.5]}) == '{"a": [0.5], "b": 1}'


@pytest.mark.parametrize(("args", "field"), [
    (["--zero", "5"], "search.zero"), (["--schedule", "gpipe"], "search.schedule"), (["--gbs", "0"], "--gbs"),
    (["--gmi-error", "nan"], "--gmi-error"), (["--gmi-error", "-1"], "--gmi-error"), (["--top", "-1"], "--top"),
    (["--tp", "1", "--pp", "1", "--gbs", "7"], "--gbs"),
    (["--pp", "0"], "search.pp"), (["--pp", "-3,2"], "search.pp"), (["--ep", "2"], "--ep"), (["--etp", "2"], "--etp"),
])
def test_search_arguments_are_checked(args: list[str], field: str) -> None:
    r = run_cli("search", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--world-size", "8", *args)
    assert r.returncode == 2 and r.stdout == "", r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in r.stderr


def test_parameter_counts_in_the_corners() -> None:
    from simumax import ModelConfig, StrategyConfig

    gpt = dict(hidden_size=1024, head_num=16, intermediate_size=4096, layer_num=2, vocab_size=51200, norm_type="layernorm",
               position_embedding_type="learned_absolute", max_position_embeddings=2048, add_bias_linear=True)
    sy = load_system("a100_pcie")
    one = Estimate(ModelConfig(**gpt), StrategyConfig(seq_len=2048), sy).params.total
    four = Estimate(ModelConfig(**gpt), StrategyConfig(seq_len=2048, world_size=4, tp_size=4), sy).params.total
    assert four == one  # the position table (2048 x 1024) is replicated over TP, not counted 4 times
    moe = dict(hidden_size=1024, head_num=16, intermediate_size=4096, layer_num=2, vocab_size=51200, model_type="moe",
               expert_num=8, topk=2, moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=1024)
    plain = Estimate(ModelConfig(**moe), StrategyConfig(seq_len=2048), sy).params.total
    biased = Estimate(ModelConfig(**moe, add_bias_linear=True), StrategyConfig(seq_len=2048), sy).params.total
    attn_bias = 2 * (3 * 1024 + 1024)  # per layer: QKV and output projection biases
    expert_bias = 2 * 8 * (512 + 1024)  # per layer: FC1 and FC2 bias of each expert
    shared_bias = 2 * (1024 + 1024)
    assert biased - plain == attn_bias + expert_bias + shared_bias
    with pytest.raises(ConfigError, match="vocab_size"):
        Estimate(ModelConfig(**{**gpt, "vocab_size": 50257, "padded_vocab_size": False}), StrategyConfig(seq_len=2048, world_size=4, tp_size=4), sy)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the workers")
def test_search_workers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "simumax.cli", "search", "-m", "llama3-70b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie",
         "--world-size", "1024", "--gbs", "1024", "--vp", "1,2,4", "--cp", "1,2", "--mbs", "1,2,4", "--jobs", "2",
         "--out", str(tmp_path / "out")],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(workers) < 2 and proc.poll() is None:
        time.sleep(0.2)
        workers = _children(proc.pid)
    assert len(workers) >= 2, "the search did not start its workers"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    alive = workers
    while time.monotonic() < deadline and alive:
        time.sleep(0.2)
        alive = [w for w in alive if Path(f"/proc/{w}").exists() and "zombie" not in _state(w)]
    assert not alive, f"workers {alive} outlived their parent"


def _state(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}") / "status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


MEGATRON = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--ffn-hidden-size", "512",
            "--vocab-size", "100", "--seq-length", "128"]


@pytest.mark.parametrize(("argv", "field"), [
    (["import", "megatron", "--", *MEGATRON, "--global-batch-size", "abc"], "--global-batch-size"),
    (["import", "megatron", "--", *MEGATRON, "--global-batch-size", "0"], "--global-batch-size"),
    (["import", "megatron", "--", *MEGATRON[2:], "--num-layers-per-virtual-pipeline-stage", "2"], "--num-layers"),
    (["import", "megatron", "--", *MEGATRON[:1], "0", *MEGATRON[2:]], "--num-layers"),  # the flag that set it (issue 24)
    (["import", "megatron", "--world-size", "2", "--", *MEGATRON, "--tensor-model-parallel-size", "4"], "--world-size"),
    (["import", "megatron", "--world-size", "4", "--", *MEGATRON, "--tensor-model-parallel-size", "8", "--global-batch-size", "8"],
     "--world-size"),
    (["import", "megatron", "--world-size", "0", "--", *MEGATRON], "--world-size"),
    (["import", "megatron", "--", *MEGATRON, "--tensor-model-parallel-size", "0", "--global-batch-size", "8"],
     "--tensor-model-parallel-size"),
    (["import", "megatron", "--", *MEGATRON, "--micro-batch-size", "0", "--global-batch-size", "8"], "--micro-batch-size"),
    (["import", "megatron", "--", *MEGATRON, "--context-parallel-size", "-2"], "--context-parallel-size"),
])
def test_cli_import_megatron_bad_values(argv: list[str], field: str) -> None:
    r = run_cli(*argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0]


def test_cli_bad_files_and_outputs(tmp_path: Path) -> None:
    quotes = tmp_path / "train.sh"
    quotes.write_text("--num-layers 2 --hidden-size '256")
    hf_zero = tmp_path / "zero.json"
    hf_zero.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 0,
                                   "intermediate_size": 11008, "num_hidden_layers": 2, "vocab_size": 32000}))
    hf_str = tmp_path / "str.json"
    hf_str.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": "4096", "num_attention_heads": 32,
                                  "intermediate_size": 11008, "num_hidden_layers": 2, "vocab_size": 32000}))
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"id": "x"}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    undecodable = tmp_path / "bytes.jsonl"
    undecodable.write_bytes(b"\xff\xfe{}")
    perf = ["perf", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--out"]
    for argv, field in (
        (["import", "megatron", "--file", str(quotes)], "--file"),  # the script cannot be read (importers/launch_script.py)
        (["import", "hf", str(hf_zero)], "num_attention_heads"),
        (["import", "hf", str(hf_str)], "hidden_size"),
        (["validate", str(cases)], "line 1"),
        ([*perf, str(a_file)], "is a file"),
        ([*perf, str(a_file / "sub")], "is a file"),
        (["validate", "/dev/null"], "is a device"),
        (["validate", str(tmp_path)], "is a directory"),
        (["import", "hf", str(tmp_path)], "is a directory"),
        (["import", "megatron", "--file", "/dev/null"], "is a device"),
        (["validate", str(undecodable)], "not UTF-8"),
    ):
        r = run_cli(*argv)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (argv, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and field in lines[0], (argv, lines)


def test_bucket_count_bounded_and_totals_exact() -> None:
    """A model of any size costs the same to estimate: past 1,024 DDP buckets per chunk, full
    buckets are modelled several at a time; the total reduce / gather time is unchanged
    (head_size 10**11 used to raise MemoryError building 10**9 buckets)."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.dp.buckets import MAX_MODELLED_BUCKETS, GradBucket
    from simumax.estimate import Estimate
    from simumax.graph.kernels import Collective

    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"ddp_bucket_size": 10_000, "overlap_grad_reduce": True})
    est = Estimate(load_model("llama3-8b"), st, load_system("a100_pcie"))
    chunk = est.chunks[0]  # pipeline rank 0, first chunk: bucketed; the embedding comes last
    buckets = est.grad_buckets(chunk)
    order, _ = est.param_orders(chunk)
    assert order.head == 0 and order.embedding > 10_000
    n_full, rest = divmod(order.layers, 10_000)
    assert n_full > MAX_MODELLED_BUCKETS and len(buckets) <= MAX_MODELLED_BUCKETS + 2
    rs = lambda e: est.network.time(Collective("reduce_scatter", e * st.main_grad_bytes, "dp"))  # noqa: E731
    ag = lambda e: est.network.time(Collective("all_gather", e * st.dtype_bytes, "dp"))  # noqa: E731
    last = rest + order.embedding
    assert abs(sum(b.reduce for b in buckets) - (n_full * rs(10_000) + rs(last))) <= 1e-9 * n_full * rs(10_000)
    assert abs(sum(b.gather for b in buckets) - (n_full * ag(10_000) + ag(last))) <= 1e-9 * n_full * ag(10_000)
    positions = [b.position for b in buckets]
    assert positions[-1] == chunk.params and positions == sorted(set(positions))
    assert all(type(b) is GradBucket and b.group == "dp" for b in buckets)


def test_host_issue_time_counts_every_launch_and_leaves_the_time_alone() -> None:
    """StageCost.host_issue: a rank's kernel launches of one micro-batch (a memory-bound chain
    its launches, a host wait none; recomputed forwards again) x system.host_op_us, counted
    here over every op of the stage one by one; linear in host_op_us, which the time does not
    read (no Muon step here); perf's note appears from half the GPU time."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate
    from simumax.graph.kernels import HOST_SYNC, MemBound
    from simumax.report.format import host_issue_note

    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    sy = load_system("h100-sxm-80gb")

    def launches(stage) -> int:
        return sum((k.launches if k.family != HOST_SYNC else 0) if isinstance(k, MemBound) else 1 for k in stage.kernels())

    for upd in ({}, {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None}):
        st = load_strategy({"world_size": 8, "tp_size": 2, "pp_size": 2, "seq_len": 4096, "enable_sequence_parallel": True, **upd})
        est = Estimate(m, st, sy)
        cost = est.cost()
        for s, c in zip(est.stages, cost.stages):
            assert c.host_issue == pytest.approx(launches(s) * 30e-6)
        slow = Estimate(m, st, sy.with_updates({"host_op_us": 300.0})).cost()
        assert slow.duration_time_per_iter == cost.duration_time_per_iter
        assert [c.host_issue for c in slow.stages] == pytest.approx([10 * c.host_issue for c in cost.stages])
        assert host_issue_note(cost, 30.0) is None and "host-bound" in host_issue_note(slow, 300.0)
        if upd:  # every layer's forward launches again in its backward
            again = sum(1 for o in est.stages[0].ops if o.recompute_group for k in o.fwd
                        if not (isinstance(k, MemBound) and k.family == HOST_SYNC))
            assert again > 0 and launches(est.stages[0]) == plain_launches + again
        else:
            plain_launches = launches(est.stages[0])


def test_host_issue_time_follows_the_kernels_not_their_size() -> None:
    """The host issues a launch in the same time whatever the kernel's size: a longer
    sequence or a larger micro-batch leaves StageCost.host_issue unchanged and lowers its
    share of the GPU time; a deeper model adds its layers' launches."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate

    sy = load_system("b200-sxm-180gb")
    m = load_model("llama3-8b").with_updates({"layer_num": 4})

    def stage0(model, **upd):
        st = load_strategy({"world_size": 8, "tp_size": 2, "seq_len": 2048, "enable_sequence_parallel": True, **upd})
        return Estimate(model, st, sy).cost().stages[0]

    base = stage0(m)
    for upd in ({"seq_len": 8192}, {"micro_batch_size": 2}):
        other = stage0(m, **upd)
        assert other.host_issue == pytest.approx(base.host_issue) and other.host_issue_share < base.host_issue_share
    deeper = stage0(m.with_updates({"layer_num": 8}))
    per_layer = (deeper.host_issue - base.host_issue) / 4
    assert per_layer > 0 and stage0(m.with_updates({"layer_num": 6})).host_issue == pytest.approx(base.host_issue + 2 * per_layer)


def test_fp32_training_is_refused_not_costed_as_bf16(tmp_path: Path) -> None:
    """dtype fp32 would cost every GEMM as a bf16 one: a ConfigError naming dtype from the API
    and the CLI (exit 2, one line); a Megatron line without --bf16 still imports as fp32,
    saying so, and its estimate is refused the same way."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.errors import ConfigError
    from simumax.estimate import Estimate
    from tests.conftest import run_cli

    st = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"dtype": "fp32"})
    with pytest.raises(ConfigError) as exc:
        Estimate(load_model("llama3-8b"), st, load_system("a100_pcie")).cost()
    assert exc.value.field == "dtype" and "bf16" in exc.value.rule
    for dtype in ("bf16", "fp16"):
        assert Estimate(load_model("llama3-8b"), st.with_updates({"dtype": dtype}), load_system("a100_pcie")).cost()
    r = run_cli("perf", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--set", "strategy.dtype=fp32")
    assert r.returncode == 2 and r.stderr.startswith("error: dtype: fp32 training is not modelled") and "Traceback" not in r.stderr
    r = run_cli("import", "megatron", "--world-size", "8", "--out", str(tmp_path), "--", "--num-layers", "2", "--hidden-size", "1024",
                "--num-attention-heads", "16", "--seq-length", "2048", "--vocab-size", "50257")
    assert r.returncode == 0 and "--bf16 / --fp16 not given" in r.stderr
    r = run_cli("perf", "-m", str(tmp_path / "model.json"), "-s", str(tmp_path / "strategy.json"), "-y", "a100_pcie")
    assert r.returncode == 2 and "error: dtype:" in r.stderr


_HF_BASES = [
    {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 8,
     "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 32000, "rope_theta": 500000.0,
     "max_position_embeddings": 8192, "tie_word_embeddings": False},
    {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816, "moe_intermediate_size": 512,
     "shared_expert_intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 2,
     "vocab_size": 32000, "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "qkv_bias": True},
    {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 2816, "moe_intermediate_size": 256,
     "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 2, "first_k_dense_replace": 1,
     "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
     "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64,
     "vocab_size": 32000, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "routed_scaling_factor": 2.5,
     "num_nextn_predict_layers": 1, "rope_scaling": {"type": "yarn", "factor": 40}},
]


def test_hf_configs_with_wrong_values_are_refused_naming_the_key() -> None:
    """A config.json with a value of the wrong type or range in any key the importer reads
    (sizes, counts, factors, flags, names, layer lists, RoPE objects) is a ConfigError, or
    imports as a model that estimates: never another exception (found by fuzzing: a string
    routed_scaling_factor, n_group or decoder_sparse_step, a number for rope_parameters).
    Derandomised hypothesis draws."""
    import copy

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    from simumax.importers.hf import model_from_hf

    keys = sorted({k for c in _HF_BASES for k in c if k != "architectures"} | {
        "rope_parameters", "partial_rotary_factor", "sliding_window", "head_dim", "hidden_act", "attention_bias",
        "mlp_only_layers", "layer_types", "seq_aux", "text_config", "no_rope_layers", "moe_layers"})
    weird = hs.sampled_from([0, -1, 1, 3, 1.5, -0.5, "x", "64", None, [], {}, True, [0, 1], ["x"], [None],
                             {"type": "yarn", "factor": "x"}, "sigmoid", 10**9])
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 1024})
    system = load_system("h100-sxm-80gb")

    @settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(hs.sampled_from(range(len(_HF_BASES))), hs.dictionaries(hs.sampled_from(keys), weird, min_size=1, max_size=3))
    def check(i: int, muts: dict) -> None:
        cfg = {**copy.deepcopy(_HF_BASES[i]), **muts}
        try:
            model, _ = model_from_hf(cfg, "fuzz")
            est = Estimate(model, st, system)
            assert est.cost().duration_time_per_iter > 0 and est.memory().peak_mem > 0
        except ConfigError:
            pass

    check()
