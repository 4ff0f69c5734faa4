"""ZeRO-2 / ZeRO-3 (Megatron-FSDP optim_grads / optim_grads_params; issue 23 part 1-3):
memory per level, communication volumes by hand (the ZeRO paper's 2x vs 3x), the
per-layer collectives hidden under compute, flags and the search."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.dp import optimizer_step
from simumax.dp.optimizer_step import offloaded_step
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags
from simumax.graph.kernels import Collective, MemBound
from simumax.graph.sharding import MODULE
from simumax.importers.megatron_args import parse_megatron_args
from simumax.errors import ConfigError
from simumax.memory.deepspeed_states import offload_buffer
from simumax.memory.model_states import model_states, optimizer_bytes_per_param

from tests.conftest import run_cli

H100 = load_system("h100-sxm-80gb")
LLAMA70 = {"seq_len": 4096, "world_size": 64, "tp_size": 4, "enable_sequence_parallel": True, "micro_batch_num": 4,
           "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None}


def test_peak_memory_strictly_decreases_with_the_zero_level() -> None:
    """Llama3-70B on 64 H100, TP4, full recompute (the issue's target)."""
    m = load_model("llama3-70b")
    peaks = [Estimate(m, load_strategy({**LLAMA70, "zero_state": z}), H100).memory().peak_mem for z in range(4)]
    assert peaks[0] > peaks[1] > peaks[2] > peaks[3]


def _sharding_bytes(est: Estimate) -> dict[str, float]:
    out = {"all_gather": 0.0, "reduce_scatter": 0.0}
    for s in est.chunks:
        for o in s.ops:
            if o.module == MODULE:
                for ph in ("fwd", "bwd_input", "bwd_weight"):
                    for k in o.kernels(ph):
                        if not isinstance(k, Collective):  # FSDP2's copy-out of a gather (test_fsdp2_torch.py)
                            continue
                        assert k.group == "dp"
                        out[k.op] += k.bytes
    return out


def test_communication_volume_by_hand() -> None:
    """Per micro-batch, ZeRO-3 gathers every parameter twice (forward, and again for the
    backward after resharding) and reduce-scatters every gradient once: 3x the parameter
    bytes with bf16 gradients (Rajbhandari et al. 2020, section 7); ZeRO-2 reduce-scatters
    only; ZeRO-1 moves 2x once per iteration (gradients reduce-scattered, parameters
    gathered) and nothing per micro-batch."""
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    base = {"seq_len": 4096, "world_size": 8, "micro_batch_num": 2, "use_fp32_accum_grad": False}
    z3 = Estimate(m, load_strategy({**base, "zero_state": 3}), H100)
    params = z3.params.total
    assert _sharding_bytes(z3) == {"all_gather": 2 * 2 * params, "reduce_scatter": 2 * params}  # bf16: 2 B each
    z2 = Estimate(m, load_strategy({**base, "zero_state": 2}), H100)
    assert _sharding_bytes(z2) == {"all_gather": 0.0, "reduce_scatter": 2 * params}
    z1 = Estimate(m, load_strategy({**base, "zero_state": 1}), H100)
    assert _sharding_bytes(z1) == {"all_gather": 0.0, "reduce_scatter": 0.0}
    # per iteration: ZeRO-1 reduces and gathers; ZeRO-2 only gathers the updated parameters; ZeRO-3 nothing
    stage = z1.stages[0]
    assert z1.dp_reduce_time(stage) > 0 and z1.dp_gather_time(stage) > 0
    assert z2.dp_reduce_time(stage) == 0 and z2.dp_gather_time(stage) > 0
    assert z3.dp_reduce_time(stage) == 0 and z3.dp_gather_time(stage) == 0


def test_fsdp2_gathers_follow_the_reshard_policy() -> None:
    """torchtitan's FSDP2 gathers a unit again for backward only if it resharded after
    forward: by default every unit but the final norm + output layer; "always" every
    unit (ZeRO-3's 2x); "never" none (1x). Gradients reduce-scatter in fp32 either way.
    (With a pipeline: once per step, the next test.)"""
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    base = {"seq_len": 4096, "world_size": 8, "zero_state": 3, "fsdp_impl": "torch_fsdp2"}
    head = 128384 * 4096 + 4096  # output layer + final norm
    for policy, gathered in (("always", 2.0), ("default", None), ("never", 1.0)):
        est = Estimate(m, load_strategy({**base, "fsdp_reshard_after_forward": policy}), H100)
        params = est.params.total
        want = 2 * (2 * params - head) if gathered is None else 2 * gathered * params
        assert _sharding_bytes(est) == {"all_gather": pytest.approx(want), "reduce_scatter": 4 * params}, policy


def test_fsdp2_under_pipelining_gathers_and_reduces_once_per_step(monkeypatch) -> None:
    """torch.distributed.pipelining runs every backward of an FSDP2 stage without gradient
    sync or resharding (stage.py ``backward_maybe_with_nosync``) and reduce-scatters after
    the last (``perform_reduce_grad``): no per-micro-batch collectives; per step one bf16
    gather and one fp32 reduce-scatter of the stage's parameters, with their copy-out and
    copy-in on the compute stream in the step; the stage's bf16 parameters gathered and its
    fp32 gradients accumulated unsharded all step."""
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    st = load_strategy({"seq_len": 4096, "world_size": 16, "pp_size": 2, "micro_batch_num": 4, "zero_state": 3,
                        "fsdp_impl": "torch_fsdp2", "overlap_grad_reduce": True})
    est = Estimate(m, st, H100)
    assert not any(o.module == MODULE for s in est.chunks for o in s.ops)
    cost = est.layer_profiles.coster.kernel
    real_plan = optimizer_step.ShardingPlan.of
    with monkeypatch.context() as mp:  # the same step as if FSDP2 reduced per micro-batch
        mp.setattr(optimizer_step.ShardingPlan, "of", staticmethod(lambda s: replace(real_plan(s), pipelined=False)))
        base = [optimizer_step.step_passes(st, H100, stage, cost, m) for stage in est.stages]
    for stage in est.stages:
        params = stage.params
        # the once-per-step copies on the compute stream: fp32 gradients into the fp32
        # reduce-scatter input before the step (8 B), the gathered bf16 parameters out after (4 B)
        copy_in, copy_out = (cost(MemBound(n, b * params)) for n, b in (("in", 8.0), ("out", 4.0)))
        before, after = base[stage.index]
        assert est.optimizer_passes[stage.index] == pytest.approx((before + copy_in, after + copy_out))
        assert est.dp_reduce_time(stage) == pytest.approx(est.network.time(Collective("reduce_scatter", 4 * params, "dp")))
        assert est.dp_gather_time(stage) == pytest.approx(est.network.time(Collective("all_gather", 2 * params, "dp")))
        mem = est.memory().stages[stage.index]
        shard = params / 8
        assert mem.grads == 4 * params and mem.optimizer == pytest.approx(8 * shard)
        assert mem.weights >= 4 * shard + 2 * params
    with pytest.raises(Exception, match="fsdp_reshard_after_forward.*pp_size"):
        st.with_updates({"fsdp_reshard_after_forward": "always"})
    one = Estimate(m, st.with_updates({"pp_size": 1, "world_size": 8}), H100)  # without pipelining: per layer
    assert any(o.module == MODULE for s in one.chunks for o in s.ops)


def test_zero3_memory_by_hand() -> None:
    """Megatron-FSDP ZeRO-3 (megatron-core 0.19 megatron_fsdp, default communication unit
    C = max(1e9, 2 x unit) elements): 1/dp of the bf16 parameters, fp32 main grads and
    optimizer states persist; the unit being run plus up to C/2 prefetched elements are
    gathered (bf16); in backward up to C + a unit of unsharded fp32 gradients wait in the
    reduce-scatter queue, while the activations behind them are freed. The largest unit of
    Llama3-8B is its output head (128384 x 4096 + the final norm)."""
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    est = Estimate(m, load_strategy({"seq_len": 4096, "world_size": 8, "zero_state": 3}), H100)
    st = est.memory().stages[0]
    layer = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    head = 128384 * 4096 + 4096
    assert head > layer
    params = est.stages[0].params
    shard, cap = params / 8, 10**9  # 2 x a layer is less: the floor
    assert st.weights == pytest.approx(2 * (shard + min(params, head + cap / 2)))
    assert st.grads == pytest.approx(4 * shard)
    states = model_states(est.strategy, est.stages[0], est.system.sys_name)
    assert states.reduce_extra == pytest.approx(4 * min(params, cap + head))
    assert states.reduce_frees == pytest.approx(min(params, cap + head) / params)
    # a short sequence: the gradients in flight, not the activations, set the peak
    short = Estimate(m, load_strategy({"seq_len": 256, "world_size": 8, "zero_state": 3}), H100).memory().stages[0]
    assert short.peak_path["op"] == "gradient reduce-scatters in flight"


def test_layer_collectives_hide_under_compute() -> None:
    """On one node the per-layer gathers of a large layer hide under its GEMMs; spread over
    nodes on a thin fabric they are exposed."""
    m = load_model("llama3-70b").with_updates({"layer_num": 4})
    st = {"seq_len": 4096, "world_size": 8, "tp_size": 1, "micro_batch_num": 4, "zero_state": 3}
    one_node = Estimate(m, load_strategy(st), H100)
    exposed = lambda e: e.layer_profiles.layer_time(1, False).fwd.comm.get("dp", 0.0)  # noqa: E731  (one layer)
    assert exposed(one_node) == 0.0
    # the embedding's gather has only a lookup to hide under: exposed
    assert sum(t.fwd.comm.get("dp", 0.0) for t in one_node.chunk_times) > 0
    thin = Estimate(m, load_strategy({**st, "world_size": 64}), H100.with_updates({"nic_gbps": 25.0}))
    assert exposed(thin) > 0.0


def test_flags_and_search() -> None:
    st = load_strategy({**LLAMA70, "zero_state": 3})
    flags = " ".join(megatron_flags(st))
    assert "--use-megatron-fsdp" in flags and "--data-parallel-sharding-strategy optim_grads_params" in flags
    model = "--num-layers 2 --hidden-size 8192 --num-attention-heads 64 --ffn-hidden-size 28672 --vocab-size 128256 "
    assert parse_megatron_args(model + flags)[1].zero_state == 3
    out = run_cli("search", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "-y", "h100-sxm-80gb", "--set", "layer_num=4",
                  "--world-size", "8", "--gbs", "16", "--zero", "0,1,2,3", "--tp", "1,2", "--pp", "1", "--recompute", "none", "--json")
    assert out.returncode == 0, out.stderr
    import json

    rows = json.loads(out.stdout)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert {r["zero"] for r in rows} == {0, 1, 2, 3}


def test_hsdp_shards_inside_a_replica_and_all_reduces_across() -> None:
    """fsdp_replicate_size R: states shard over dp x cp / R ranks; once per iteration the R
    replicas all-reduce their gradient shards; per micro-batch the layer collectives stay
    inside the replica."""
    m = load_model("llama3-70b")
    full = Estimate(m, load_strategy({**LLAMA70, "zero_state": 3}), H100)
    hsdp = Estimate(m, load_strategy({**LLAMA70, "zero_state": 3, "fsdp_replicate_size": 2}), H100)
    assert hsdp.network.groups["dp_shard"].size == 8 and hsdp.network.groups["dp_rep"].size == 2
    a, b = full.memory().stages[0], hsdp.memory().stages[0]
    assert b.optimizer == pytest.approx(2 * a.optimizer)  # shards twice as large
    assert a.peak_mem < b.peak_mem
    stage = hsdp.stages[0]
    assert full.dp_reduce_time(stage) == 0 and hsdp.dp_reduce_time(stage) > 0  # the cross-replica all-reduce
    groups = {k.group for s in hsdp.chunks for o in s.ops if o.module == MODULE for ph in ("fwd", "bwd_weight") for k in o.kernels(ph)}
    assert groups == {"dp_shard"}
    assert "--num-distributed-optimizer-instances 2" in " ".join(megatron_flags(hsdp.strategy))
    with pytest.raises(Exception, match="fsdp_replicate_size"):
        load_strategy({**LLAMA70, "zero_state": 3, "fsdp_replicate_size": 3})


def test_optimizer_cpu_offload_lowers_memory_and_raises_time() -> None:
    """Megatron's --optimizer-cpu-offload: the offloaded share of fp32 master, m and v leaves
    the GPU; its step costs the gradients' trip to the host (4 B / param), host Adam over
    4 + 2 x 12 B / param at host-memory bandwidth, and the bf16 parameters back, by hand.
    Megatron runs it only on the precision-aware optimizer's path, whose HybridDeviceOptimizer
    keeps fp32 masters and moments (torch's Adam on fp32 copies: no parameter remainders)."""
    m = load_model("llama3-70b")
    base = {**LLAMA70, "zero_state": 1}
    with pytest.raises(ConfigError, match="use_precision_aware_optimizer"):
        load_strategy({**base, "optimizer_cpu_offload": True})
    for field in ("exp_avg_dtype", "main_params_dtype"):
        with pytest.raises(ConfigError, match=f"{field}.*fp32"):
            load_strategy({**base, "optimizer_cpu_offload": True, "use_precision_aware_optimizer": True, field: "fp16"})
    on = Estimate(m, load_strategy({**base, "optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5,
                                    "use_precision_aware_optimizer": True}), H100)
    off = Estimate(m, load_strategy(base), H100)
    a, b = off.memory().stages[0], on.memory().stages[0]
    assert b.optimizer == pytest.approx(a.optimizer / 2) and b.peak_mem < a.peak_mem
    assert optimizer_bytes_per_param(on.strategy) == 12  # fp32 master, m, v whatever TE's FusedAdam would keep
    assert on.cost().duration_time_per_iter > off.cost().duration_time_per_iter
    shard = off.stages[0].params / 16 / 2  # dp 16, half offloaded
    host = shard * 4 / 50e9 + shard * (4 + 2 * 12) / 77e9 + shard * 2 / 50e9  # h100-sxm-80gb: Gen5 50, host 77 GB/s
    assert offloaded_step(on.strategy, on.system, shard) == pytest.approx(host)
    assert on.optimizer_passes[0][1] > host  # the GPU still steps its half (and zeroes every gradient)
    flags = " ".join(megatron_flags(on.strategy))
    assert "--optimizer-cpu-offload" in flags and "--optimizer-offload-fraction 0.5" in flags
    # DeepSpeed's ZeRO-Offload copies the gradients to the host in the backward: on the
    # reduction stream with overlap_comm (hidden), on the compute stream without (in series)
    for zero, overlap, d2h in ((1, False, True), (1, True, False), (2, None, True), (3, None, False), (3, False, True)):
        ds = load_strategy({**base, "fsdp_impl": "deepspeed", "zero_state": zero, "optimizer_cpu_offload": True,
                            "ds_overlap_comm": overlap})
        assert ds.ds_overlap == (not d2h)
        assert offloaded_step(ds, on.system, shard) == pytest.approx(host - (0 if d2h else shard * 4 / 50e9))


def test_torch_fsdp2_memory_and_torchtitan_export() -> None:
    """FSDP2 as torchtitan runs it: fp32 sharded parameters stepped in place (no separate
    master), Adam's two moments, fp32 gradient shards once a backward has reduced (not at
    the first micro-batch's forward peak): 12 (16) B per parameter / dp, plus bf16 copies
    of the unit kept gathered (final norm + output layer) and of the last all-gather's
    output; its gradients reduce-scatter in fp32 (tests/test_fsdp2_torch.py checks the same
    against fully_shard itself)."""
    from simumax.export.torchtitan import torchtitan_toml

    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    st = load_strategy({"seq_len": 4096, "world_size": 8, "zero_state": 3, "fsdp_impl": "torch_fsdp2", "use_fp32_accum_grad": False})
    est = Estimate(m, st, H100)
    s = est.memory().stages[0]
    shard = est.stages[0].params / 8
    head = 128384 * 4096 + 4096  # the largest unit
    assert s.weights == pytest.approx(4 * shard + 2 * head + 2 * head)
    assert s.grads == 0 and s.optimizer == pytest.approx(8 * shard)
    s2 = Estimate(m, st.with_updates({"micro_batch_num": 2}), H100).memory().stages[0]
    assert s2.grads == pytest.approx(4 * shard) and s2.weights == s.weights
    assert _sharding_bytes(est)["reduce_scatter"] == 4 * est.params.total  # fp32, whatever the main-grad dtype
    with pytest.raises(Exception, match="torch_fsdp2.*zero_state 3"):
        load_strategy({"seq_len": 4096, "world_size": 8, "zero_state": 2, "fsdp_impl": "torch_fsdp2"})
    toml = torchtitan_toml(load_strategy({**LLAMA70, "zero_state": 3, "fsdp_replicate_size": 2, "pp_size": 2}))
    assert "data_parallel_replicate_degree = 2" in toml and "data_parallel_shard_degree = 4" in toml
    assert "tensor_parallel_degree = 4" in toml and 'mode = "full"' in toml and "pipeline_parallel_degree = 2" in toml
    assert "local_batch_size = 4" in toml and "pipeline_parallel_microbatch_size = 1" in toml
    never = {**LLAMA70, "zero_state": 3, "fsdp_impl": "torch_fsdp2", "fsdp_reshard_after_forward": "never"}
    assert 'fsdp_reshard_after_forward = "never"' in torchtitan_toml(load_strategy(never))
    with pytest.raises(Exception, match="fsdp_reshard_after_forward.*torch_fsdp2"):
        load_strategy({**LLAMA70, "zero_state": 3, "fsdp_reshard_after_forward": "never"})  # Megatron-FSDP's is fixed
    out = run_cli("export", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "--format", "torchtitan")
    assert out.returncode == 2 and "zero_state" in out.stderr  # ZeRO-1 has no torchtitan form


def _ds(zero: int, **extra: object) -> Estimate:
    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    st = {"seq_len": 4096, "world_size": 8, "micro_batch_num": 2, "zero_state": zero, "fsdp_impl": "deepspeed", **extra}
    return Estimate(m, load_strategy(st), H100)


def test_deepspeed_zero_memory_by_hand() -> None:
    """DeepSpeed ZeRO with bf16, per the ZeRO paper's count (2 B parameters, 2 B gradients,
    12 B fp32 master + Adam moments; Rajbhandari et al. SC'20 Fig. 1): stage 1 keeps
    2 + 2 + 12/N, stage 2 2 + 2/N + 12/N, stage 3 (2 + 2 + 12)/N per parameter, plus the
    reduce bucket, reduce_bucket_size elements whatever the model's size (two at stages
    1-2 with overlap_comm, one at stage 3) and, at stage 3, the unit being run, what
    the prefetcher has gathered ahead and the flat buffer of the group in flight.
    The gradients are what a later micro-batch's forward holds (stage 2 releases its bucket
    after each backward and reduces into a second partition in the next); at stages 1-2 the
    first micro-batch's forward holds none, the step having freed them, and its backward
    allocates the bucket (at stage 2 the partition too); stage 3 keeps its partition and
    bucket from the optimizer's start."""
    head = 128384 * 4096 + 4096  # the largest unit (output layer + final norm)
    bucket = 500_000_000  # DeepSpeed's default reduce_bucket_size, allocated whole
    z1 = _ds(1)
    psi = z1.stages[0].params
    s1 = z1.memory().stages[0]
    assert (s1.weights, s1.grads, s1.optimizer) == pytest.approx((2 * psi, 2 * (psi + bucket), 12 * psi / 8))
    small = _ds(2, ds_reduce_bucket_size=10**6)
    states = model_states(small.strategy, small.stages[0], H100.sys_name)
    assert states.grads == pytest.approx(2 * psi / 8)
    assert states.backward_grads == pytest.approx(2 * 10**6) and states.backward_weights == 0.0
    # the partition a later backward reduces into, from its first reduce (after 1e6 gradient elements)
    assert (states.reduce_buffer, states.reduce_after) == pytest.approx((2 * psi / 8, 10**6))
    at_peak = small.memory().stages[0]  # its backward, at the loss: no weight gradient yet, so no reduce
    assert at_peak.peak_path == {**at_peak.peak_path, "phase": "bwd", "op": "loss"}
    assert at_peak.grads == pytest.approx(states.grads + states.backward_grads)
    s2 = _ds(2)
    states = model_states(s2.strategy, s2.stages[0], H100.sys_name)
    assert (states.weights, states.grads, states.optimizer) == pytest.approx((2 * psi, 2 * psi / 8, 12 * psi / 8))
    s2o = _ds(2, ds_overlap_comm=True)
    states = model_states(s2o.strategy, s2o.stages[0], H100.sys_name)
    assert states.backward_extra == pytest.approx(2 * 2 * bucket)  # a second bucket fills while one reduces
    s3 = _ds(3, ds_reduce_bucket_size=10**8)  # overlap_comm on by default at stage 3: one bucket
    s3 = model_states(s3.strategy, s3.stages[0], H100.sys_name)
    assert s3.weights == pytest.approx(2 * (psi / 8 + head + 5 * 10**7 + 5 * 10**7))  # + a gather group's flat buffer
    assert (s3.grads, s3.optimizer) == pytest.approx((2 * (psi / 8 + 10**8), 12 * psi / 8))
    # stages 1 and 3 hold the output layer's weight gradient in its .grad at the backward's peak
    for zero, forward, backward in ((1, 0, 2 * (bucket + head)), (2, 0, 2 * bucket), (3, 2 * (psi / 8 + bucket), 2 * head)):
        # (stage 3's backward holds as many gathered parameters as its forward here: the kept
        # output layer, the largest unit, the 5e7 prefetched after it and one group's buffer)
        one = _ds(zero, micro_batch_num=1)
        states = model_states(one.strategy, one.stages[0], H100.sys_name)
        assert states.grads == pytest.approx(forward) and states.backward_extra == pytest.approx(backward)
        assert states.reduce_buffer == pytest.approx(2 * psi / 8 if zero == 2 else 0.0)  # stage 2: at the first reduce


def test_deepspeed_zero3_gathered_parameters_by_hand() -> None:
    """DeepSpeed ZeRO-3 holds gathered the unit being run plus the prefetch bucket's worth of
    the parameters after it, across units, and at the turn from forward to backward the
    units whose backward comes within stage3_max_reuse_distance of their forward (2 x the
    parameters behind them) plus the prefetch beyond them; and beside these copies the flat
    buffer of one gather group, up to the bucket. With the distance set to keep the output
    layer and the last two layers (2 (H + L) < R < 2 (H + 2 L)) and the default 5e7-element
    bucket: H + 2 L + 5e7 + 5e7; with a bucket larger than the model, the whole model twice.
    The output layer is not gathered again for its backward, the layers are."""
    from simumax.graph.sharding import MODULE as FSDP

    m = load_model("llama3-8b").with_updates({"layer_num": 4})
    base = {"seq_len": 256, "world_size": 8, "zero_state": 3, "fsdp_impl": "deepspeed"}
    plain = Estimate(m, load_strategy(base), H100)
    s = plain.stages[0]
    layer_p = sum(o.params for p in s.parts if p.layers for o in p.ops)
    head = sum(o.params for o in s.parts[-1].ops)
    shard = s.params / 8
    kept = Estimate(m, load_strategy({**base, "ds_max_reuse_distance": 2 * (head + layer_p) + 1}), H100)
    assert model_states(kept.strategy, kept.stages[0], H100.sys_name).weights == pytest.approx(
        2 * (shard + head + 2 * layer_p + 5e7 + 5e7))
    whole = Estimate(m, load_strategy({**base, "ds_prefetch_bucket_size": 10**11}), H100)
    assert model_states(whole.strategy, whole.stages[0], H100.sys_name).weights == pytest.approx(2 * (shard + 2 * s.params))
    regathered = {o.name: any(k.op == "all_gather" for k in o.kernels("bwd_input"))
                  for c in plain.chunks for o in c.ops if o.module == FSDP}
    assert regathered["head.fsdp"] is False and regathered["embedding.fsdp"] is True
    assert all(v for k, v in regathered.items() if k not in ("head.fsdp", "embedding.fsdp"))


def test_deepspeed_reduce_in_bf16_exposed_without_overlap_comm() -> None:
    """Gradients reduce in the model dtype (2 B) every micro-batch from stage 2; without
    overlap_comm (DeepSpeed's default below stage 3) the reduce runs on the compute stream
    and is exposed, with it it hides under the backward like Megatron-FSDP's."""
    from simumax.graph.sharding import SYNC_MODULE

    plain, overlapped = _ds(2), _ds(2, ds_overlap_comm=True)
    reduces = [k for s in plain.chunks for o in s.ops if o.module == SYNC_MODULE for k in o.kernels("bwd_weight")]
    assert sum(k.bytes for k in reduces) == 2 * plain.params.total and all(k.op == "reduce_scatter" for k in reduces)
    assert _sharding_bytes(overlapped) == {"all_gather": 0.0, "reduce_scatter": 2 * plain.params.total}
    exposed = sum(plain.network.time(k) for k in reduces) * 2  # two micro-batches
    # exposed: every reduce, then the parameter all-gather after the step
    assert plain.cost().breakdown["dp_comm"] == pytest.approx(exposed + plain.dp_gather_time(plain.stages[0]), rel=1e-9)
    assert overlapped.cost().breakdown["dp_comm"] < plain.cost().breakdown["dp_comm"] - exposed / 2
    assert _ds(3).strategy.ds_overlap and not _ds(1).strategy.ds_overlap


def test_deepspeed_refusals_and_exports() -> None:
    import json

    from simumax.errors import ConfigError
    from simumax.export.deepspeed import deepspeed_config

    base = {"seq_len": 4096, "world_size": 16, "fsdp_impl": "deepspeed"}
    for bad, field in (({"zero_state": 0}, "fsdp_impl"), ({"zero_state": 2, "pp_size": 2}, "pp_size"),
                       ({"zero_state": 3, "ep_size": 2}, "ep_size"), ({"zero_state": 1, "fsdp_replicate_size": 2}, "fsdp_replicate_size")):
        with pytest.raises(ConfigError, match=field):
            load_strategy({**base, **bad})
    st = load_strategy({**base, "zero_state": 3, "micro_batch_num": 4, "optimizer_cpu_offload": True,
                        "optimizer_offload_fraction": 0.5})
    cfg = deepspeed_config(st)
    assert cfg["train_batch_size"] == 64 and cfg["gradient_accumulation_steps"] == 4 and cfg["bf16"] == {"enabled": True}
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["zero_optimization"]["overlap_comm"] is True
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True, "ratio": 0.5}
    with pytest.raises(ConfigError, match="fsdp_impl"):
        deepspeed_config(load_strategy({**base, "fsdp_impl": "megatron_fsdp", "zero_state": 2}))
    from simumax.export.torchtitan import torchtitan_toml

    with pytest.raises(ConfigError, match="fsdp_impl"):
        torchtitan_toml(st)  # a DeepSpeed strategy is not a torchtitan job
    perf = run_cli("perf", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "-y", "h100-sxm-80gb", "--set", "layer_num=4",
                   "--set", "fsdp_impl=deepspeed", "--set", "zero_state=3")
    assert perf.returncode == 0 and "zero3/deepspeed" in perf.stdout.splitlines()[0]
    out = run_cli("export", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "--format", "deepspeed",
                  "--set", "fsdp_impl=deepspeed", "--set", "zero_state=2")
    assert out.returncode == 0 and json.loads(out.stdout)["zero_optimization"]["overlap_comm"] is False
    # Megatron-DeepSpeed flags round-trip through the importer
    flags = megatron_flags(load_strategy({**base, "zero_state": 2}), load_model("llama3-8b"))
    assert "--zero-stage 2" in flags and "--use-megatron-fsdp" not in flags
    _, back, _ = parse_megatron_args("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --vocab-size 1000 "
                                     "--seq-length 512 --deepspeed --deepspeed_config ds.json --zero-stage 3")
    assert back.fsdp_impl == "deepspeed" and back.zero_state == 3


def test_search_over_sharded_dp_implementations() -> None:
    """`search --fsdp` tries each implementation where it runs: FSDP2 only at ZeRO-3,
    DeepSpeed at ZeRO 1-3 and never with PP at ZeRO-2/3."""
    import json

    out = run_cli("search", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "-y", "h100-sxm-80gb", "--set", "layer_num=4",
                  "--world-size", "8", "--gbs", "16", "--zero", "1,2,3", "--tp", "1", "--pp", "1,2", "--recompute", "none",
                  "--fsdp", "megatron_fsdp,torch_fsdp2,deepspeed", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    rows = rows["rows"] if isinstance(rows, dict) else rows
    seen = {(r["fsdp"], r["zero"], r["pp"]) for r in rows}
    assert ("torch_fsdp2", 3, 1) in seen and not any(f == "torch_fsdp2" and z < 3 for f, z, _ in seen)
    assert {("deepspeed", z, 1) for z in (1, 2, 3)} <= seen and ("deepspeed", 1, 2) in seen
    assert not any(f == "deepspeed" and z >= 2 and pp > 1 for f, z, pp in seen)
    from simumax.search.evaluate import SearchRow

    labels = {SearchRow.from_dict(r).label for r in rows}
    assert any("zero3/deepspeed" in t for t in labels) and any(" zero2 " in t for t in labels)  # Megatron's unmarked
    bad = run_cli("search", "-m", "llama3-8b", "-s", "tp1_pp1_dp8_mbs1", "-y", "h100-sxm-80gb", "--world-size", "8",
                  "--fsdp", "zero_infinity")
    assert bad.returncode == 2 and "search.fsdp" in bad.stderr


def test_fsdp2_optimizer_steps_by_hand() -> None:
    """The optimizer step over a rank's shard S, bytes per kernel. Megatron's --use-torch-fsdp2
    (Float16Optimizer over bf16 shards): bf16 gradients copied to fp32 (2 + 4), norm (4),
    clip (8), Adam on the fp32 master (4 + 2 x 12), master copied into the bf16 parameter
    (4 + 2). torchtitan (fp32 shards stepped in place): norm, clip and Adam only. Neither
    runs DDP's bucketed nan check or zeroes a gradient buffer (set to None). Megatron's
    gradients reduce-scatter in bf16, torchtitan's in fp32."""
    from simumax.dp.optimizer_step import step_passes

    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    base = {"seq_len": 4096, "world_size": 8, "zero_state": 3, "gradient_accumulation_fusion": False}
    for impl, before_b, after_b, reduce_b in (("megatron_torch_fsdp2", 6 + 4, 8 + 28 + 6, 2), ("torch_fsdp2", 4, 8 + 28, 4)):
        est = Estimate(m, load_strategy({**base, "fsdp_impl": impl}), H100)
        stage = est.stages[0]
        shard = stage.params / 8
        before, after = step_passes(est.strategy, H100, stage, lambda k: k.bytes)
        assert (before, after) == (pytest.approx(before_b * shard), pytest.approx(after_b * shard)), impl
        scattered = sum(n * k.bytes for ops, n in stage.groups() for o in ops if o.module == MODULE
                        for k in o.bwd_weight if isinstance(k, Collective))
        assert scattered == pytest.approx(reduce_b * stage.params)


def test_optimizer_step_holds_fp32_copies_of_low_precision_gradients() -> None:
    """Megatron's optimizers step on fp32 gradients: with bf16 main grads (--grad-reduce-in-bf16,
    SimuMax's use_fp32_accum_grad false) the step makes an fp32 copy of every gradient it steps
    (the rank's shard with the distributed optimizer) and holds it to zero_grad
    (_copy_model_grads_to_main_grads: ``main_grad.float()``), beside every state and no
    activation. Where activations are small that moment is the peak: 4 B per stepped
    parameter over the states, by hand. fp32 main grads are stepped as they are (no moment)."""
    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    base = {"seq_len": 256, "world_size": 8, "tp_size": 1, "pp_size": 1, "enable_sequence_parallel": False}
    st = load_strategy({**base, "zero_state": 0, "use_fp32_accum_grad": False})
    s = Estimate(m, st, H100).memory().stages[0]
    assert s.peak_path["phase"] == "step"
    assert s.peak_mem == pytest.approx(s.model_mem + 4 * s.params)
    fp32 = Estimate(m, st.with_updates({"use_fp32_accum_grad": True}), H100).memory().stages[0]
    assert fp32.peak_path["phase"] != "step"
    zero1 = Estimate(m, st.with_updates({"zero_state": 1}), H100)  # the distributed optimizer: its shard's copies
    states = model_states(zero1.strategy, zero1.stages[0], H100.sys_name)
    assert states.optimizer_step == pytest.approx(states.total + 4 * zero1.stages[0].params / 8)


def test_deepspeed_step_casts_the_gradient_partition_by_hand() -> None:
    """DeepSpeed's step (stage_1_and_2.py::step, stage3.py::_prepare_fp32_grad_for_sub_group):
    the partition's bf16 gradients are flattened into a new tensor and cast to fp32 while
    they are held — 2 + 2 + 4 B per shard element over the parameters (all at stages 1-2,
    the partition at 3), the optimizer states and workspaces; stage 1's gradients outside
    the partition and the stage 1-2 reduce buckets are gone, stage 3 keeps its bucket.
    ZeRO-Offload casts the offloaded share on the host, where the partition's gradients
    are, and stages 1-2 keep their transfer buffer of the largest parameter's size."""
    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    for zero in (1, 2, 3):
        st = load_strategy({"seq_len": 256, "world_size": 8, "zero_state": zero, "fsdp_impl": "deepspeed",
                            "ds_reduce_bucket_size": 10**6})
        est = Estimate(m, st, H100)
        p, states = est.stages[0].params, model_states(st, est.stages[0], H100.sys_name)
        shard = p / 8
        kept = states.optimizer + states.te_buffers
        held = 2 * (p if zero < 3 else shard) + 2 * shard + (2 * 10**6 if zero == 3 else 0)
        assert states.optimizer_step == pytest.approx(kept + held + (2 + 4) * shard)
        off = st.with_updates({"optimizer_cpu_offload": True})
        off_states = model_states(off, est.stages[0], H100.sys_name)
        transfer = 2 * 128384 * 4096 if zero < 3 else 0  # the output layer's weight, the largest parameter
        assert off_states.optimizer_step == pytest.approx(off_states.optimizer + off_states.te_buffers + held - 2 * shard
                                                          + transfer)


def test_deepspeed_offload_keeps_gradients_on_the_host_by_hand() -> None:
    """ZeRO-Offload (``offload_optimizer`` on the CPU; DeepSpeed 0.19.8's source, which the CPU
    harness cannot check: host and device are one there): no gradient partition on the GPU —
    stage 3 allocates ``grad_partitions_flat_buffer`` on the host, stages 1-2 copy each reduced
    gradient of the partition to the host and build neither ``grads_in_partition`` nor the end
    of the backward's flat partition — and stages 1-2 keep ``temp_grad_buffer_for_gpu_offload``,
    the largest parameter's size, from the optimizer's start. So, per parameter of a rank with
    P parameters, partition S = P / 8, bucket B and largest parameter W (2 B each): stage 1
    forward 2W with one micro-batch (2 (P + B) + 2W with two), stage 2 2W, stage 3 2B; stage 2
    adds no partition at its first reduce, and stage 1's end of the backward no flat copy."""
    head = 128384 * 4096
    bucket = 500_000_000
    for zero, mbs, forward in ((1, 1, 2 * head), (2, 1, 2 * head), (2, 2, 2 * head), (3, 1, 2 * bucket), (3, 2, 2 * bucket)):
        plain = _ds(zero, micro_batch_num=mbs)
        p = plain.stages[0].params
        on = model_states(plain.strategy.with_updates({"optimizer_cpu_offload": True}), plain.stages[0], H100.sys_name)
        assert on.grads == pytest.approx(forward) and on.reduce_buffer == 0.0
        if zero == 1:
            two = _ds(1, optimizer_cpu_offload=True)
            assert model_states(two.strategy, two.stages[0], H100.sys_name).grads == pytest.approx(2 * (p + bucket + head))
            off = model_states(plain.strategy, plain.stages[0], H100.sys_name)
            assert on.end_of_backward == pytest.approx(off.end_of_backward - off.optimizer + on.optimizer - 2 * p / 8 + 2 * head)
    # an MoE layer's experts are one matrix each in DeepSpeed-MoE: the largest parameter stays
    # the embedding (Mixtral: 32000 x 4096), not the op holding all eight experts
    moe = Estimate(load_model("mixtral-8x7b").with_updates({"layer_num": 2}),
                   load_strategy({"seq_len": 2048, "world_size": 8, "zero_state": 2, "fsdp_impl": "deepspeed",
                                  "optimizer_cpu_offload": True}), H100)
    assert offload_buffer(moe.strategy, moe.stages[0]) == 2 * 32000 * 4096


def test_deepspeed_step_against_deepspeed_on_cpu() -> None:
    """DeepSpeed 0.19.8 itself on CPU (docs/calibration/deepspeed_cpu/zero_step.jsonl: 12-layer
    Llama, 11.7 M parameters, 4 tokens, a 1e6-element bucket, torch's in-place fused AdamW as
    DeepSpeed's FusedAdam on a GPU, one or two micro-batches; and a 7 M model at 32 tokens with
    DeepSpeed's default bucket), rank 0's bytes. At every stage the bytes when the Adam update
    starts are the cast moment's less the flat copy (at stages 1-2 less the partition's
    gradients too). The overall peak within 0.5 % where it is the step (exact where no
    parameter straddles rank 0's partition boundary, 2 ranks; a straddling embedding keeps its
    whole gradient) or a ZeRO-3 forward (the whole small model's gather buffer beside its
    copies), +1.2 / +1.6 % where stage 1's end of backward builds its flat gradient
    partition beside every gradient (a bucket's gradients are gone by then). Pass by pass
    (the first micro-batch's forward and backward; with two, the second's): every forward
    within 1.2 %, at stages 1-2 with no gradient buffer in the first (the step freed them),
    at stage 3 with the gradient partition and bucket it keeps from the optimizer's start;
    every backward within 1.6 %. And a ZeRO-2 run at 512 tokens, compared by its states only
    (its CPU attention keeps s^2 probabilities): its backward peaks before the first reduce,
    without the gradient partition, as the estimate's does."""
    import json
    from pathlib import Path

    from simumax.memory.chunk_walk import op_name_at
    from simumax.memory.model_states import shard_params
    from simumax.memory.result import backward_states

    data = Path(__file__).resolve().parent.parent / "docs" / "calibration" / "deepspeed_cpu" / "zero_step.jsonl"
    step_peaks = passes = 0
    for line in data.read_text().splitlines():
        r = json.loads(line)
        m = load_model("llama3-8b").with_updates(r["model"])  # the run's overrides of llama3-8b
        st = load_strategy({"seq_len": r["seq"], "world_size": r["world"], "micro_batch_num": r["micro_batches"],
                            "zero_state": r["stage"], "fsdp_impl": "deepspeed", "ds_reduce_bucket_size": r["bucket"],
                            **({"ds_overlap_comm": True} if r["overlap_comm"] else {})})
        est = Estimate(m, st, H100)
        states = model_states(st, est.stages[0], H100.sys_name)
        mem = est.memory().stages[0]
        err = (mem.peak_mem - states.te_buffers) / r["peak"]["Total"] - 1  # the CPU run has no cuBLAS workspace
        cast = states.optimizer_step - states.te_buffers
        shard = shard_params(st, est.stages[0])
        update = cast - 2 * shard * (2 if r["stage"] < 3 else 1)
        err_update = update / r["update"]["Total"] - 1
        # each pass: the states of its phase and the walk's peak of one micro-batch's pass
        walk, base = est.chunk_walks[0], states.total - states.te_buffers
        mb = r["micro_batches"] - 1  # the first micro-batch's passes, or the second's
        fwd = base + walk.fwd_peak
        held = backward_states(states, est.activation_walks()[0], est.stages[0], est.chunk_walks)
        bwd = max(base + held + walk.bwd_peak, states.end_of_backward - states.te_buffers)
        err_fwd, err_bwd = (fwd / r[f"forward_{mb}_peak"]["Total"] - 1, bwd / r[f"backward_{mb}_peak"]["Total"] - 1)
        if r["seq"] == 512:
            # ZeRO-2 whose backward peaks at its start (the CPU model's math attention keeps
            # s^2 probabilities the estimate's flash attention does not: only the states are
            # compared): the gradient bytes there are the bucket and the loss's transients,
            # not the partition, which its first reduce allocates later; the estimate's walk
            # peaks at the loss too, before any weight gradient, and leaves it out
            at = r["backward_0_peak"]
            assert at["Gradient"] + at["Temp"] < 2 * shard < r["after_backward"]["Temp"] + 1
            assert op_name_at(est.stages[0], est.chunk_walks[0].bwd_peak_at) == "loss"
            assert held == pytest.approx(states.backward_extra) and states.reduce_buffer == pytest.approx(2 * shard)
            continue
        print(f"zero {r['stage']} on {r['world']}, {r['seq']} tokens, {r['micro_batches']} micro-batch(es)"
              f"{', overlap_comm' if r['overlap_comm'] else ''}: update {err_update:+.2%}; peak {err:+.2%} "
              f"({mem.peak_path['phase']}); micro-batch {mb}'s forward {err_fwd:+.2%}, backward {err_bwd:+.2%}")
        assert abs(err_update) < 1e-4
        assert cast <= r["peak"]["Total"] * 1.0001  # the measured peak is the cast or a larger moment
        assert abs(err_fwd) < 0.012
        passes += 1
        assert abs(err_bwd) < 0.017
        if r["peak"]["Total"] == r["step_peak"]["Total"] and r["seq"] == 4:  # the step: the cast's copies
            step_peaks += 1
            assert mem.peak_path["phase"] == "step"
            assert -0.006 < err <= 1e-4 and (r["world"] > 2 or abs(err) < 1e-4)
        elif r["stage"] == 1 and r["seq"] == 4:  # the end of the backward
            assert mem.peak_path["phase"] == "bwd" and 0 < err < 0.02
        else:
            assert abs(err) < 0.0075
    # stages 1-2 on 2 ranks with one micro-batch and with two (2 also with overlap_comm), 2 on 4 and 8
    assert step_peaks == 7 and passes == 19


def test_fsdp2_gathered_units_through_the_walk_by_hand() -> None:
    """FSDP2's gathered parameters as the activation walk follows them, against the states
    (every kept unit gathered, plus the last all-gather output): units A (1 B, kept from
    forward), B (2 B, gathered again for backward), C (4 B, kept), a loss after C's last
    parameters. Forward copy-outs: A 2·1 − (1 + 4) − 4 = −7; B 2·2 + 1 − 4 − 4 = −3;
    C 2·4 + 2 − 4 − 4 = +2. Backward, with the last all-gather output freed: the loss,
    before C's pre-backward (C prefetched by the root, kept anyway): −4; C, B prefetched:
    2 − 4 = −2; B (regathered; C resharded): 2 − 4 − 4 = −6; A: −8."""
    from simumax.graph.ops import Op
    from simumax.memory.activation_walk import _fsdp2_states

    ops = [Op("a", "embedding", -1, params=1), Op("a.fsdp", MODULE, -1, unit_gathered=1.0),
           Op("b", "fc1", 0, params=1), Op("b2", "act", 0), Op("b.fsdp", MODULE, 0, unit_gathered=2.0, unit_regathered=True),
           Op("c", "lm_head", -1, params=1), Op("loss", "loss", -1), Op("c.fsdp", MODULE, -1, unit_gathered=4.0)]
    copy_at, delta_at = _fsdp2_states(ops, [1, 4, 7])
    assert copy_at == {0: (1, -7.0), 2: (4, -3.0), 5: (7, 2.0)}
    assert delta_at == {7: -4.0, 5: -2.0, 4: -6.0, 1: -8.0}
