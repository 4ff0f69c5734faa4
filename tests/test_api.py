"""The SimuMax-compatible Python API and its typed, SI-unit results."""

from __future__ import annotations

import json

import pytest

from simumax import ModelConfig, PerfLLM, StrategyConfig, SystemConfig
from tests.conftest import REFERENCE, needs_shared, run_cli


def test_tutorial_flow_with_presets(tmp_path) -> None:
    perf = PerfLLM()
    perf.configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b", system_config="a100_pcie")
    perf.run_estimate()
    cost, mem = perf.analysis_cost(), perf.analysis_mem()
    assert 0.5 < cost.duration_time_per_iter < 60  # seconds
    assert cost.throughput_per_accelerator > 0 and cost.tflops_per_gpu > 0
    assert 0 < cost.mfu < cost.mfu_6nd_with_attn < 1  # non-causal attention counts more FLOPs
    for key in ("fwd", "bwd", "recompute", "pp_p2p", "bubble", "dp_comm", "optimizer"):
        assert key in cost.breakdown
    assert len(mem.stages) == 2
    s0 = mem.stages[0]
    assert s0.in_flight_micro_batches == 2 and mem.stages[1].in_flight_micro_batches == 1
    assert s0.peak_mem_with_reserved == s0.peak_mem / 0.94
    assert s0.peak_path["phase"] in ("fwd", "bwd")
    perf.analysis(tmp_path)
    for name in ("compute_result.json", "mem_result.json", "model_config.json", "strategy_config.json", "system_config.json"):
        json.loads((tmp_path / name).read_text())
    assert json.loads((tmp_path / "compute_result.json").read_text())["duration_time_per_iter"] == cost.to_dict()["duration_time_per_iter"]


@needs_shared
def test_configure_with_paths_and_objects_agree() -> None:
    paths = dict(
        strategy_config=REFERENCE / "strategy/tp2_pp1_dp4_mbs1.json",
        model_config=REFERENCE / "models/llama3-8b.json",
        system_config=REFERENCE / "system/a100_pcie.json",
    )
    a = PerfLLM().configure(**paths).analysis_cost().duration_time_per_iter
    objs = dict(
        strategy_config=StrategyConfig.init_from_config_file(paths["strategy_config"]),
        model_config=ModelConfig.init_from_config_file(paths["model_config"]),
        system_config=SystemConfig.init_from_config_file(paths["system_config"]),
    )
    assert PerfLLM().configure(**objs).analysis_cost().duration_time_per_iter == a


def test_selective_and_megatron_recompute_modes() -> None:
    from simumax.config.loader import load_model

    # 12 layers, so the presets' recompute_layer_num = 12 covers every layer
    base = dict(model_config=load_model("llama3-8b").with_updates({"layer_num": 12}), system_config="a100_pcie")
    none = PerfLLM().configure(strategy_config="tp2_pp1_dp4_mbs1", **base)
    sel = PerfLLM().configure(strategy_config="tp2_pp1_dp4_mbs1_selective_recompute", **base)
    full = PerfLLM().configure(strategy_config="tp2_pp1_dp4_mbs1_full_recompute", **base)
    meg = PerfLLM().configure(
        strategy_config=StrategyConfig.init_from_dict(
            {**none.strategy_config.to_dict(), "megatron_recompute": True, "megatron_recompute_modules": ["layernorm", "mlp"]}
        ),
        **base,
    )
    act = lambda p: p.analysis_mem().stages[0].fwd_activation_cache_per_micro_batch  # noqa: E731
    assert act(full) < act(meg) < act(none)
    assert act(full) < act(sel) < act(none)
    assert full.analysis_cost().breakdown["recompute"] > sel.analysis_cost().breakdown["recompute"] > 0


def test_results_are_deterministic() -> None:
    def run() -> str:
        p = PerfLLM().configure(strategy_config="tp2_pp1_dp4_mbs1", model_config="llama3-70b", system_config="b200_bf16_ceperm")
        return json.dumps({"c": p.analysis_cost().to_dict(), "m": p.analysis_mem().to_dict()}, sort_keys=True)

    assert run() == run()


def test_perf_out_writes_memory_and_time_plots(tmp_path) -> None:
    for fmt, magic in (("png", b"\x89PNG"), ("svg", b"<?xml")):
        out = tmp_path / fmt
        r = run_cli("perf", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--out", str(out), "--plot-format", fmt)
        assert r.returncode == 0, r.stderr
        for name in ("memory", "time"):
            assert (out / f"{name}.{fmt}").read_bytes().startswith(magic)


def test_memory_parts_add_up_to_the_peak() -> None:
    from simumax.report.breakdown_plots import memory_parts

    perf = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b", system_config="a100_pcie")
    mem = perf.analysis_mem()
    for stage, parts in zip(mem.stages, memory_parts(mem)):
        assert sum(parts.values()) == pytest.approx(stage.peak_mem)


def test_cli_names_the_parallel_sizes_and_warns_when_it_does_not_fit() -> None:
    r = run_cli("perf", "--model", "qwen3-30b-a3b", "--system", "h100-sxm-80gb", "--strategy", "ep8_pp1_dp8_mbs1")
    assert r.returncode == 0, r.stderr
    assert "qwen3-30b-a3b | h100-sxm-80gb | tp1 pp1 ep8 dp8 mbs1 mbc8 zero1" in r.stdout
    perf = PerfLLM().configure(strategy_config="ep8_pp1_dp8_mbs1", model_config="qwen3-30b-a3b", system_config="h100-sxm-80gb")
    mem = perf.run_estimate().analysis_mem()
    assert not mem.fits and f"needs {mem.peak_mem_with_reserved / 2**30:.2f} GiB reserved" in " ".join(r.stdout.split())
    ok = run_cli("perf", "--model", "llama3-8b", "--system", "a100_pcie", "--strategy", "tp1_pp2_dp4_mbs1")
    assert "does not fit" not in ok.stdout and "tp1 pp2 dp4 mbs1 mbc8 zero1" in ok.stdout


def test_perf_says_when_overlapped_communication_is_taken_as_free() -> None:
    """With an overlap option on a tier whose processor_usage is 0 (every preset), for DP
    collectives on a GPU without NCCL's known CTA count (the non-Hopper presets), perf says
    so in one line, naming the options; without overlap, or once the tier has a measured
    usage, it says nothing."""
    from simumax.estimate import Estimate
    from simumax.report.format import free_overlap

    base = {"strategy_config": "tp2_pp1_dp4_mbs1", "model_config": "llama3-8b", "system_config": "b200-sxm-180gb"}
    perf = PerfLLM().configure(**base)
    st = perf.strategy.with_updates({"overlap_grad_reduce": True, "tp_comm_overlap": True})
    est = Estimate(perf.model_config, st, perf.system)
    note = free_overlap(st, est.network)
    # TE's TP overlap reserves its SMs (cost/userbuffers.py): not named
    assert note is not None and note.startswith("overlap_grad_reduce:") and "calibrate-comm" in note
    assert free_overlap(perf.strategy, est.network) is None
    # on the Hopper presets NCCL's default CTA count charges the DP overlap (cost/nccl_sms.py)
    hopper = PerfLLM().configure(**{**base, "system_config": "h100-sxm-80gb"})
    assert free_overlap(st, Estimate(hopper.model_config, st, hopper.system).network) is None
    # the flex dispatcher's overlap takes its kernels' SMs, never nothing
    moe = PerfLLM().configure(strategy_config="ep4_pp2_dp4_mbs1", model_config="deepseek-v2-lite", system_config="h100-sxm-80gb")
    for policy, said in (("all2all", True), ("flex", False)):
        st_moe = moe.strategy.with_updates({"moe_shared_expert_overlap": True, "moe_dispatcher_policy": policy})
        m_moe = moe.model_config.with_updates({"moe_pad_expert_input_to_capacity": False, "layer_num": 4})
        note_moe = free_overlap(st_moe, Estimate(m_moe, st_moe, moe.system).network)
        assert (note_moe is not None and "moe_shared_expert_overlap" in note_moe) is said, policy
    d = perf.system.to_dict()
    for tier in d["networks"].values():
        if isinstance(tier, dict):
            tier["processor_usage"] = 0.12
    measured = Estimate(perf.model_config, st, SystemConfig.init_from_dict(d))
    assert free_overlap(st, measured.network) is None
    r = run_cli("perf", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "-y", "b200-sxm-180gb", "--set", "overlap_grad_reduce=true")
    assert r.returncode == 0 and "overlap_grad_reduce: the overlapped communication takes nothing" in " ".join(r.stdout.split())


def test_perf_says_which_share_rests_on_dropless_routing() -> None:
    """A dropless MoE's routed time rests on tokens per expert the model takes as the
    random routing's x moe_load_imbalance: perf says its share in one line and that the band
    counts it as unmeasured; padded to capacity (SimuMax's MoE files) it says nothing."""
    from simumax.report.format import approximate_note

    args = ("perf", "--model", "deepseek-v2-lite", "--system", "h100-sxm-80gb", "--strategy", "ep8_pp1_dp8_mbs1", "--set", "layer_num=4")
    said = " ".join(run_cli(*args).stdout.split())
    perf = PerfLLM().configure(strategy_config="ep8_pp1_dp8_mbs1", model_config="deepseek-v2-lite", system_config="h100-sxm-80gb")
    perf.model_config.layer_num = 4
    note = approximate_note(perf.run_estimate().analysis_cost(), 1.0)
    assert note is not None and "dropless MoE routing" in note and "moe_load_imbalance 1" in note
    assert " ".join(note.split()) in said
    padded = PerfLLM().configure(strategy_config="ep8_pp1_dp8_mbs1", model_config="deepseekv2-lite", system_config="h100-sxm-80gb")
    assert approximate_note(padded.run_estimate().analysis_cost(), 1.0) is None
    sibling = " ".join(run_cli("perf", "--model", "llama3-8b", "--system", "gb200-nvl72", "--strategy", "tp1_pp1_dp8_mbs1").stdout.split())
    assert "kernel times measured on b200_bf16_ceperm, a sibling of this device" in sibling
