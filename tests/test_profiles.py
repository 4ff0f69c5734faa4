"""The per-layer profile cache changes speed, never results: estimates that share one
give exactly what fresh estimates give, over layouts, recompute, MoE with dense layers,
interleaving and split-backward schedules."""

from __future__ import annotations

import json

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.estimate import Estimate
from simumax.profiles import ProfileCache

A100 = load_system("a100_pcie")


def _results(est: Estimate) -> str:
    cost = est.cost().to_dict()  # efficiency_lookups included: attributed per estimate
    return json.dumps({"cost": cost, "mem": est.memory().to_dict()}, sort_keys=True)


DENSE = load_model("llama3-8b").with_updates({"layer_num": 12})
MOE = load_model("deepseek-v2-lite").with_updates({"layer_num": 8})  # 1 dense layer, then MoE
BASE = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 2048})
VARIANTS = [
    {"pp_size": 1, "world_size": 8},
    {"pp_size": 2},
    {"pp_size": 4, "world_size": 8, "tp_size": 2, "enable_sequence_parallel": True},
    {"pp_size": 4, "world_size": 8, "num_layers_in_first_pipeline_stage": 2, "num_layers_in_last_pipeline_stage": 4, "micro_batch_num": 8},
    {"pp_size": 2, "interleaving_size": 2, "micro_batch_num": 4},
    {"pp_size": 2, "pp_schedule": "zb", "micro_batch_num": 6},
    {"pp_size": 2, "pp_schedule": "dualpipev", "micro_batch_num": 6},
    {"pp_size": 2, "zero_state": 0, "overlap_grad_reduce": True},
    {"pp_size": 2, "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 2},
    {"pp_size": 2, "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 5},
    {"pp_size": 2, "enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True, "mlp_recompute": True},
]


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_shared_cache_gives_fresh_results(model) -> None:
    shared = ProfileCache(model, A100)
    strategies = []
    for v in VARIANTS:
        st = BASE.with_updates(v)
        if model.is_moe:
            st = st.with_updates({"ep_size": 2})
        strategies.append(st)
    # every strategy twice through the shared cache, in an order where families repeat
    for st in strategies + strategies[::-1]:
        assert _results(Estimate(model, st, A100, shared)) == _results(Estimate(model, st, A100))
    assert len(shared) < len(strategies)  # families were shared


def test_layout_changes_do_not_split_families() -> None:
    shared = ProfileCache(DENSE, A100)
    for pp, world in ((1, 8), (2, 8), (4, 8), (2, 16)):
        for zero in (0, 1):
            Estimate(DENSE, BASE.with_updates({"pp_size": pp, "world_size": world, "zero_state": zero}), A100, shared).cost()
    assert len(shared) == 1


def test_cache_of_another_model_is_refused() -> None:
    with pytest.raises(ValueError, match="another model"):
        Estimate(DENSE, BASE, A100, ProfileCache(MOE, A100))


def test_checkpoint_variants_share_plain_layer_ops() -> None:
    # which ops are checkpointed does not change the ops themselves: families that differ
    # only in that build each layer once (and tag copies for the recomputed layers)
    from simumax.cost.network import NetworkModel

    shared = ProfileCache(MOE, A100)
    plain = BASE.with_updates({"ep_size": 2})
    full = plain.with_updates({"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 1})
    fams = [shared.family(st, NetworkModel(A100, st)) for st in (plain, full)]
    assert fams[0] is not fams[1]
    assert fams[0].source.layer(3, False) is fams[1].source.layer(3, False)
    assert all(o.recompute_group == "L3.block" for o in fams[1].source.layer(3, True))
    assert _results(Estimate(MOE, full, A100, shared)) == _results(Estimate(MOE, full, A100))


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
def test_checkpoint_fields_leave_the_plain_ops_unchanged(model) -> None:
    # the premise of sharing plain ops across CHECKPOINT_FIELDS: layer_ops never reads them
    from simumax.graph.dims import Dims
    from simumax.graph.model_graph import layer_ops

    base = BASE.with_updates({"ep_size": 2} if model.is_moe else {})
    variants = [
        {"enable_recompute": True, "recompute_granularity": "full_block"},
        {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True, "mlp_recompute": True,
         "mla_rms_recompute": True, "mlp_rms_recompute": True},
        {"enable_recompute": True, "megatron_recompute": True, "megatron_recompute_modules": ["core_attn", "moe_act", "layernorm"]},
    ]
    for layer in (0, model.layer_num - 1):
        want = layer_ops(model, base, Dims.of(model, base), layer)
        for v in variants:
            st = base.with_updates(v)
            assert layer_ops(model, st, Dims.of(model, st), layer) == want


def test_shared_cache_with_fp8_amax_and_mtp_over_layouts() -> None:
    """Each chunk's fp8 amax all-reduce runs on the DP group, whose size changes with the
    layout, and the MTP block's own ops are the chunk's: shared through a search's cache
    over PP sizes they still cost what fresh estimates give (they did not: the family
    costed the amax on its first layout's DP group, 0.02-0.2 % off)."""
    model = load_model("deepseek-v3-mtp").with_updates({"layer_num": 8})
    h100 = load_system("h100-sxm-80gb")
    base = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"world_size": 64, "seq_len": 2048, "fp8": True, "micro_batch_num": 8})
    shared = ProfileCache(model, h100)
    for pp in (1, 2, 4, 8, 2, 1):
        st = base.with_updates({"pp_size": pp})
        assert _results(Estimate(model, st, h100, shared)) == _results(Estimate(model, st, h100)), pp


def test_estimates_without_a_cache_share_the_one_kept_with_the_system() -> None:
    """SimuMax scripts make a PerfLLM per strategy with the same config objects: those
    estimates share one ProfileCache, kept with the system config, with the results of a
    private one; another model object takes the slot, an in-place edit renews it, and a
    copy or pickle of a config starts without the caches."""
    import pickle

    from simumax.api import PerfLLM

    m, y = load_model("llama3-8b").with_updates({"layer_num": 4}), load_system("a100_pcie")
    st1, st2 = load_strategy("tp1_pp2_dp4_mbs1"), load_strategy("tp2_pp1_dp4_mbs1")
    a, b = Estimate(m, st1, y), Estimate(m, st2, y)
    assert a.profiles is b.profiles is ProfileCache.of(m, y)
    assert a.cost().duration_time_per_iter == Estimate(m, st1, y, ProfileCache(m, y)).cost().duration_time_per_iter
    p1, p2 = (PerfLLM().configure(model_config=m, strategy_config=st1, system_config=y) for _ in range(2))
    assert p1.run_estimate()._estimate.profiles is p2.run_estimate()._estimate.profiles  # type: ignore[union-attr]
    other = m.model_copy(deep=True)
    c = Estimate(other, st1, y)
    assert c.profiles is not a.profiles and c.profiles.model is other
    before = c.cost().duration_time_per_iter
    other.layer_num = 2  # an edit in place: a new cache, and the estimate sees the edit
    d = Estimate(other, st1, y)
    assert d.profiles is not c.profiles and d.cost().duration_time_per_iter < before
    y.accelerator.bandwidth["default"].efficient_factor /= 2  # the system edited in place too
    e = Estimate(other, st1, y)
    assert e.profiles is not d.profiles and e.cost().duration_time_per_iter > d.cost().duration_time_per_iter
    assert y._derived and y.model_copy(deep=True)._derived == {} and pickle.loads(pickle.dumps(y))._derived == {}
    assert y.accelerator.model_copy(deep=True)._derived == {}


@pytest.mark.parametrize("case", [
    ("llama3-8b", "tp1_pp2_dp4_mbs1", "a100_pcie", {}),
    ("deepseek-v2-lite", "tp1_pp2_dp4_mbs1", "h100-sxm-80gb", {"world_size": 64, "ep_size": 8, "fp8": True, "tp_size": 2,
                                                                "enable_sequence_parallel": True, "tp_comm_overlap": True,
                                                                "overlap_grad_reduce": True}),
])
def test_a_dropped_estimate_is_freed_without_the_cyclic_gc(case) -> None:
    """The caches kept with a config (its profile cache, kernel costs, table fits) must not
    refer back to it: else every estimate's whole graph — configs, ops, schedules, buckets —
    outlives its last user until a full garbage collection, which a cold search or script
    pays as pauses that grow with the heap. Nothing an estimate leaves behind is cyclic."""
    import gc

    from simumax.api import PerfLLM

    name, strat, sysname, updates = case
    m = load_model(name).with_updates({"layer_num": 4})
    st = load_strategy(strat).with_updates({"seq_len": 2048, **updates})
    y = load_system(sysname)
    gc.collect()
    gc.disable()
    try:
        p = PerfLLM().configure(model_config=m.model_copy(deep=True), strategy_config=st.model_copy(deep=True),
                                system_config=y.model_copy(deep=True))
        p.run_estimate()
        p.analysis_cost()
        p.analysis_mem()
        del p
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_an_estimated_perfllm_pickles_and_copies() -> None:
    """The profile cache holds its system weakly (above); a PerfLLM that has estimated still
    pickles and deep-copies, and the copy's cache refers to the copy's system."""
    import copy
    import pickle

    from simumax.api import PerfLLM

    p = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config=load_model("llama3-8b").with_updates({"layer_num": 4}),
                            system_config="a100_pcie")
    t = p.run_estimate().analysis_cost().duration_time_per_iter
    for q in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert q._estimate.profiles.system is q.system_config is not p.system_config  # type: ignore[union-attr]
        q.strategy_config.micro_batch_num *= 2  # an edit re-estimates on the copy's configs
        assert q.analysis_cost().duration_time_per_iter > t
