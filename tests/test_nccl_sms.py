"""The SMs data-parallel collectives' NCCL kernels hold beside the compute they overlap
(cost/nccl_sms.py): megatron-core's statements, by hand, per fabric and option."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.cost.nccl_sms import dp_collective_sms, domain
from simumax.estimate import Estimate
from simumax.importers.megatron_args import parse_megatron_args


def test_domain_of_a_group() -> None:
    # 8 GPUs per node: DP8 with TP1 inside a node; DP8 with TP2 over 2 nodes; DP4 with TP8
    # one rank per node; PCIe links name no NVLink domain
    assert domain(8, 1, True, 8, False) == "nvl"
    assert domain(8, 2, False, 8, False) == "nvl+ib"
    assert domain(4, 8, False, 8, False) == "ib"
    assert domain(4, 1, True, 8, True) is None
    assert domain(16, 1, False, 8, True) == "ib"


@pytest.mark.parametrize("fabric, kind, ub, sharp, expected", [
    # conventional kernels: NCCL's cap where NVLink is in the ring, the IB row over IB alone
    ("nvl", "reduce", False, False, 32), ("nvl+ib", "gather", False, False, 32), ("ib", "reduce", False, False, 4),
    ("ib", "gather", False, False, 4), ("nvl+ib", "reduce", False, True, 32),  # SHARP alone: conventional
    # --use-nccl-ub: megatron-core's DistributedDataParallelConfig.nccl_ub table
    ("nvl", "gather", True, False, 4), ("nvl", "reduce", True, False, 5), ("nvl+ib", "reduce", True, False, 16),
    ("nvl+ib", "gather", True, True, 6), ("ib", "reduce", True, False, 4), ("ib", "reduce", True, True, 1),
])
def test_sms_per_fabric_and_option(fabric: str, kind: str, ub: bool, sharp: bool, expected: int) -> None:
    assert dp_collective_sms(fabric, kind, ub, sharp, 32) == expected


def test_unknown_gpu_or_pcie_holds_nothing() -> None:
    assert dp_collective_sms("nvl", "reduce", False, False, None) == 0
    assert dp_collective_sms("nvl", "reduce", True, False, None) == 0
    assert dp_collective_sms(None, "reduce", True, False, 32) == 0


def _llama(world: int, tp: int, **kw) -> Estimate:
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({
        "world_size": world, "tp_size": tp, "pp_size": 1, "micro_batch_num": 4, "zero_state": 1,
        "enable_sequence_parallel": tp > 1, "overlap_grad_reduce": True, "overlap_param_gather": True, **kw})
    return Estimate(m, st, load_system("h100-sxm-80gb"))


def test_h100_preset_charges_the_measured_curve() -> None:
    """On the H100 preset (nccl_max_ctas 32, the measured sm_contention curve) DP8 on one node
    pays slowdown_beside(32) per second of overlap; with --use-nccl-ub 4 SMs for the
    parameter gathers and 5 for the gradient reduce-scatters; across nodes with TP8 (one
    rank per node) the IB row."""
    e = _llama(8, 1)
    acc = e.system.accelerator
    assert e.network.compute_usage("dp", "reduce") == pytest.approx(acc.slowdown_beside(32))
    assert acc.slowdown_beside(32) == pytest.approx(0.37, abs=0.01)
    ub = _llama(8, 1, nccl_ub=True).network
    assert ub.compute_usage("dp", "gather") == pytest.approx(acc.slowdown_beside(4))
    assert ub.compute_usage("dp", "reduce") == pytest.approx(acc.slowdown_beside(5))
    assert _llama(32, 8).network.compute_usage("dp", "reduce") == pytest.approx(acc.slowdown_beside(4))
    sharp = _llama(16, 1, nccl_ub=True, use_sharp=True).network
    assert sharp.compute_usage("dp", "reduce") == pytest.approx(acc.slowdown_beside(6))


def test_registered_buffers_shorten_an_overlapped_step() -> None:
    """Fewer SMs held, less GEMM time lost: free (no count known) < --use-nccl-ub < NCCL's
    conventional kernels, for a step whose DP collectives overlap compute."""
    conv, ub = _llama(16, 1), _llama(16, 1, nccl_ub=True)
    sy = conv.system
    free_sy = sy.with_updates({"accelerator": {**sy.accelerator.model_dump(), "nccl_max_ctas": None}})
    free = Estimate(conv.model, conv.strategy, free_sy)
    t = [e.cost().duration_time_per_iter for e in (free, ub, conv)]
    assert t[0] < t[1] < t[2], t


def test_tier_figure_replaces_the_conventional_count_only() -> None:
    sy = load_system("h100-sxm-80gb")
    nets = sy.to_dict()["networks"]
    measured = sy.with_updates({"networks": {**nets, **{k: {**v, "processor_usage": 0.1} for k, v in nets.items()
                                                        if isinstance(v, dict)}}})
    for ub, expected in ((False, 0.1), (True, sy.accelerator.slowdown_beside(5))):
        e = _llama(8, 1, nccl_ub=ub)
        assert Estimate(e.model, e.strategy, measured).network.compute_usage("dp") == pytest.approx(expected)


def test_megatron_flags_round_trip() -> None:
    from simumax.export.megatron_flags import megatron_flags

    m, st, _ = parse_megatron_args("--num-layers 2 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
                                   "--vocab-size 32000 --use-distributed-optimizer --overlap-grad-reduce "
                                   "--use-nccl-ub --use-sharp", world_size=16)
    assert st.nccl_ub and st.use_sharp
    flags = megatron_flags(st, m)
    assert "--use-nccl-ub" in flags and "--use-sharp" in flags


@pytest.mark.parametrize("kw", [{"pp_size": 1}, {"pp_size": 4, "interleaving_size": 2}, {"pp_size": 2, "tp_size": 2}])
def test_steady_state_times_keep_the_charge(kw: dict) -> None:
    """cost() takes the pipeline from its steady state, the compute under the overlapped
    gathers and reduces from a run of the shortest steady count (simulate/iteration.py
    steady_compute_spans): the same iteration as the run of every micro-batch."""
    m = load_model("llama3-8b").with_updates({"layer_num": 8})
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({
        "world_size": 64, "tp_size": 1, "micro_batch_num": 48, "zero_state": 1, "overlap_grad_reduce": True,
        "overlap_param_gather": True, **kw, "enable_sequence_parallel": kw.get("tp_size", 1) > 1})
    sy = load_system("h100-sxm-80gb")
    steady, full = Estimate(m, st, sy).cost().duration_time_per_iter, Estimate(m, st, sy).iteration.total
    assert steady == pytest.approx(full, rel=1e-12)


def test_perf_says_what_the_nccl_kernels_hold() -> None:
    """perf's one line: the SMs each overlapped DP collective holds and the slowdown; none
    without DP overlap or where no count is known (the free-overlap note speaks there)."""
    from simumax.report.format import nccl_sms_note

    e = _llama(16, 1)
    note = nccl_sms_note(e.strategy, e.network)
    assert note is not None and "reduce 32 SMs (+37%)" in note and "conventional" in note
    ub = _llama(16, 1, nccl_ub=True)
    assert "reduce 16 SMs (+27%)" in nccl_sms_note(ub.strategy, ub.network)
    off = _llama(16, 1, overlap_grad_reduce=False, overlap_param_gather=False)
    assert nccl_sms_note(off.strategy, off.network) is None
    b200 = Estimate(e.model, e.strategy, load_system("b200-sxm-180gb"))
    assert nccl_sms_note(b200.strategy, b200.network) is None


def test_hsdp_shard_collectives_take_their_own_groups_fabric() -> None:
    """FSDP2's HSDP (4 replicas of 8-GPU shards): the per-layer gathers and reduce-scatters
    run inside one node, so --use-nccl-ub's NVLink row (5 SMs) applies, not the whole DP
    group's NVLink + IB one; with NCCL's conventional kernels 32 SMs either way."""
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    sy = load_system("h100-sxm-80gb")
    t = {}
    for ub in (False, True):
        st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({
            "world_size": 32, "zero_state": 3, "fsdp_impl": "torch_fsdp2", "fsdp_replicate_size": 4,
            "micro_batch_num": 4, "nccl_ub": ub})
        e = Estimate(m, st, sy)
        assert e.network.groups["dp_shard"].intra_node and not e.network.groups["dp"].intra_node
        assert e.network.nccl_sms("dp_shard") == (5 if ub else 32)
        t[ub] = e.cost().duration_time_per_iter
    assert t[True] < t[False]


@pytest.mark.parametrize("fabric", ["nvl", "nvl+ib", "ib"])
@pytest.mark.parametrize("kind", ["gather", "reduce"])
def test_registered_buffers_and_sharp_never_hold_more(fabric: str, kind: str) -> None:
    """megatron-core's point of --use-nccl-ub and SHARP: fewer SMs, never more, than the
    conventional kernels at NCCL's Hopper cap."""
    conventional = dp_collective_sms(fabric, kind, False, False, 32)
    ub = dp_collective_sms(fabric, kind, True, False, 32)
    assert dp_collective_sms(fabric, kind, True, True, 32) <= ub <= conventional
    assert dp_collective_sms(fabric, kind, False, True, 32) == conventional  # SHARP alone: conventional kernels
