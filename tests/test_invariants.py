"""Invariants over random legal (model, strategy) pairs: dense and MoE (some with Gated DeltaNet
layers), TP/SP, CP, PP with
interleaving and uneven first / last stages, ZeRO 0-3 (Megatron-FSDP and FSDP2), HSDP,
optimizer CPU offload, activation offloading, recompute, TE versions, both reference systems.

One hypothesis test draws 1,000 pairs and checks every property on each (one draw, many
checks: cheaper than one draw per property):

* no exception; every time and byte count finite and positive;
* the estimate's iteration time and the event simulation's agree without cross-pass
  overlap, and the 1F1B closed form never undercuts them;
* full recompute never raises peak memory and never lowers the iteration time;
* selective recompute (any flag, Megatron module or SimuMax sub-block) never raises peak or
  stored activation memory — except core-attention recompute under CP a2a, whose checkpoint
  keeps the pre-all-to-all q, k and the fused QKV buffer (test_cp_a2a_core_attn_checkpoint);
* more micro-batches never raise the bubble fraction of a 1F1B pipeline (an interleaved one
  with unequal model chunks also idles in its steady state, counted in its bubble:
  test_unequal_chunks_idle_in_the_interleaved_steady_state);
* parameters summed over stages and TP / EP x ETP shards equal the model's count (a hand
  formula for dense models; the unsharded layout's count for MoE);
* ZeRO-1 optimizer bytes x (dp x cp) equal the unsharded (ZeRO-0) bytes for dense
  parameters, x edp for expert parameters.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as hs

from simumax import ConfigError, ModelConfig, StrategyConfig
from simumax.config.checks import check_compatible
from simumax.config.loader import load_system
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention as AttentionKernel
from simumax.graph.params import count_params, count_params_of
from simumax.graph.recompute import is_recomputed
from simumax.memory.model_states import optimizer_bytes_per_param

SYSTEMS = {"a100_pcie": load_system("a100_pcie"), "b200_bf16_ceperm": load_system("b200_bf16_ceperm")}


@hs.composite
def pairs(draw):
    heads = draw(hs.sampled_from([8, 16, 32]))
    kv = draw(hs.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    head_dim = draw(hs.sampled_from([64, 128]))
    tp = draw(hs.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]))
    cp = draw(hs.sampled_from([c for c in (1, 2) if (heads // tp) % c == 0]))
    pp = draw(hs.sampled_from([1, 2, 4]))
    vp = draw(hs.sampled_from([1, 2])) if pp > 1 else 1
    dp = draw(hs.sampled_from([1, 2, 4]))
    moe = draw(hs.booleans())
    fields = dict(
        hidden_size=heads * head_dim, head_num=heads, kv_head_num=kv, intermediate_size=tp * 64 * draw(hs.integers(4, 40)),
        layer_num=pp * vp * draw(hs.integers(1, 3)), vocab_size=1024 * draw(hs.integers(1, 64)),  # padding-free for tp <= 8
        use_swiglu=draw(hs.booleans()), norm_type=draw(hs.sampled_from(["rmsnorm", "layernorm"])),
        add_bias_linear=draw(hs.booleans()), untie_embeddings_and_output_weights=draw(hs.booleans()),
    )
    if cp == 1 and draw(hs.integers(0, 3)) == 0:  # sliding-window layers, every layer or alternating (gpt-oss)
        fields.update(window_size=draw(hs.sampled_from([64, 256])), window_attn_skip_freq=draw(hs.sampled_from([None, 2, 3])))
    ep = etp = 1
    if moe:
        experts = draw(hs.sampled_from([4, 8, 16]))
        ep = draw(hs.sampled_from([e for e in (1, 2, 4) if experts % e == 0 and (tp * dp * cp) % e == 0]))
        # expert tensor parallelism: its collectives ride in dispatch / combine too
        etp = draw(hs.sampled_from([t for t in (1, 2) if tp % t == 0 and (tp * dp * cp) % (ep * t) == 0]))
        fields.update(
            model_type="moe", expert_num=experts, topk=draw(hs.integers(1, 2)), moe_ffn_hidden_size=64 * draw(hs.integers(2, 16)),
            dense_layers=draw(hs.integers(0, 1)), add_bias_linear=False,
            moe_shared_expert_intermediate_size=draw(hs.sampled_from([None, 256])),
        )
    if draw(hs.integers(0, 3)) == 0:  # Gated DeltaNet layers (Qwen3-Next): their heads split over TP x CP
        k_heads = tp * cp * draw(hs.sampled_from([1, 2]))
        fields.update(experimental_attention_variant="gated_delta_net", linear_attention_freq=draw(hs.sampled_from([1, 2, 3])),
                      linear_num_key_heads=k_heads, linear_num_value_heads=k_heads * draw(hs.sampled_from([1, 2])),
                      linear_key_head_dim=draw(hs.sampled_from([32, 64])), linear_value_head_dim=draw(hs.sampled_from([32, 64])))
    seq = 512 * cp * draw(hs.integers(1, 4))
    st = dict(
        seq_len=seq, micro_batch_size=draw(hs.integers(1, 2)), micro_batch_num=pp * draw(hs.integers(1, 4)),
        world_size=tp * cp * pp * dp, tp_size=tp, cp_size=cp, pp_size=pp, interleaving_size=vp, ep_size=ep, etp_size=etp,
        enable_sequence_parallel=tp > 1 and draw(hs.booleans()), zero_state=draw(hs.sampled_from([0, 1, 2, 3])),
        cross_entropy_loss_fusion=draw(hs.booleans()), te_version=draw(hs.sampled_from([None, "2.1", "2.11.0"])),
    )
    # sharded DP, optimizer offload, HSDP and uneven first / last stages (issues 22, 23)
    if st["zero_state"] >= 1 and draw(hs.booleans()):
        st.update(optimizer_cpu_offload=True, optimizer_offload_fraction=draw(hs.sampled_from([0.5, 1.0])))
    if st["zero_state"] >= 1 and dp * cp > 1 and draw(hs.booleans()):
        st["fsdp_replicate_size"] = draw(hs.sampled_from([r for r in (2, 4) if (dp * cp) % r == 0] or [1]))
    if st["zero_state"] == 3 and draw(hs.booleans()):
        st["fsdp_impl"] = "torch_fsdp2"
        if pp == 1 and ep == 1 and fields["untie_embeddings_and_output_weights"] and draw(hs.booleans()):
            # Megatron's --use-torch-fsdp2: no HSDP, no distributed-optimizer offload, no wgrad fusion
            st.update(fsdp_impl="megatron_torch_fsdp2", gradient_accumulation_fusion=False, optimizer_cpu_offload=False,
                      optimizer_offload_fraction=1.0)
            st.pop("fsdp_replicate_size", None)
        # every reshard policy (always is refused under torch's pipelining)
        st["fsdp_reshard_after_forward"] = draw(hs.sampled_from(["default", "never"] + (["always"] if pp == 1 else [])))
    elif st["zero_state"] >= 1 and (st["zero_state"] == 1 or (pp == 1 and (st["zero_state"] == 2 or ep == 1))) \
            and "fsdp_replicate_size" not in st \
            and draw(hs.integers(0, 3)) == 0:
        st["fsdp_impl"] = "deepspeed"  # DeepSpeed runs ZeRO-2/3 without PP, and ZeRO-3 without EP
    if st.get("optimizer_cpu_offload"):  # torchtitan has no optimizer-only offload; Megatron's needs its precision-aware path
        if st.get("fsdp_impl") in ("torch_fsdp2", "megatron_torch_fsdp2"):
            st.update(optimizer_cpu_offload=False, optimizer_offload_fraction=1.0)
        elif st.get("fsdp_impl") != "deepspeed":
            st["use_precision_aware_optimizer"] = True
    if pp > 1 and vp == 1 and draw(hs.booleans()):
        fields["layer_num"] += 1  # one stage takes the extra layer (Megatron's uneven first / last stage)
        per = (fields["layer_num"] - 1) // pp
        st[draw(hs.sampled_from(["num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"]))] = per + 1
    if draw(hs.integers(0, 3)) == 0:  # fine-grained activation offloading (graph/offload.py)
        mods = draw(hs.lists(hs.sampled_from(["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                                              "moe_act"]), min_size=1, max_size=3, unique=True))
        st.update(fine_grained_activation_offloading=True, offload_modules=mods)
    rc = draw(hs.sampled_from(["none", "selective", "full_block"]))
    if rc == "none" and pp == 1 and fields["layer_num"] > 1 and not st.get("fine_grained_activation_offloading") \
            and draw(hs.integers(0, 3)) == 0:
        # TransformerEngine's layer offload of the first layers (Megatron: pp 1, no recompute)
        st.update(cpu_offloading=True, cpu_offloading_num_layers=draw(hs.integers(1, fields["layer_num"] - 1)))
    if rc == "selective":
        st.update(enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True,
                  mlp_recompute=draw(hs.booleans()))
    elif rc == "full_block":
        st.update(enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=draw(hs.integers(1, 3)),
                  recompute_method=draw(hs.sampled_from(("block", "uniform"))))
    model, strategy = ModelConfig(**fields), StrategyConfig(**st)
    system = SYSTEMS[draw(hs.sampled_from(sorted(SYSTEMS)))]
    try:
        check_compatible(model, strategy, system)
    except ConfigError:
        assume(False)
    return model, strategy, system


def dense_param_formula(m: ModelConfig) -> int:
    """Megatron GPT parameters by hand (Narayanan et al. 2021, with GQA, SwiGLU, biases)."""
    h, hd = m.hidden_size, m.head_size or m.hidden_size // m.head_num
    q, kv = m.head_num * hd, (m.kv_head_num or m.head_num) * hd
    norm = 2 * h if m.norm_type == "layernorm" else h
    bias = m.add_bias_linear
    attn = h * (q + 2 * kv) + q * h + (q + 2 * kv + h if bias else 0)
    fc1 = 2 * m.intermediate_size if m.use_swiglu else m.intermediate_size
    mlp = h * fc1 + m.intermediate_size * h + (fc1 + h if bias else 0)
    emb = m.vocab_size * h * (2 if m.untie_embeddings_and_output_weights else 1)
    return emb + m.layer_num * (attn + mlp + 2 * norm) + norm


def _unsharded(st: StrategyConfig) -> StrategyConfig:
    return st.with_updates({"tp_size": 1, "cp_size": 1, "pp_size": 1, "interleaving_size": 1, "ep_size": 1, "etp_size": 1,
                            "world_size": 1, "enable_sequence_parallel": False, "seq_len": 512, "micro_batch_num": 1,
                            "num_layers_in_first_pipeline_stage": None, "num_layers_in_last_pipeline_stage": None,
                            "fsdp_replicate_size": 1})


def _bubble_fraction(model, st, sy) -> float:
    c = Estimate(model, st, sy).cost()
    return c.breakdown["bubble"] / c.duration_time_per_iter


SELECTIVE_VARIANTS = [
    {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True},
    {"enable_recompute": True, "recompute_granularity": "selective_recompute", "mlp_recompute": True},
    {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True, "mlp_recompute": True,
     "mlp_rms_recompute": True},
    {"enable_recompute": True, "recompute_granularity": "attn_only", "recompute_layer_num": None},
    {"enable_recompute": True, "recompute_granularity": "mlp_only", "recompute_layer_num": 1},
    {"enable_recompute": True, "recompute_granularity": "sdp_only", "recompute_layer_num": None},
    *({"megatron_recompute": True, "megatron_recompute_modules": [m]}
      for m in ("core_attn", "mlp", "layernorm", "moe_act", "moe", "shared_experts")),
]
ATTN_CHECKPOINTS = {"attn_recompute", "sdp_only", "core_attn"}


def _checkpoints_core_attention(variant: dict) -> bool:
    names = {k for k, v in variant.items() if v is True} | {variant.get("recompute_granularity")}
    return bool(names & ATTN_CHECKPOINTS) or "core_attn" in variant.get("megatron_recompute_modules", [])


def _attention_keeps_copies(est: Estimate) -> bool:
    """Flash attention that keeps tensors of its own instead of its inputs (TE's contiguous
    v after RoPE, the CP schemes' copies), where a core-attention checkpoint keeps the
    inputs themselves (v a view of the whole QKV buffer): read off the IR's attention op."""
    attn = next((o for c in est.chunks for o in c.ops if o.module == "core_attn"), None)
    if attn is None or not any(isinstance(k, AttentionKernel) for k in attn.fwd):
        return False
    own = {n for n, _ in attn.saved} - {n for n, _ in attn.input} - {attn.output[0] if attn.output else None, f"{attn.name}.lse"}
    return bool(own)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pairs(), hs.integers(1, 6), hs.sampled_from(SELECTIVE_VARIANTS))
def test_invariants_hold_on_random_pairs(case, extra_mb, selective) -> None:
    model, st, sy = case
    est = Estimate(model, st, sy)
    cost, mem = est.cost(), est.memory()

    # finite and positive
    t = cost.duration_time_per_iter
    assert math.isfinite(t) and t > 0 and 0 < cost.mfu < 1
    assert all(v >= 0 and math.isfinite(v) for v in cost.breakdown.values())
    for s in mem.stages:
        assert math.isfinite(s.peak_mem_with_reserved) and s.peak_mem > s.model_mem > 0
        assert s.fwd_activation_cache_per_micro_batch > 0 and s.params > 0

    # a layer renamed from the first of its kind (graph/relabel.py) is the layer built for itself
    src = est.layer_profiles.source
    for chunk in est.chunks:
        for pos, layer in enumerate(chunk.layers):
            rec = is_recomputed(st, pos)
            assert src.layer(layer, rec) == src.built_layer(layer, rec), (layer, rec)
    # parameters counted per layer kind (times its layers) = counted op by op over every
    # layer's own ops (Stage.ops, not the per-kind groups count_params reads)
    assert est.params == count_params(model, st, est.stages) == count_params_of(model, st, ((s.ops, 1) for s in est.stages))

    # layers share costs only with layers of their kind: a chunk costs what its own ops do
    if st.zero_state < 2 and not (st.fine_grained_activation_offloading or st.cpu_offloading):
        lp = est.layer_profiles
        for chunk, ct in zip(est.chunks, est.chunk_times):
            own = lp._ops_time(chunk.ops)
            for phase in ("fwd", "bwd_input", "bwd_weight", "recompute"):
                assert math.isclose(getattr(own, phase).total, getattr(ct, phase).total, rel_tol=1e-9, abs_tol=1e-15), phase
            assert [o.name for o, _ in ct.op_times] == [o.name for o in chunk.ops]

    # analytic pipeline = event simulation (no overlap options are drawn); the textbook
    # closed form is exact for 1F1B unless an earlier stage is the bottleneck, where the
    # real schedule (warm-up forwards run ahead) is faster
    assert not est.needs_simulation
    sim = est.simulate().total
    assert math.isclose(sim, t, rel_tol=1e-9), (sim, t)
    closed = max(est.closed_form_ends()[1])
    assert closed >= t * (1 - 1e-9) or st.interleaving_size > 1

    # full recompute: no more memory, no less time
    # (offloading can keep less than a checkpoint, which offloads nothing: compared without it)
    if st.recompute_mode == "none" and not st.fine_grained_activation_offloading and not st.cpu_offloading:
        full = Estimate(model, st.with_updates({"enable_recompute": True, "recompute_granularity": "full_block",
                                                "recompute_layer_num": None}), sy)
        assert full.memory().peak_mem <= mem.peak_mem
        assert full.cost().duration_time_per_iter >= t
        # selective recompute frees what its group saved and keeps the group's inputs
        if not (_attention_keeps_copies(est) and _checkpoints_core_attention(selective)):
            try:
                sel = Estimate(model, st.with_updates(selective), sy).memory()
            except ConfigError:  # e.g. MoE modules on a dense model
                sel = None
            for a, b in zip(sel.stages if sel else [], mem.stages):
                assert a.peak_mem <= b.peak_mem * (1 + 1e-12), (selective, a.peak_mem, b.peak_mem)
                assert a.stored_activation_mem <= b.stored_activation_mem * (1 + 1e-12), selective

    # more micro-batches: no less time, no less memory (more in flight, or as many), and the
    # bubble fraction of a 1F1B pipeline does not rise
    more = Estimate(model, st.with_updates({"micro_batch_num": st.micro_batch_num + extra_mb * st.pp_size}), sy)
    more_cost = more.cost()
    assert more_cost.duration_time_per_iter >= t and more.memory().peak_mem >= mem.peak_mem * (1 - 1e-12)
    if st.interleaving_size == 1:
        bubble = cost.breakdown["bubble"] / t
        assert more_cost.breakdown["bubble"] / more_cost.duration_time_per_iter <= bubble + 1e-12

    # parameters over stages and shards = the model's count
    total = est.params.total
    if model.is_moe or model.has_linear_attention:
        assert total == Estimate(model, _unsharded(st), sy).params.total
    else:
        assert total == dense_param_formula(model)

    # ZeRO-1 shards the optimizer over dp x cp (dense) and edp (experts)
    plain = {"optimizer_cpu_offload": False, "use_precision_aware_optimizer": False, "fsdp_replicate_size": 1,
             "fsdp_impl": "megatron_fsdp", "fsdp_reshard_after_forward": "default"}
    z1 = Estimate(model, st.with_updates({**plain, "zero_state": 1}), sy).memory()
    z0 = Estimate(model, st.with_updates({**plain, "zero_state": 0}), sy).memory()
    per_param = optimizer_bytes_per_param(st)
    for a, b, stage in zip(z1.stages, z0.stages, est.stages):
        expert = stage.expert_params
        dense = stage.params - expert
        assert b.optimizer == per_param * stage.params
        assert math.isclose(a.optimizer * st.dp_size * st.cp_size, per_param * (dense + expert * st.dp_size * st.cp_size / st.edp_size))
        if not model.is_moe:
            assert math.isclose(a.optimizer * st.dp_size * st.cp_size, b.optimizer)
        assert a.weights == b.weights and a.grads == b.grads


def test_uniform_1f1b_bubble_fraction() -> None:
    from simumax.schedule.one_f_one_b import pipeline_time

    for p, m in [(2, 4), (4, 8), (8, 3)]:
        t = pipeline_time([(1.0, 2.0)] * p, m)
        assert t.bubble / t.total == (p - 1) / (m + p - 1)


def test_unequal_chunks_idle_in_the_interleaved_steady_state() -> None:
    """Why the bubble-fraction invariant above is a 1F1B one. An interleaved pipeline whose
    model chunks cost differently (here Gated DeltaNet and attention layers, and ZeRO-2's
    per-micro-batch gradient reduce-scatter, larger on the embedding's and the head's chunks)
    waits on its slower chunks in every steady period, not only in its fill and drain: past
    the warm-up the critical rank's idle grows by the same amount per group of pp
    micro-batches, so its share of the iteration can creep up where little else grows (a random
    draw with optimizer offload: 5.116 % at 4 micro-batches, 5.127 % at 8). The breakdown
    counts that wait as ``stage_imbalance`` (the steady state's idle per micro-batch, times the
    micro-batches) and keeps ``bubble`` for the fill and drain, which do not grow; the
    iteration time is the event engine's either way, and so is the split after simulate()."""
    sy = SYSTEMS["a100_pcie"]
    model = ModelConfig.init_from_dict(dict(
        model_name="gdn", hidden_size=4096, head_num=32, kv_head_num=1, intermediate_size=256, layer_num=8, vocab_size=18432,
        use_swiglu=False, untie_embeddings_and_output_weights=False, experimental_attention_variant="gated_delta_net",
        linear_attention_freq=3, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2))
    idle, bubble, imbalance = [], [], []
    for m in (4, 8, 12, 16, 20, 40):
        st = StrategyConfig.init_from_dict(dict(seq_len=1024, micro_batch_num=m, world_size=8, pp_size=4, cp_size=2,
                                                interleaving_size=2, zero_state=2))
        est = Estimate(model, st, sy)
        cost = est.cost()
        assert math.isclose(est.simulate().end_of_backward[0], est.iteration_times.end_of_backward[0], rel_tol=1e-9)
        after = est.cost().breakdown  # the full recorded run now gives the times: the same split
        assert math.isclose(after["stage_imbalance"], cost.breakdown["stage_imbalance"], rel_tol=1e-9, abs_tol=1e-12)
        idle.append(cost.breakdown["bubble"] + cost.breakdown["stage_imbalance"])
        bubble.append(cost.breakdown["bubble"])
        imbalance.append(cost.breakdown["stage_imbalance"])
    counts = (4, 8, 12, 16, 20, 40)
    steps = [(b - a) / (mb - ma) for a, b, ma, mb in zip(idle[1:], idle[2:], counts[1:], counts[2:])]  # per micro-batch
    assert steps[0] > 1e-5 and all(math.isclose(s, steps[0], rel_tol=1e-6) for s in steps)
    assert all(math.isclose(b, bubble[0], rel_tol=1e-6) for b in bubble)  # fill and drain
    assert all(math.isclose(i / m, steps[0], rel_tol=1e-6) for i, m in zip(imbalance, counts))


OVERLAPS = ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "overlap_p2p_comm",
            "defer_embedding_wgrad_compute")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(pairs(), hs.fixed_dictionaries({k: hs.booleans() for k in OVERLAPS}), hs.booleans(),
       hs.sampled_from(["1f1b", "interleaved", "zb", "dualpipev"]))
def test_breakdown_sums_to_the_iteration_time(case, overlaps, ep_overlap, schedule) -> None:
    """Every option on or off, every schedule: the printed parts add up to the iteration
    time exactly, and none is negative (parts are exposed time, not total communication)."""
    model, st, sy = case
    extra = dict(overlaps)
    if ep_overlap and model.is_moe and st.ep_size > 1:
        extra["overlap_moe_expert_parallel_comm"] = True
    if overlaps["overlap_p2p_comm"] and st.pp_size == 1:
        extra["overlap_p2p_comm"] = False
    # as Megatron allows them: the gather's overlap with the reduce's and a sharded optimizer, TP's with SP
    extra["overlap_param_gather"] &= overlaps["overlap_grad_reduce"] and st.zero_state >= 1
    extra["tp_comm_overlap"] &= st.tp_size > 1 and st.enable_sequence_parallel
    if schedule != "1f1b":
        extra["pp_schedule"] = schedule
    try:
        st2 = st.with_updates(extra)
        est = Estimate(model, st2, sy)
    except ConfigError:
        assume(False)
    cost = est.cost()
    parts = cost.breakdown
    assert all(v >= -1e-12 for v in parts.values()), parts
    if not model.is_moe:  # no expert all-to-all, so none hidden either (not a rounding residue)
        assert "ep_comm" not in parts, parts
    if st2.pp_size == 1:  # nothing sent between stages
        assert parts["pp_p2p"] == 0.0, parts
    assert math.isclose(sum(parts.values()), cost.duration_time_per_iter, rel_tol=1e-9), (sum(parts.values()), cost.duration_time_per_iter, parts)


def test_core_attn_checkpoint_keeps_its_inputs() -> None:
    """The one selective recompute that raises memory, as Megatron runs it: the core-attention
    checkpoint (Megatron-Core ``Attention._checkpointed_attention_forward`` ->
    ``tensor_parallel.checkpoint``) saves its arguments: the RoPE'd q and k and v, a view that
    keeps the whole fused QKV output alive. Without it, TransformerEngine's attention saves
    its own contiguous copies: CP a2a (``AttnFuncWithCPAndQKVOA2A``) its post-all-to-all q,
    k, v, the others RoPE's q, k and the copy of v that ``get_qkv_layout`` makes (a strided
    view beside contiguous q, k), with the fp32 log-sum-exp; the QKV buffer dies. Per
    recomputed layer the checkpoint therefore holds q + k more and the lse less, with or
    without CP."""
    sy = SYSTEMS["a100_pcie"]
    s, h, hd = 1024, 1024, 128
    for kv in (8, 2):
        m = ModelConfig(hidden_size=h, head_num=8, kv_head_num=kv, intermediate_size=4096, layer_num=2, vocab_size=4096,
                        use_swiglu=True, norm_type="rmsnorm")
        for cp, cp_comm in ((2, "a2a"), (2, "p2p"), (2, "all_gather"), (1, "p2p")):
            tokens = s // cp
            q, k, lse = tokens * h * 2, tokens * kv * hd * 2, 8 * tokens * 4
            base = dict(seq_len=s, micro_batch_size=1, micro_batch_num=1, world_size=cp, cp_size=cp, cp_comm_type=cp_comm)
            none = Estimate(m, StrategyConfig(**base), sy).memory().stages[0]
            sel = Estimate(m, StrategyConfig(**base, enable_recompute=True, recompute_granularity="selective_recompute",
                                             attn_recompute=True), sy).memory().stages[0]
            assert sel.stored_activation_mem - none.stored_activation_mem == 2 * (q + k - lse), (kv, cp, cp_comm)


def test_kernels_of_different_kinds_never_compare_equal() -> None:
    """Kernels are named tuples (built by the thousand, hashed in every cost cache), and
    tuples compare by their values only: kinds with the same number of fields must differ
    in the type of one of them, so a cache keyed by kernels can never take one kind for
    another."""
    import itertools
    import typing

    from simumax.graph import kernels

    def base(t: object) -> set[type]:
        if typing.get_origin(t) is typing.Literal:
            return {type(a) for a in typing.get_args(t)}
        args = typing.get_args(t)
        return set().union(*(base(a) for a in args)) if args else {t}  # type: ignore[arg-type]

    kinds = typing.get_args(kernels.Kernel)
    assert len(kinds) == 5
    for a, b in itertools.combinations(kinds, 2):
        ha, hb = typing.get_type_hints(a), typing.get_type_hints(b)
        if len(a._fields) != len(b._fields):
            continue
        # bool is an int to ==: the two must differ in a field that is a str in one, a number in the other
        apart = [(x, y) for x, y in zip(a._fields, b._fields)
                 if (base(ha[x]) == {str}) != (base(hb[y]) == {str})]
        assert apart, (a.__name__, b.__name__)
    g = kernels.Gemm(8, 8, 8, "TN")
    assert g != kernels.GroupGemm(8, 8, 8, 8, "fwd") and hash(g) == hash(kernels.Gemm(8, 8, 8, "TN"))


def test_op_with_replaces_fields_as_replace_does() -> None:
    """Op.with_ (the graph passes' copy) equals the named tuple's own _replace and refuses
    a field the op does not have."""
    from simumax.graph.kernels import MemBound
    from simumax.graph.ops import Op

    o = Op(name="L1.attn_norm", module="attn_norm", layer=1, fwd=(MemBound("attn_norm.fwd", 8.0),), saved=(("L1.x", 8.0),))
    for kw in ({"output": ("L1.y", 4.0)}, {"name": "L2.attn_norm", "layer": 2, "params": 3}, {}):
        got = o.with_(**kw)
        assert got == o._replace(**kw) and type(got) is Op
    with pytest.raises(ValueError, match="no field"):
        o.with_(outputs=())
