"""Every strategy option on the shipped models and presets: an estimate either refuses the
combination with a ConfigError or gives finite, non-negative parts that add up to its
iteration time, inside its 80 % band. The random pairs of test_invariants.py use synthetic
models on the two reference systems; this draws the real models (MLA, MoE with expert TP,
GQA, learned positions) on presets (fp8 / fp4 recipes by device, NVL72, MI300X) with the
options those pairs leave out: fp8 recipes, CP schemes, dispatchers, grouped-GEMM modes,
every overlap flag, schedules, TE versions, dtypes, DDP buckets, sharded DP, offload and
recompute variants. (A negative ep_comm with expert TP and the EP overlap was found so.)"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs

from simumax import ConfigError, StrategyConfig
from simumax.config.loader import load_model, load_system
from simumax.estimate import Estimate

MODELS = {name: load_model(name) for name in ("llama3-8b", "deepseekv2-lite", "mixtral-8x1b", "deepseekv3", "gpt3-175b", "qwen3-32b")}
SYSTEMS = {name: load_system(name) for name in ("a100_pcie", "b200_bf16_ceperm", "h100-sxm-80gb", "gb200-nvl72", "mi300x")}
FLAGS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "overlap_p2p_comm", "overlap_moe_expert_parallel_comm",
         "delay_wgrad_compute", "defer_embedding_wgrad_compute", "pp_comm_async", "cross_entropy_loss_fusion", "enable_dropout",
         "enable_straggler_model", "grad_reduce_in_bf16", "moe_permute_fusion", "dispatch_probs", "gradient_accumulation_fusion",
         "ddp_average_in_collective", "nccl_ub", "use_sharp")


@hs.composite
def jobs(draw):
    name = draw(hs.sampled_from(sorted(MODELS)))
    model = MODELS[name]
    tp, pp, cp, dp = (draw(hs.sampled_from(xs)) for xs in ((1, 2, 4, 8), (1, 2, 4), (1, 2), (1, 2, 4)))
    vp = draw(hs.sampled_from((1, 2))) if pp > 1 else 1
    layers = pp * vp * draw(hs.integers(1, 2)) + (1 if model.model_type == "moe" and draw(hs.booleans()) and vp == 1 else 0)
    updates = {"layer_num": max(layers, 2) if pp == 1 else layers}
    if model.model_type == "moe":
        updates["dense_layers"] = min(model.dense_layers or 0, draw(hs.integers(0, 1)))
    model = model.with_updates(updates)
    ep = draw(hs.sampled_from((1, 2, 4))) if model.model_type == "moe" else 1
    st = dict(seq_len=draw(hs.sampled_from((2048, 4096))) * cp, micro_batch_size=draw(hs.integers(1, 2)),
              micro_batch_num=pp * draw(hs.integers(1, 3)), world_size=tp * pp * cp * dp, tp_size=tp, pp_size=pp, cp_size=cp,
              interleaving_size=vp, ep_size=ep, etp_size=draw(hs.sampled_from((1, tp))) if ep > 1 else 1,
              enable_sequence_parallel=tp > 1, zero_state=draw(hs.sampled_from((0, 1, 2, 3))),
              cp_comm_type=draw(hs.sampled_from(("a2a", "all_gather", "p2p", "a2a+p2p"))),
              moe_dispatcher_policy=draw(hs.sampled_from(("all2all", "all_gather", "flex"))),
              group_linear_mode=draw(hs.sampled_from(("grouped", "serial", "merged"))),
              te_version=draw(hs.sampled_from((None, "1.13", "2.1", "2.11.0"))), dtype=draw(hs.sampled_from(("bf16", "bf16", "fp16"))),
              ddp_bucket_size=draw(hs.sampled_from((None, 1_000_000))), pp_schedule=draw(hs.sampled_from((None, "zb", "dualpipev"))),
              **{f: draw(hs.booleans()) for f in FLAGS})
    st.update(rank_order=draw(hs.sampled_from(("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"))))
    # as Megatron allows them: the gather's overlap with the reduce's and a sharded optimizer, TP's with SP
    st["overlap_param_gather"] &= st["overlap_grad_reduce"] and st["zero_state"] >= 1
    st["tp_comm_overlap"] &= tp > 1
    if st["overlap_param_gather"] and st["zero_state"] == 1 and vp > 1:
        st.update(overlap_param_gather_with_optimizer_step=draw(hs.booleans()))
    if st["cp_comm_type"] == "a2a+p2p":
        a = draw(hs.sampled_from([k for k in range(1, cp + 1) if cp % k == 0]))
        st.update(hierarchical_context_parallel_sizes=[a, cp // a])
    low = draw(hs.sampled_from(("none", "none", "fp8", "fp4")))
    if low == "fp8":
        recipe = draw(hs.sampled_from(("delayed", "tensorwise", "blockwise", "mxfp8")))
        st.update(fp8=True, fp8_recipe=recipe, fp8_weight_caching=draw(hs.booleans()),
                  first_last_layers_bf16=recipe != "delayed" and draw(hs.booleans()))  # Megatron: not with delayed
    elif low == "fp4":
        st.update(fp4=True, fp4_recipe="nvfp4")
    if st["zero_state"] and draw(hs.booleans()):
        st.update(fsdp_impl=draw(hs.sampled_from(("megatron_fsdp", "torch_fsdp2", "megatron_torch_fsdp2", "deepspeed"))),
                  fsdp_replicate_size=draw(hs.sampled_from((1, 2))), optimizer_cpu_offload=draw(hs.booleans()))
        if st["fsdp_impl"] == "megatron_torch_fsdp2":  # Megatron refuses gradient-accumulation fusion there
            st["gradient_accumulation_fusion"] = False
    if (model.model_type == "moe" and model.moe_shared_expert_intermediate_size and st["moe_dispatcher_policy"] == "all2all"
            and not st.get("overlap_moe_expert_parallel_comm")):
        st.update(moe_shared_expert_overlap=draw(hs.booleans()))
    if low == "fp8" and st["zero_state"] == 1 and st.get("fsdp_impl") != "deepspeed":
        st.update(fp8_param_gather=draw(hs.booleans()))
    if st["zero_state"] and st.get("fsdp_impl", "megatron_fsdp") == "megatron_fsdp" and draw(hs.booleans()):
        dtypes = hs.sampled_from(("fp32", "fp16", "bf16", "fp8"))
        st.update(use_precision_aware_optimizer=True, exp_avg_dtype=draw(dtypes), exp_avg_sq_dtype=draw(dtypes),
                  main_params_dtype=draw(hs.sampled_from(("fp32", "fp16"))), store_param_remainders=draw(hs.booleans()))
    extra = draw(hs.sampled_from(("none", "full", "selective", "megatron", "offload")))
    if extra == "full":
        st.update(enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=draw(hs.sampled_from((None, 1, 2))),
                  recompute_method=draw(hs.sampled_from(("block", "uniform"))))
    elif extra == "selective":
        st.update(enable_recompute=True, recompute_granularity=draw(hs.sampled_from(("selective_recompute", "attn_only", "mlp_only",
                                                                                      "sdp_only"))),
                  attn_recompute=True, mlp_recompute=draw(hs.booleans()), mla_rms_recompute=draw(hs.booleans()))
    elif extra == "megatron":
        st.update(megatron_recompute=True, megatron_recompute_modules=draw(hs.lists(hs.sampled_from(
            ("core_attn", "mlp", "layernorm", "moe_act", "moe", "shared_experts", "mla_up_proj")), min_size=1, max_size=2, unique=True)))
    elif extra == "offload":
        st.update(fine_grained_activation_offloading=True, offload_modules=draw(hs.lists(hs.sampled_from(
            ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")), min_size=1, max_size=2, unique=True)))
    system = SYSTEMS[draw(hs.sampled_from(sorted(SYSTEMS)))]
    try:
        est = Estimate(model, StrategyConfig(**st), system)
        est.stages
    except ConfigError:
        assume(False)
    return est


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(jobs())
def test_any_legal_option_set_gives_exact_non_negative_parts(est: Estimate) -> None:
    try:
        cost, mem = est.cost(), est.memory()
    except ConfigError:  # a rule checked only once the graph is built (e.g. the system's fp8 / fp4 peak)
        assume(False)
    t = cost.duration_time_per_iter
    assert math.isfinite(t) and t > 0
    parts = cost.breakdown
    assert all(math.isfinite(v) and v >= -1e-12 * t for v in parts.values()), parts
    assert math.isclose(sum(parts.values()), t, rel_tol=1e-9), (sum(parts.values()), t, parts)
    low, high = cost.duration_time_interval
    assert low <= t <= high
    assert 0 < cost.mfu < 1
    assert all(math.isfinite(s.peak_mem_with_reserved) and s.peak_mem > s.model_mem > 0 for s in mem.stages)
