"""Schedules, the event engine, simulate() outputs and the overlap options."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax import ConfigError, PerfLLM
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.estimate import Estimate
from simumax.schedule import dualpipev, interleaved, one_f_one_b, zero_bubble
from simumax.schedule.tasks import BACKWARD, FORWARD, check_complete
from simumax.simulate.engine import PassCosts, PipelineOptions, run_pipeline

from tests.conftest import run_cli


def uniform(ranks: list[int], f: float, b: float, w: float | None = None) -> PassCosts:
    dur = {}
    for k in range(len(ranks)):
        dur[(FORWARD, k)], dur[(BACKWARD, k)] = f, b
        if w is not None:
            dur[("W", k)] = w
    return PassCosts(rank=ranks, dur=dur, p2p=[0.0] * len(ranks))


@settings(max_examples=40, deadline=None)
@given(p=hs.integers(1, 8), m=hs.integers(1, 24))
def test_1f1b_bubble_fraction_is_the_textbook_one(p: int, m: int) -> None:
    run = run_pipeline(one_f_one_b.order(p, m), uniform(list(range(p)), 1.0, 2.0), PipelineOptions())
    busy0 = 3.0 * m
    assert max(run.end) == pytest.approx(3.0 * (m + p - 1))
    assert 1 - busy0 / run.end[0] == pytest.approx((p - 1) / (m + p - 1))


@settings(max_examples=30, deadline=None)
@given(p=hs.integers(2, 6), groups=hs.integers(1, 4), v=hs.integers(2, 4))
def test_interleaving_divides_the_bubble_by_v(p: int, groups: int, v: int) -> None:
    m = p * groups  # Megatron's classic constraint: m a multiple of p
    ranks = [k % p for k in range(p * v)]
    run = run_pipeline(interleaved.order(p, m, v), uniform(ranks, 1.0 / v, 2.0 / v), PipelineOptions())
    bubble_1f1b = 3.0 * (p - 1)
    assert max(run.end) - 3.0 * m == pytest.approx(bubble_1f1b / v)


@settings(max_examples=60, deadline=None)
@given(p=hs.integers(1, 8), v=hs.integers(2, 4), group=hs.sampled_from([None, 1, 2, 3, 4]), extra=hs.integers(0, 1),
       short=hs.integers(1, 5), more=hs.integers(1, 3))
def test_an_interleaved_order_cut_from_a_longer_one_is_the_order(p: int, v: int, group: int | None, extra: int,
                                                                  short: int, more: int) -> None:
    """The steady-state runs' shorter orders are cut from the longest (ProfileCache.orders):
    task for task the order made directly, wherever a cut is offered."""
    g = group or p
    longer = interleaved.order(p, (short + more) * g, v, group, extra)
    for m in (short * g, short * g + 1):
        got = interleaved.cut(longer, p, m, v, group, extra)
        if got is not None:
            assert got == interleaved.order(p, m, v, group, extra)
        elif m % g == 0 and m < (short + more) * g:  # refused only where some rank has no steady part
            assert any((p - r - 1) * 2 + (v - 1) * g + extra >= m * v for r in range(p))
        if m % g:
            assert got is None  # a partial last group: made whole


def test_megatron_schedule_table_example() -> None:
    # the example in Megatron's get_schedule_table docstring: PP2, N3 (group), M5, VP2
    table = interleaved.schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 13), (8, 16)])
def test_zero_bubble_beats_1f1b_and_respects_its_bound(p: int, m: int) -> None:
    order = zero_bubble.order(p, m)
    check_complete(order, p, m, split_backward=True)
    zb = max(run_pipeline(order, uniform(list(range(p)), 1, 1, 1), PipelineOptions()).end)
    f1b = max(run_pipeline(one_f_one_b.order(p, m), uniform(list(range(p)), 1, 2), PipelineOptions()).end)
    assert zb == 3 * m + (p - 1) < f1b  # ZB-H1's bubble: (p - 1)(F + B - W)
    # 1F1B's bounds: at most p - r micro-batches between F and B on rank r, p between F and W
    for r, tasks in enumerate(order):
        to_b = to_w = peak_b = peak_w = 0
        for t in tasks:
            to_b += {FORWARD: 1, BACKWARD: -1}.get(t.kind, 0)
            to_w += {FORWARD: 1, "W": -1}.get(t.kind, 0)
            peak_b, peak_w = max(peak_b, to_b), max(peak_w, to_w)
        assert peak_b <= min(p - r, m) and peak_w <= min(p, m)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 10), (3, 9)])
def test_dualpipev_runs_every_pass_once_and_beats_1f1b(p: int, m: int) -> None:
    order = dualpipev.order(p, m)
    check_complete(order, 2 * p, m, split_backward=True)
    ranks = list(range(p)) + list(range(p - 1, -1, -1))
    dpv = max(run_pipeline(order, uniform(ranks, 0.5, 0.5, 0.5), PipelineOptions()).end)
    f1b = max(run_pipeline(one_f_one_b.order(p, m), uniform(list(range(p)), 1, 2), PipelineOptions()).end)
    assert 3 * m <= dpv < f1b


def _est(model: str = "llama3-8b", layers: int | None = 8, vocab: int | None = None, **kw) -> Estimate:
    m = load_model(model)
    if layers:
        m = m.with_updates({"layer_num": layers})
    if vocab:
        m = m.with_updates({"vocab_size": vocab})
    base = {"world_size": 8, "pp_size": 2, "micro_batch_num": 8, "enable_sequence_parallel": True}
    return Estimate(m, load_strategy("tp1_pp2_dp4_mbs1").with_updates({**base, **kw}), load_system("a100_pcie"))


AGREE = [
    {},
    {"pp_size": 1, "micro_batch_num": 4},
    {"pp_size": 4, "micro_batch_num": 3},
    {"pp_size": 4, "micro_batch_num": 16, "tp_size": 2},
    # interleaved: the closed form needs chunks of equal cost; a 32K vocabulary keeps the
    # embedding's chunk (its dense table gradient) near the others at 8 layers
    {"pp_size": 4, "interleaving_size": 2, "micro_batch_num": 8, "vocab": 32000},
    {"pp_size": 2, "interleaving_size": 4, "micro_batch_num": 6, "vocab": 32000},
    {"pp_size": 4, "interleaving_size": 2, "micro_batch_num": 12, "microbatch_group_size_per_vp_stage": 6, "vocab": 32000},
    {"pp_size": 4, "num_layers_in_first_pipeline_stage": 1, "num_layers_in_last_pipeline_stage": 1},
    {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 2},
    {"zero_state": 0, "tp_size": 2, "pp_size": 2, "micro_batch_num": 5},
    {"model": "deepseek-v2-lite", "ep_size": 4, "pp_size": 2},
    {"model": "deepseek-v2-lite", "ep_size": 2, "tp_size": 2, "pp_size": 2, "interleaving_size": 2},
    {"pp_size": 4, "pp_schedule": "zb", "micro_batch_num": 8},
    {"pp_size": 2, "overlap_p2p_comm": True},
]


@pytest.mark.parametrize("kw", AGREE)
def test_closed_form_and_simulation_agree_with_overlap_off(kw: dict) -> None:
    kw = dict(kw)
    est = _est(kw.pop("model", "llama3-8b"), **kw)
    sim = est.simulate().total
    if not est.needs_simulation:
        assert est.cost().duration_time_per_iter == pytest.approx(sim, rel=1e-12)  # same engine, no events
    if est.strategy.schedule == "zb" or est.strategy.p2p_overlapped or est.needs_simulation:
        return  # the 1F1B / interleaved closed form (blocking sends) does not describe these
    closed = max(est.closed_form_ends()[1])
    assert abs(sim - closed) / closed <= 0.005, f"simulated {sim:.6f} s vs closed form {closed:.6f} s"


def test_memory_walk_gives_1f1b_in_flight_counts() -> None:
    est = _est(pp_size=4, micro_batch_num=8)
    assert [s.in_flight_micro_batches for s in est.memory().stages] == [4, 3, 2, 1]
    few = _est(pp_size=4, micro_batch_num=2)
    assert [s.in_flight_micro_batches for s in few.memory().stages] == [2, 2, 2, 1]


@pytest.mark.parametrize("kw", [{}, {"interleaving_size": 2}, {"pp_schedule": "zb"}, {"pp_schedule": "dualpipev"}])
def test_the_worst_forward_and_backward_passes_make_the_walks_peak(kw: dict) -> None:
    """The walk's worst forward pass and worst backward pass (B and a split backward's W),
    which states that differ between the two read (ModelStates.backward_extra), are the
    peak's two sides: the larger is the peak, on every rank of every schedule."""
    est = _est(pp_size=4, micro_batch_num=8, **kw)
    for act in est.activation_walks():
        assert act.peak == max(act.fwd_peak, act.bwd_peak) and act.fwd_peak > 0 and act.bwd_peak > 0
        assert act.fwd_peak_task.kind == FORWARD and act.bwd_peak_task.kind != FORWARD


def test_interleaving_raises_first_rank_memory_and_zb_keeps_it_bounded() -> None:
    plain = _est(pp_size=4, micro_batch_num=8).memory().stages[0].activation_mem
    vpp = _est(pp_size=4, micro_batch_num=8, interleaving_size=2).memory().stages[0].activation_mem
    zb = _est(pp_size=4, micro_batch_num=8, pp_schedule="zb").memory().stages[0].activation_mem
    assert vpp > plain  # (p - 1) * 2 + (v - 1) * p + 1 = 11 half-stage chunks vs 4 stages
    assert zb <= plain * 1.25  # W passes keep only what the weight gradients read


def test_dualpipev_puts_embedding_and_loss_on_rank_0() -> None:
    est = _est(pp_size=4, micro_batch_num=8, pp_schedule="dualpipev")
    names = [{o.name for o in s.ops} for s in est.stages]
    assert "embedding" in " ".join(names[0]) and "lm_head" in names[0]
    assert sum(len(s.layers) for s in est.stages) == 8 and all(len(s.layers) == 2 for s in est.stages)


@pytest.mark.parametrize(
    "option, extra",
    [
        ("overlap_grad_reduce", {}),
        ("overlap_param_gather", {"overlap_grad_reduce": True}),  # Megatron: only with the reduce's overlap
        ("tp_comm_overlap", {"tp_size": 2, "pp_size": 2}),
        ("overlap_p2p_comm", {"pp_size": 4}),
        ("defer_embedding_wgrad_compute", {}),
    ],
)
def test_each_overlap_option_hides_time(option: str, extra: dict) -> None:
    off = _est(**extra).cost().duration_time_per_iter
    on_est = _est(**extra, **{option: True})
    on = on_est.cost().duration_time_per_iter
    assert on < off, f"{option}: {on} !< {off}"


@pytest.mark.parametrize("kw", [{"pp_size": 1}, {"pp_size": 2, "interleaving_size": 2}, {"pp_size": 2, "pp_schedule": "dualpipev"}])
def test_moe_expert_parallel_overlap_hides_all_to_all(kw: dict) -> None:
    kw = {"ep_size": 4, **kw}
    off = _est("deepseek-v2-lite", **kw).cost().duration_time_per_iter
    on = _est("deepseek-v2-lite", **kw, overlap_moe_expert_parallel_comm=True).cost().duration_time_per_iter
    delayed = _est(
        "deepseek-v2-lite", **kw, overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True
    ).cost().duration_time_per_iter
    assert delayed <= on < off


def test_processor_usage_makes_overlap_cost_compute() -> None:
    """A tier's processor_usage slows the compute its overlapped collectives run beside (here
    ZeRO-3's per-layer gathers and reduce-scatters); TE's userbuffers reserve their own SMs
    (cost/userbuffers.py), so the TP overlap does not read it."""
    sy = load_system("a100_pcie")
    nets = sy.to_dict()["networks"]
    busy = sy.with_updates({"networks": {**nets, **{t: {**v, "processor_usage": 0.5} for t, v in nets.items()
                                                    if isinstance(v, dict)}}})
    est = _est(tp_size=1, pp_size=2, micro_batch_num=4, overlap_grad_reduce=True, zero_state=3)
    assert Estimate(est.model, est.strategy, busy).cost().duration_time_per_iter > est.cost().duration_time_per_iter
    tp = _est(tp_size=2, pp_size=1, micro_batch_num=4, tp_comm_overlap=True)
    assert Estimate(tp.model, tp.strategy, busy).cost().duration_time_per_iter == pytest.approx(
        tp.cost().duration_time_per_iter, rel=1e-12)


def test_comm_sms_charges_the_measured_sm_contention() -> None:
    """A tier's comm_sms (NCCL's channel count) without a processor_usage above 0: the
    compute its collectives overlap slows by the accelerator's slowdown_beside (on the H100
    presets the measured curve: 0.271 at 16 SMs); a measured processor_usage wins; perf's
    "taken as free" note goes."""
    from simumax.report.format import free_overlap

    # without NCCL's Hopper default CTA count (cost/nccl_sms.py), which would charge it too
    sy = load_system("h100-sxm-80gb")
    sy = sy.with_updates({"accelerator": {**sy.accelerator.model_dump(), "nccl_max_ctas": None}})
    nets = sy.to_dict()["networks"]

    def with_tiers(**fields) -> object:
        return sy.with_updates({"networks": {**nets, **{t: {**v, **fields} for t, v in nets.items() if isinstance(v, dict)}}})

    base = _est(tp_size=1, pp_size=2, micro_batch_num=4, overlap_grad_reduce=True, zero_state=3)
    est = {k: Estimate(base.model, base.strategy, y) for k, y in
           (("free", sy), ("sms", with_tiers(comm_sms=16)), ("both", with_tiers(comm_sms=16, processor_usage=0.05)))}
    assert est["sms"].network.compute_usage("dp") == pytest.approx(0.271)
    assert est["both"].network.compute_usage("dp") == 0.05
    t = {k: e.cost().duration_time_per_iter for k, e in est.items()}
    assert t["free"] < t["both"] < t["sms"]
    assert free_overlap(base.strategy, est["free"].network) is not None
    assert free_overlap(base.strategy, est["sms"].network) is None


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"pp_schedule": "interleaved"}, "pp_schedule"),
        ({"pp_schedule": "zb", "interleaving_size": 2, "pp_size": 2}, "pp_schedule"),
        ({"pp_schedule": "dualpipev", "pp_size": 1}, "pp_schedule"),
        ({"pp_schedule": "dualpipev", "pp_size": 4, "micro_batch_num": 7}, "micro_batch_num"),
        ({"interleaving_size": 2, "pp_size": 4, "micro_batch_num": 3}, "micro_batch_num"),  # fewer than pp_size
        ({"interleaving_size": 2, "pp_size": 4, "micro_batch_num": 8, "microbatch_group_size_per_vp_stage": 9},
         "microbatch_group_size_per_vp_stage"),
        ({"interleaving_size": 2, "pp_size": 4, "micro_batch_num": 9}, "micro_batch_num"),
        ({"delay_wgrad_compute": True}, "delay_wgrad_compute"),
        ({"overlap_moe_expert_parallel_comm": True, "ep_size": 2}, "overlap_moe_expert_parallel_comm"),  # pp 2, no VPP
        ({"overlap_moe_expert_parallel_comm": True, "pp_size": 1}, "overlap_moe_expert_parallel_comm"),  # ep 1
        ({"pp_schedule": "round-robin"}, "pp_schedule"),
    ],
)
def test_schedule_config_errors(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_strategy("tp1_pp2_dp4_mbs1").with_updates(kw)
    assert field in str(e.value)


def test_simulate_writes_trace_memory_snapshot_and_gantt(tmp_path) -> None:
    perf = PerfLLM().configure(
        strategy_config=load_strategy("tp1_pp2_dp4_mbs1").with_updates({"micro_batch_num": 4}),
        model_config=load_model("llama3-8b").with_updates({"layer_num": 4}),
        system_config="a100_pcie",
    )
    res = perf.simulate(tmp_path)
    assert res.duration_time_per_iter == pytest.approx(perf.analysis_cost().duration_time_per_iter, rel=5e-3)
    trace = json.loads((tmp_path / "tracing_logs.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    assert {e["args"]["name"] for e in trace if e["name"] == "thread_name"} == {"compute", "comm"}
    ops = [e for e in spans if e["args"]["kind"] == "op"]
    assert any(e["name"] == "L0.qkv fwd" and e["args"]["flops"] > 0 for e in ops)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    # SimuMax's event fields: cat compute / comm, stream_type, base_name, direction, call_stack
    assert {e["cat"] for e in spans} == {"compute", "comm"}
    assert all(e["cat"] == e["args"]["stream_type"] and e["args"]["call_stack"].startswith(f"rank {e['pid']}/") for e in spans)
    qkv = next(e for e in ops if e["name"] == "L0.qkv fwd")["args"]
    assert (qkv["base_name"], qkv["direction"]) == ("L0.qkv", "fwd")
    passes = [e for e in spans if e["args"]["kind"] in ("F", "B")]
    assert len(passes) == 2 * 2 * 4  # ranks x (F, B) x micro-batches
    timeline = json.loads((tmp_path / "memory_timeline_rank0.json").read_text())
    assert timeline["peak_allocated"] == pytest.approx(res.ranks[0].peak_mem)
    assert max(b for _, b in timeline["points"]) == pytest.approx(res.ranks[0].peak_mem)
    snap = pickle.loads(next(tmp_path.glob("memory_snapshot_rank*.pickle")).read_bytes())
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") == actions.count("free_completed") > 0  # every activation freed
    assert all(b["state"] == "active_allocated" for s in snap["segments"] for b in s["blocks"])
    assert (tmp_path / "pipeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    simu = json.loads((tmp_path / "simu_memory_result.json").read_text())  # SimuMax's names
    assert simu["peak_mem"] == pytest.approx(max(r.peak_mem for r in res.ranks))
    assert (tmp_path / "simu_memory_viz_snapshot.pickle").read_bytes() == next(tmp_path.glob("memory_snapshot_rank*.pickle")).read_bytes()
    assert json.loads((tmp_path / "simu_memory_snapshot.json").read_text())["peak_allocated"] == pytest.approx(simu["peak_mem"])
    merged = PerfLLM().configure(strategy_config=perf.strategy_config, model_config=perf.model_config, system_config="a100_pcie")
    merged.simulate(tmp_path / "merged", merge_lanes=True, gantt=False)
    lanes = json.loads((tmp_path / "merged" / "tracing_logs.json").read_text())["traceEvents"]
    assert {e["tid"] for e in lanes if e["ph"] == "X"} == {0}


def test_cli_simulate_schedule_and_bad_schedule(tmp_path) -> None:
    args = ["simulate", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--set", "layer_num=8",
            "--set", "pp_size=4", "--set", "micro_batch_num=8"]
    ok = run_cli(*args, "--schedule", "dualpipev", "--out", str(tmp_path), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["schedule"] == "dualpipev"
    assert (tmp_path / "tracing_logs.json").is_file()
    table = run_cli(*args, "--out", str(tmp_path / "t"))  # every rank's timeline named, the peak labelled allocated
    assert "memory_timeline_rank0..3:" in table.stdout and "(4 files)" in table.stdout and "peak alloc GiB" in table.stdout
    assert all((tmp_path / "t" / f"memory_timeline_rank{r}.json").is_file() for r in range(4))
    bad = run_cli(*args, "--schedule", "gpipe", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "pp_schedule" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_optimizer_step_waits_at_the_gradient_norm_barrier() -> None:
    """Megatron all-reduces the gradient norm over every rank before clipping: the last
    stage (its backward ends first) cannot start Adam before the first stage's grads are
    reduced. By hand: max_r(end_r + reduce_r + before_r) + max_r(after_r + gather_r),
    never less than the per-rank sum without the barrier."""
    est = _est("deepseek-v2-lite", ep_size=4, pp_size=2, micro_batch_num=4)
    ends = est.pipeline_run().end
    assert ends[1] < ends[0]  # the last stage finishes its passes first
    passes = est.optimizer_passes
    barrier = max(e + est.dp_reduce_time(s) + p[0] for e, s, p in zip(ends, est.stages, passes))
    hand = max(barrier + p[1] + est.dp_gather_time(s) for s, p in zip(est.stages, passes))
    cost = est.cost()
    assert cost.duration_time_per_iter == pytest.approx(hand, rel=1e-12)
    per_rank = max(e + est.dp_comm_time(s) + est.optimizer_time(s) for e, s in zip(ends, est.stages))
    assert cost.duration_time_per_iter >= per_rank
    assert est.simulate().total == pytest.approx(hand, rel=1e-12)
    crit = max(range(2), key=lambda r: barrier + passes[r][1] + est.dp_gather_time(est.stages[r]))
    ready = [e + est.dp_reduce_time(s) + p[0] for e, s, p in zip(ends, est.stages, passes)]
    # the wait: the pipeline's drain while the barrier's rank runs its last passes, the rest optimizer_sync
    setter = max(range(2), key=lambda r: ready[r])
    wait, drain = barrier - ready[crit], min(barrier - ready[crit], max(0.0, ends[setter] - ends[crit]))
    assert cost.breakdown["optimizer_sync"] == pytest.approx(wait - drain, rel=1e-9, abs=1e-12)
    assert crit == 1 and drain > 0 and sum(cost.breakdown.values()) == pytest.approx(cost.duration_time_per_iter, rel=1e-12)


def test_moe_overlap_takes_hidden_time_off_the_groups_that_carry_it() -> None:
    """With expert TP the hidden dispatch / combine are partly ETP collectives: the hidden
    seconds come off ep_comm and etp_comm in their shares, so neither part goes negative
    (ep_comm alone went below zero when the ETP share was hidden too)."""
    kw = {"tp_size": 2, "ep_size": 2, "etp_size": 2, "pp_size": 1, "micro_batch_num": 4}
    off = _est("deepseek-v2-lite", **kw).cost()
    on = _est("deepseek-v2-lite", **kw, overlap_moe_expert_parallel_comm=True).cost()
    parts = on.breakdown
    assert all(v >= 0 for v in parts.values()), parts
    assert parts["ep_comm"] < off.breakdown["ep_comm"] and parts["etp_comm"] < off.breakdown["etp_comm"]
    assert sum(parts.values()) == pytest.approx(on.duration_time_per_iter, rel=1e-12)


def test_optimizer_passes_by_hand_and_no_grad_copy_with_fp32_main_grads() -> None:
    """Bytes of the step over one rank's shard (dp/optimizer_step.py), on the default line:
    fp32 main grads are the optimizer's grads as they are (Megatron's ``main_grad.float()``
    is the same tensor), so before the norm: DDP's 1/dp scaling of the whole buffer (read
    and write 4), the nan check over it (4) and the norm (4); after it: clip (8), Adam
    (4 + 2 * 12), the bf16 copy (6) and the zeroing (4). bf16 main grads add the copy to fp32
    (2 + 4); ``--ddp-average-in-collective`` drops the scaling of a dense model; fp16 adds
    the loss scaler's unscale (read and write 4 per stepped parameter)."""
    from simumax.dp.optimizer_step import step_passes
    from simumax.graph.kernels import MemBound

    est = _est("llama3-8b", pp_size=1, micro_batch_num=2)
    seen: list[float] = []

    def bytes_only(k: MemBound) -> float:
        seen.append(k.bytes)
        return k.bytes

    stage, st = est.stages[0], est.strategy
    assert st.main_grad_bytes == 4 and st.zero_state == 1
    shard = stage.params / st.dp_size
    before, after = step_passes(st, est.system, stage, bytes_only)
    assert before == pytest.approx(stage.params * 8 + stage.params * 4 + shard * 4)
    assert after == pytest.approx(shard * (8 + 28 + 6) + stage.params * 4)
    bf16 = st.with_updates({"use_fp32_accum_grad": False})
    assert bf16.main_grad_bytes == 2
    before16, _ = step_passes(bf16, est.system, stage, bytes_only)
    assert before16 == pytest.approx(stage.params * 4 + shard * (2 + 4) + stage.params * 2 + shard * 4)
    averaged, _ = step_passes(st.with_updates({"ddp_average_in_collective": True}), est.system, stage, bytes_only)
    assert averaged == pytest.approx(stage.params * 4 + shard * 4)
    fp16, _ = step_passes(st.with_updates({"dtype": "fp16"}), est.system, stage, bytes_only)
    assert fp16 == pytest.approx(before + shard * 8)  # the loss scaler's unscale of the fp32 main grads


def test_ddp_prescaling_follows_megatrons_factors() -> None:
    """gradient_scaling_factor (distributed_data_parallel.py): 1/(dp x cp) on every buffer,
    or, averaging in the collective, 1 on dense buffers and edp/(dp x cp) on expert ones;
    a factor of 1 skips the pass."""
    from simumax.dp.optimizer_step import prescaled_params

    moe = _est("deepseek-v2-lite", ep_size=4, pp_size=1, micro_batch_num=2)  # 8 GPUs: dp 8, edp 2
    st, stage = moe.strategy, moe.stages[0]
    assert (st.dp_size, st.edp_size) == (8, 2) and 0 < stage.expert_params < stage.params
    assert prescaled_params(st, stage) == stage.params
    assert prescaled_params(st.with_updates({"ddp_average_in_collective": True}), stage) == stage.expert_params
    one = _est("llama3-8b", world_size=1, pp_size=1, micro_batch_num=2)
    assert prescaled_params(one.strategy, one.stages[0]) == 0  # dp 1: the factor is 1


def test_interleaved_p2p_overlap_blocks_in_warmup_and_flush_by_hand() -> None:
    """Megatron's interleaved schedule overlaps P2P in its steady state only. p = 2, v = 2,
    m = 4 (vstages 0..3 on ranks 0, 1, 0, 1): rank 0 warms up with (p - 1)·2 + (v - 1)·p = 4
    forwards (each sends), its flush runs the last steady backward and four cooldown
    backwards (vstage 2's send to rank 1, twice; vstage 0's send nothing): 6 blocking sends;
    rank 1 warms up with 2 forwards (vstage 1's: both send) and ends with 3 backwards that all
    send: 5. With --overlap-p2p-communication-warmup-flush none blocks; without overlap all do
    (the iteration is longest then)."""
    ranks, s = [0, 1, 0, 1], 0.01
    costs = PassCosts(rank=ranks, dur={(kind, k): 1.0 for kind in (FORWARD, BACKWARD) for k in range(4)}, p2p=[s] * 4)
    order = interleaved.order(2, 4, 2)
    phase = run_pipeline(order, costs, PipelineOptions(p2p_overlapped=True, p2p_blocks_warmup_flush=True), record=False)
    free = run_pipeline(order, costs, PipelineOptions(p2p_overlapped=True), record=False)
    blocking = run_pipeline(order, costs, PipelineOptions(), record=False)
    assert phase.sent == pytest.approx([6 * s, 5 * s])
    assert free.sent == [0.0, 0.0]
    assert max(free.end) <= max(phase.end) <= max(blocking.end)


@pytest.mark.parametrize("simulated", [False, True])
def test_warmup_and_flush_sends_show_as_pp_p2p(simulated: bool) -> None:
    """The sends that block in an overlapped interleaved pipeline are the breakdown's pp_p2p
    (not bubble), on the closed path and the simulated one (overlap_grad_reduce) alike; with
    --overlap-p2p-communication-warmup-flush there are none."""
    kw = {"pp_size": 4, "interleaving_size": 2, "layers": 8, "overlap_p2p_comm": True, "zero_state": 1,
          "overlap_grad_reduce": simulated}
    phase, free = _est(**kw).cost(), _est(**kw, overlap_p2p_comm_warmup_flush=True).cost()
    assert phase.breakdown["pp_p2p"] > 0 and free.breakdown["pp_p2p"] == 0
    for c in (phase, free):
        assert sum(c.breakdown.values()) == pytest.approx(c.duration_time_per_iter, rel=1e-12)
    assert phase.duration_time_per_iter >= free.duration_time_per_iter


def test_batched_p2p_waits_on_the_host() -> None:
    """Megatron's batched P2P without overlap ends each exchange in torch.cuda.synchronize()
    (p2p_communication.py, batch_p2p_sync): each blocking send carries ``host_sync_us``, half
    of it in the interleaved steady state (one exchange per forward-backward pair); with
    overlap_p2p_comm nothing. The iteration and its pp_p2p part grow by it."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate

    sy = load_system("a100-sxm-80gb")
    m = load_model("llama3-8b").with_updates({"layer_num": 8})
    base = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"micro_batch_num": 8, "check_for_nan_in_grad": False})
    cases = ((base, 1.0), (base.with_updates({"interleaving_size": 2}), 0.5),
             (base.with_updates({"interleaving_size": 2, "overlap_p2p_comm": True}), 0.0))
    for st, share in cases:
        on, off = (Estimate(m, st, sy.with_updates({"host_sync_us": us})) for us in (130.0, 0.0))
        sends = [a.p2p - b.p2p for a, b in zip(on.chunk_times, off.chunk_times) if b.p2p > 0]
        assert sends and all(x == pytest.approx(share * 130e-6, abs=1e-12) for x in sends)
        grow = on.cost(band=False).duration_time_per_iter - off.cost(band=False).duration_time_per_iter
        assert (grow > 0) == (share > 0)
        if share:
            assert on.cost(band=False).breakdown["pp_p2p"] > off.cost(band=False).breakdown["pp_p2p"]


def test_the_loss_nan_check_waits_on_the_host() -> None:
    """Megatron's loss_func checks each micro-batch's loss for NaN on the host
    (rerun_state_machine.validate_result): one host wait at the end of the loss's forward,
    none with --no-check-for-nan-in-loss-and-grad; on one rank, m micro-batches add m waits."""
    from simumax.config.loader import load_model, load_strategy, load_system
    from simumax.estimate import Estimate
    from simumax.graph.kernels import HOST_SYNC

    sy = load_system("a100-sxm-80gb")
    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"micro_batch_num": 4, "overlap_grad_reduce": False,
                                                          "overlap_param_gather": False})
    for check, waits in ((True, 4), (False, 0)):
        s = st.with_updates({"check_for_nan_in_grad": check})
        on, off = (Estimate(m, s, sy.with_updates({"host_sync_us": us})) for us in (130.0, 0.0))
        loss = next(o for o in on.stages[0].ops if o.module == "loss")
        assert (loss.fwd[-1].family == HOST_SYNC) == check
        grow = on.cost(band=False).duration_time_per_iter - off.cost(band=False).duration_time_per_iter
        assert grow == pytest.approx(waits * 130e-6, rel=1e-6, abs=1e-12)


def test_only_megatrons_pipeline_synchronises() -> None:
    """torchtitan's pipelining (torch_fsdp2) and DeepSpeed's do not call torch.cuda.synchronize()
    after each exchange: no host wait on their sends."""
    from simumax.config.loader import load_strategy, load_system
    from simumax.estimate import p2p_host_wait

    sy = load_system("a100-sxm-80gb")
    st = load_strategy("tp1_pp2_dp4_mbs1")
    assert p2p_host_wait(st, sy) == pytest.approx(130e-6)
    assert p2p_host_wait(st.with_updates({"fsdp_impl": "deepspeed"}), sy) == 0.0


def test_memory_timeline_shows_the_optimizer_step_moment(tmp_path: Path) -> None:
    """Where the optimizer step sets the peak (bf16 main grads copied to fp32, ZeRO-0, a short
    sequence), the memory timeline reports the same peak as the result and has the step's
    point after the backward."""
    perf = PerfLLM().configure(strategy_config=load_strategy({"seq_len": 256, "world_size": 8, "tp_size": 1, "pp_size": 1,
                                                              "zero_state": 0, "use_fp32_accum_grad": False}),
                               model_config=load_model("llama3-8b").with_updates({"layer_num": 2}), system_config="h100-sxm-80gb")
    res = perf.simulate(tmp_path, gantt=False)
    timeline = json.loads((tmp_path / "memory_timeline_rank0.json").read_text())
    assert perf.analysis_mem().stages[0].peak_path["phase"] == "step"
    assert timeline["peak_allocated"] == pytest.approx(res.ranks[0].peak_mem) == pytest.approx(timeline["points"][-1][1])
    assert max(b for _, b in timeline["points"]) == pytest.approx(res.ranks[0].peak_mem)
    assert timeline["points"][-1][0] == pytest.approx(res.ranks[0].end_of_backward)
