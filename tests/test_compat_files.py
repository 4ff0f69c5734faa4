"""SimuMax's JSON files mean what they mean in SimuMax (issue 21, part 3): absent fields take
SimuMax's defaults, null reads as absent, SimuMax-only fields and values are mapped or named."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from tests.conftest import VALIDATION, needs_shared

REF = Path(__file__).resolve().parents[2] / "shared" / "reference" / "simumax_configs"
BASE = {"seq_len": 4096, "micro_batch_size": 1, "micro_batch_num": 4, "tp_size": 2, "enable_sequence_parallel": True}


def _est(model: str | dict, system: str = "a100_pcie", layers: int = 2, **strategy) -> Estimate:
    m = load_model(model).with_updates({"layer_num": layers}) if isinstance(model, str) else load_model(model)
    return Estimate(m, load_strategy({**BASE, **strategy}), load_system(system))


def _t(e: Estimate) -> float:
    return e.cost().duration_time_per_iter


def test_absent_fields_take_simumax_defaults(caplog: pytest.LogCaptureFixture) -> None:
    assert load_strategy({"seq_len": 4096}).world_size == 8
    plain = _est("llama3-8b")
    with caplog.at_level(logging.WARNING):
        no_count = _est("llama3-8b", enable_recompute=True, recompute_granularity="full_block")
    assert "recomputes no layer" in caplog.text
    assert no_count.strategy.recompute_mode == "none" and _t(no_count) == _t(plain)
    every = _est("llama3-8b", enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=None)
    two = _est("llama3-8b", enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=2)
    assert _t(every) == _t(two) > _t(plain)  # null: every layer (2 here)
    # selective without a count applies to every layer, as Megatron's selective recompute
    sel = _est("llama3-8b", enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True)
    assert sel.cost().breakdown["recompute"] > 0


def test_moe_file_without_padding_fields_pads_to_capacity_one() -> None:
    d = json.loads((REF / "models" / "mixtral-8x7b.json").read_text())
    d["layer_num"] = 2
    implicit = load_model(d)
    assert implicit.moe_pad_expert_input_to_capacity and implicit.capacity == 1
    explicit = load_model({**d, "moe_pad_expert_input_to_capacity": True, "capacity": 1})
    assert implicit == explicit
    dropless = load_model({**d, "moe_pad_expert_input_to_capacity": False})
    assert dropless.capacity is None
    no_type = {k: v for k, v in d.items() if k != "model_type"}
    assert load_model(no_type).is_moe  # model_type inferred from expert_num
    st = {**BASE, "tp_size": 1, "ep_size": 4, "world_size": 4}
    a, b = (Estimate(m, load_strategy(st), load_system("a100_pcie")) for m in (implicit, dropless))
    assert _t(a) != _t(b)  # the capacity path has its own kernels (router capacity, padding)


def test_simumax_only_values_map_onto_ours() -> None:
    llama = json.loads((REF / "models" / "llama3-8b.json").read_text())
    assert load_model({**llama, "attention_type": "gqa"}) == load_model(llama)
    assert load_model({**llama, "vocab_size": 128512, "orig_vocab_size": 128256}).vocab_size == 128256
    assert load_model({**llama, "group_linear_mode": "parallel"}) == load_model(llama)
    assert load_strategy({**BASE, "moe_dispatcher_policy": "all2all-seq"}).moe_dispatcher_policy == "all2all"
    # null on a field that takes none reads as absent
    assert load_strategy({**BASE, "enable_dropout": None, "mem_factor": None}) == load_strategy(BASE)
    same = load_strategy({**BASE, "te_grouped_gemm_min_version": "1.9", "order_of_paralielism": "tp-cp-ep-dp-pp",
                          "account_for_embedding_in_pipeline_split": False, "attention_sparse_ratio": 0.0,
                          "use_fused_grad_accumulation": True, "use_accm_weight": True})
    assert same == load_strategy(BASE)
    assert load_strategy({**BASE, "zero_state": 3}).zero_state == 3  # ZeRO-3: graph/sharding.py
    with pytest.raises(ConfigError, match="attention_sparse_ratio"):
        load_strategy({**BASE, "attention_sparse_ratio": 0.5})
    assert load_strategy({**BASE, "account_for_loss_in_pipeline_split": True}).account_for_loss_in_pipeline_split


def test_the_straggler_switch_is_said_not_modelled(caplog: pytest.LogCaptureFixture) -> None:
    """SimuMax's straggler model is not modelled: true is said in one line where the file is
    read, once (not on every later copy), and the estimate is the one without it."""
    with caplog.at_level(logging.WARNING):
        st = load_strategy({**BASE, "enable_straggler_model": True})
        st.with_updates({"micro_batch_num": 8})
    assert caplog.text.count("enable_straggler_model=True") == 1 and "no straggler" in caplog.text
    assert st == load_strategy(BASE) == load_strategy({**BASE, "enable_straggler_model": False})


def test_simumax_system_bookkeeping_fields_load() -> None:
    d = json.loads((REF / "system" / "a100_pcie.json").read_text())
    d.update(real_comm_bw={"all_reduce": 10.0}, hit_efficiency=0.9, miss_efficiency=0.5, fixed_latency=10)
    d["accelerator"]["op"]["sdp_fwd"]["accurate_efficient_factor"] = None
    s = load_system(d)
    assert s.accelerator.op["sdp_fwd"].accurate_efficient_factor == {}


def test_recompute_sub_block_granularities() -> None:
    """sdp_only is Megatron's selective (core attention); attn_only recomputes the whole
    attention sub-block, so more time and fewer saved bytes; mlp_only the MLP sub-block."""
    kw = {"enable_recompute": True, "recompute_layer_num": 2}
    sdp = _est("llama3-8b", recompute_granularity="sdp_only", **kw)
    sel = _est("llama3-8b", recompute_granularity="selective_recompute", attn_recompute=True, **kw)
    attn = _est("llama3-8b", recompute_granularity="attn_only", **kw)
    mlp = _est("llama3-8b", recompute_granularity="mlp_only", **kw)
    assert _t(sdp) == _t(sel)
    assert _t(attn) > _t(sdp)
    for e in (attn, mlp):
        assert e.memory().stages[0].fwd_activation_cache_per_micro_batch < _est("llama3-8b").memory().stages[0].fwd_activation_cache_per_micro_batch
    assert sdp.memory().stages[0].fwd_activation_cache_per_micro_batch > attn.memory().stages[0].fwd_activation_cache_per_micro_batch


def test_network_tiers_follow_the_cluster_shape() -> None:
    """A SimuMax strategy naming high_intra_node runs on the PCIe system (whose intra-node
    tiers are intra_node_pcie_<n>x), and pp_net inter_node on one node stays on the node."""
    plain = _est("llama3-8b", pp_size=2)
    named = _est("llama3-8b", pp_size=2, tp_net="high_intra_node", pp_net="inter_node", dp_net="inter_node")
    assert _t(named) == _t(plain)
    with pytest.raises(ConfigError, match="tp_net: unknown network tier"):
        _t(_est("llama3-8b", tp_net="nvlink9"))
    across = _est("llama3-8b", world_size=16, tp_size=8, dp_net="inter_node")  # DP crosses nodes: the NIC tier
    assert across.network.groups["dp"].tier == "inter_node"


def test_simumax_reference_triples_run_or_are_refused_for_a_megatron_rule() -> None:
    """Every model x strategy x system of SimuMax's configs (28 x 12 x 2): estimates, or a
    ConfigError for a split Megatron refuses too (uneven pipeline or VPP splits, heads not
    divisible by TP). SimuMax's EP strategies run its dense models (EP has nothing to split
    there: one warning)."""
    allowed = ("must split evenly", "must split into", "must be divisible by tp")
    systems = [load_system(p) for p in sorted((REF / "system").glob("*.json"))]
    ok = 0
    for m, s in itertools.product(sorted((REF / "models").glob("*.json")), sorted((REF / "strategy").glob("*.json"))):
        for system in systems:
            try:
                e = Estimate(load_model(m), load_strategy(s), system)
                assert _t(e) > 0 and e.memory().peak_mem > 0
                ok += 1
            except ConfigError as exc:
                assert any(a in str(exc) for a in allowed), f"{m.name} {s.name} {system.sys_name}: {exc}"
    print(f"{ok} of {28 * 12 * len(systems)} triples estimate")
    assert len(systems) == 2 and ok >= 628


def test_simumax_result_keys_on_our_results() -> None:
    """analysis_cost() / analysis_mem() are our typed results and answer SimuMax's keys
    (issue 21 part 4), SI numbers, equal to our own fields."""
    from simumax import PerfLLM
    from simumax.report.results import CostResult, MemResult

    perf = PerfLLM()
    perf.configure(strategy_config=load_strategy("tp1_pp4_vp2_sync_mbs1_mbc8_no_ckpt"), model_config=load_model("llama3-8b"),
                   system_config=load_system("a100_pcie"))
    cost, mem = perf.analysis_cost(), perf.analysis_mem()
    assert isinstance(cost, CostResult) and isinstance(mem, MemResult)
    assert cost["duration_time_per_iter"] == cost.data["duration_time_per_iter"] == cost.duration_time_per_iter
    for key in ("mfu", "mfu_6nd_with_attn", "throughput_per_accelerator"):
        assert cost[key] == getattr(cost, key)
    assert cost["all_tokens_per_iter"] == 8 * 1 * 4096 * 2  # mbc 8, mbs 1, seq 4096, dp 2
    assert cost["param_numel_info"]["total"] == perf.estimate.params.total and cost["moe_param_numel"] == 0
    assert cost["breakdown_result"] == cost.breakdown and len(cost["all_chunk_times"]) == 8  # pp 4 x vp 2 chunks
    assert cost["flops_info"]["model_flops_per_iter"] == cost.flops_per_iter
    assert set(mem.keys()) >= {"first_stage", "middle_stage", "last_stage"}
    first = mem["first_stage"]
    assert first["peak_mem"] == mem.stages[0].peak_mem and first["memory_reserved_ratio"] == 0.94
    assert first["peak_activation_mem_in_1F1B"] == mem.stages[0].activation_mem
    assert "data" not in cost.to_dict()  # our own output keeps our keys
    perf.strategy_config = load_strategy("tp2_pp1_dp4_mbs1")
    flat = perf.analysis_mem()
    assert flat["peak_mem"] == flat.stages[0].peak_mem and "first_stage" not in flat  # pp = 1: flat


def test_simumax_tutorial_search_call(tmp_path: Path) -> None:
    """The tutorial's call: all_search_result={} filled with one list per column, SimuMax's
    recompute names (its selective search tries three flag sets), dump_path a folder."""
    from simumax import PerfLLM

    perf = PerfLLM()
    perf.configure(strategy_config=load_strategy("tp1_pp2_dp4_mbs1"), model_config=load_model("llama2-tiny"),
                   system_config=load_system("a100_pcie"))
    result: dict = {}
    rows = perf.search_best_parallel_strategy_with_recompute(
        world_size=8, global_batch_size=16, all_search_result=result, tp_search_list=[1, 2], pp_search_list=[1],
        recompute_search_type=["no_recompute", "full_block", "selective_recompute"], dump_path=tmp_path / "out")
    assert {r.recompute for r in rows} == {"none", "full_block", "selective", "selective_norm", "selective_mlp"}
    assert len(result["tp"]) == len(rows) and result["iter_time"][0] == rows[0].iter_time
    assert {"search_result.csv", "search_result_fits.csv", "search_result.jsonl"} <= {p.name for p in (tmp_path / "out").iterdir()}


def test_simumax_config_methods() -> None:
    from simumax.core.config import ModelConfig, StrategyConfig

    st = StrategyConfig.read_json_file(str(REF / "strategy" / "tp2_pp1_dp4_mbs1_full_recompute.json"))
    assert st.parallelism.startswith("tp2_cp1_pp1_dp4") and st.recompute_status == "full_block (12 layers)"
    assert StrategyConfig.init_from_dict(json.loads(st.to_json_string())) == st
    s2 = StrategyConfig.init_from_format_strings("tp2_pp2_vp2_dp2_mbs1_gbs32")
    assert (s2.world_size, s2.micro_batch_num, s2.schedule, s2.dp_size) == (8, 16, "interleaved", 2)
    with pytest.raises(ConfigError, match="no size"):
        StrategyConfig.init_from_format_strings("fast")
    m = ModelConfig.init_from_config_file(REF / "models" / "llama3-8b.json")
    h, kv, ffn, vocab = 4096, 8 * 128, 14336, 128384  # the file's 128257 padded to a multiple of 128
    layer = h * (h + 2 * kv) + h * h + 3 * h * ffn + 2 * h
    assert m.param_numel() == m.activated_param_numel() == 32 * layer + h + 2 * vocab * h
    # 6N per token for the GEMMs (less the embedding lookup) + causal attention, by hand
    n_gemm = m.param_numel() - vocab * h
    attn = 32 * 3 * 2 * 2 * 4096 * 4096 / 2  # layers x (fwd+bwd) x (QK^T, PV) x 2 FLOP x s x h, causal half
    assert m.flops_per_token(4096) == pytest.approx(6 * n_gemm + attn, rel=0.01)
    assert m.maybe_pad_vocab_size(8) == 129024
    st.sanity_check(m)
    with pytest.raises(ConfigError, match="tp"):
        StrategyConfig.init_from_format_strings("tp3_dp1").sanity_check(m)


def test_simumax_perf_methods(tmp_path: Path) -> None:
    from simumax import PerfLLM

    perf = PerfLLM()
    perf.configure(strategy_config=load_strategy("tp1_pp2_dp4_mbs1"), model_config=load_model("llama3-8b").with_updates({"layer_num": 4}),
                   system_config=load_system("a100_pcie"))
    assert perf.get_pp_num_layers() == [2, 2]
    assert perf.get_pp_stage_peak_mem() == [s.peak_mem for s in perf.analysis_mem().stages]
    assert perf.calculate_1f1b_bubble() == perf.analysis_cost().breakdown["bubble"] > 0
    net = perf.analysis_net()
    assert net["pp"]["size"] == 2 and net["dp"]["tier"].startswith("intra_node_pcie")
    ops = perf.analysis_op_info(stage=0)
    assert ops[0]["name"] == "embedding" and any(o["module"] == "qkv" and o["flops"]["fwd"] > 0 for o in ops)
    gemms = perf.analysis_gemm_costs()
    assert all(g["time"] > 0 and g["source"] in ("measured", "fitted", "default") for g in gemms)
    assert sum(g["flops"] * g["count"] for g in gemms) > 0
    trace = perf.export_pp_schedule_trace(tmp_path / "pp")
    assert Path(trace).is_file()
    perf.run_estimate(capture_graph=True, save_path=tmp_path / "an")
    names = {p.name for p in (tmp_path / "an").iterdir()}
    assert {"base_info.json", "net_info.json", "model_arch.txt", "compute_result.json", "mem_result.json", "op_graph.dot"} <= names
    assert json.loads((tmp_path / "an" / "base_info.json").read_text())["layers_per_stage"] == [2, 2]
    assert perf.search_best_recompute_layer_num() == 0  # fits without recompute
    assert perf.search_best_selective_recompute().recompute.startswith("selective")


def test_ep_on_a_dense_model_changes_nothing(caplog) -> None:
    """SimuMax's ep4 strategy on its dense Llama: the estimate of the same split without EP,
    and one warning per model and system (not one per estimate of a search)."""
    system = load_system(REF / "system" / "a100_pcie.json")
    m = load_model(REF / "models" / "llama3-8b.json")
    ep = load_strategy(REF / "strategy" / "ep4_pp2_dp4_mbs1.json")
    with caplog.at_level("WARNING"):
        a, b = Estimate(m, ep, system), Estimate(m, ep, system)
    plain = Estimate(m, ep.with_updates({"ep_size": 1}), system)
    assert _t(a) == _t(b) == _t(plain) and a.memory().peak_mem == plain.memory().peak_mem
    assert sum("no effect on the dense model" in r.message for r in caplog.records) == 1


@needs_shared
def test_same_numbers_as_simumax_on_its_own_files() -> None:
    """Issue 21's target on the SimuMax outputs we have: for every case of the shipped
    validation files that records SimuMax v1.2's own prediction (``reference_prediction``:
    its B200 and A100 PCIe release summaries, SimuMax's config files), our iteration time
    is within ±10 % of SimuMax's and our peak allocated memory within ±3 %."""
    from simumax.validate import default_reference_root, estimate_for_case, load_cases

    worst_t = worst_m = 0.0
    n = 0
    for name in ("b200_megatron.jsonl", "a100_pcie_megatron.jsonl"):
        path = VALIDATION / name
        for case in load_cases(path):
            ref = case.get("reference_prediction") or {}
            if not ref.get("iter_time_ms") or not ref.get("peak_alloc_gib"):
                continue
            est = estimate_for_case(case, default_reference_root(path))
            dt = est.cost().duration_time_per_iter * 1e3 / ref["iter_time_ms"] - 1
            dm = est.memory().peak_mem / 2**30 / ref["peak_alloc_gib"] - 1
            assert abs(dt) <= 0.10 and abs(dm) <= 0.03, f"{case['id']}: time {dt:+.1%}, memory {dm:+.2%} from SimuMax's"
            worst_t, worst_m, n = max(worst_t, abs(dt)), max(worst_m, abs(dm)), n + 1
    print(f"{n} cases: time within {worst_t:.1%}, peak memory within {worst_m:.2%} of SimuMax v1.2's own predictions")
    assert n >= 48


@needs_shared
def test_simumax_tflops_convention_on_its_own_files() -> None:
    """SimuMax's TFLOP/s per GPU (``tflops_per_gpu`` in the A100 PCIe file: measured and
    SimuMax's own) times the iteration time is the FLOPs of ``flops_6nd_with_attn`` per GPU:
    6 x parameters but the input embedding, plus non-causal attention over the q·k and value
    head dims (MLA's q·k dim is its nope + rope dims: 128 + 64 for DeepSeek-V2)."""
    from simumax.validate import default_reference_root, estimate_for_case, load_cases

    path = VALIDATION / "a100_pcie_megatron.jsonl"
    worst, n = 0.0, 0
    for case in load_cases(path):
        for rec in (case["measured"], case.get("reference_prediction") or {}):
            if not rec.get("tflops_per_gpu"):
                continue
            est = estimate_for_case(case, default_reference_root(path))
            ours = est.flops_6nd_with_attn() / est.strategy.world_size
            theirs = rec["tflops_per_gpu"] * 1e12 * rec["iter_time_ms"] / 1e3
            worst, n = max(worst, abs(ours / theirs - 1)), n + 1
    print(f"{n} records: FLOPs per GPU per iteration within {worst:.3%} of SimuMax's TFLOP/s x time")
    assert n == 60 and worst < 0.001


def test_rank_orders() -> None:
    """Megatron's default rank order tp-cp-ep-dp-pp keeps DP inside a node before PP;
    --use-tp-pp-dp-mapping (rank_order tp-cp-ep-pp-dp, SimuMax's order_of_paralielism
    tp-pp-dp) puts pipeline neighbours next to each other: on 8-GPU nodes with TP4 PP4 DP4,
    PP stride 4 (NVLink) and DP stride 16 (one rank a node) instead of PP 16 and DP 4."""
    m = load_model(REF / "models" / "llama3-70b.json")
    sy = load_system("h100-sxm-80gb")
    st = load_strategy(REF / "strategy" / "tp1_pp2_dp4_mbs1.json").with_updates(
        {"world_size": 64, "tp_size": 4, "pp_size": 4, "micro_batch_num": 16, "enable_sequence_parallel": True})
    place = lambda s: {g: (p.size, p.stride, p.intra_node) for g, p in Estimate(m, s, sy).network.groups.items()}  # noqa: E731
    default, inner = place(st), place(st.with_updates({"rank_order": "tp-cp-ep-pp-dp"}))
    assert default["pp"] == (2, 16, False) and default["dp"] == (4, 4, False)
    assert inner["pp"] == (2, 4, True) and inner["dp"] == (4, 16, False) and inner["tp"] == default["tp"]
    assert load_strategy({**json.loads((REF / "strategy" / "tp1_pp2_dp4_mbs1.json").read_text()),
                          "order_of_paralielism": "tp-pp-dp"}).rank_order == "tp-cp-ep-pp-dp"
    # with CP the DP x CP group is blocks: rank = tp_i + tp*cp_i + tp*cp*pp*dp_i. TP2 CP2 PP4 DP2
    # on 8-GPU nodes: each DP index's two CP ranks (stride 2) share a node, the two blocks are
    # 16 ranks (two nodes) apart: 2 members per node on 2 nodes, node distance 2; pipeline
    # neighbours tp*cp = 4 apart
    cp = st.with_updates({"tp_size": 2, "cp_size": 2, "world_size": 32, "seq_len": 8192, "rank_order": "tp-cp-ep-pp-dp"})
    net = Estimate(m, cp, sy).network
    dp = net.groups["dp"]
    assert (dp.size, dp.stride, dp.intra_node, dp.per_node, dp.node_stride) == (4, 2, False, 2, 2)
    assert net._node_split(dp)[:3] == (2, 2, 2) and net.groups["pp"].stride == 4 and net.groups["cp"].stride == 2
    # TP1 CP2 PP2 DP2: the 8 ranks of one node hold the group whole (ranks 0, 1, 4, 5)
    small = Estimate(m, cp.with_updates({"tp_size": 1, "pp_size": 2, "world_size": 8, "micro_batch_num": 8,
                                         "enable_sequence_parallel": False}), sy).network.groups["dp"]
    assert (small.size, small.intra_node, small.per_node) == (4, True, None)
    # TP1 CP2 PP2 DP4 on 8-GPU nodes: two whole blocks per node (blocks 4 apart), two nodes
    two = Estimate(m, cp.with_updates({"tp_size": 1, "pp_size": 2, "world_size": 16, "micro_batch_num": 8,
                                       "enable_sequence_parallel": False}), sy).network
    assert two._node_split(two.groups["dp"])[:3] == (4, 2, 1)
    # the default order keeps the group evenly strided: CP and DP consecutive at stride tp
    plain = Estimate(m, cp.with_updates({"rank_order": "tp-cp-ep-dp-pp"}), sy).network.groups["dp"]
    assert (plain.size, plain.stride, plain.intra_node, plain.per_node) == (4, 2, True, None)
    with pytest.raises(ConfigError) as exc:
        cp.with_updates({"zero_state": 3, "fsdp_impl": "megatron_fsdp", "fsdp_replicate_size": 2})
    assert exc.value.field == "rank_order"
