"""Fine-grained activation offloading (graph/offload.py): which tensors leave the GPU, the
bytes the memory walk stops holding, the copies over the host link and what of them the
layer's compute hides; Megatron's flags both ways."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.offload import MODULE, offloaded_tensors
from simumax.importers.megatron_args import parse_megatron_args
from simumax.export.megatron_flags import megatron_flags

MODEL = load_model("llama3.1-8b")  # h 4096, 32 heads of 128, 8 KV heads, SwiGLU 14336
SYSTEM = load_system("h100-sxm-80gb")  # host link 50 GB/s per GPU
BASE = load_strategy("tp1_pp2_dp4_mbs1").with_updates({"seq_len": 8192, "micro_batch_num": 8})
S, H = 8192, 4096


def _offloading(*mods: str):
    return BASE.with_updates({"fine_grained_activation_offloading": True, "offload_modules": list(mods)})


def test_core_attention_offloads_q_k_the_qkv_buffer_and_lse_not_its_output() -> None:
    """Flash attention saves q, k, v (a view that keeps the fused QKV output), its output and
    the fp32 log-sum-exp; the output is also the projection's input, so it stays."""
    est = Estimate(MODEL, _offloading("core_attn"), SYSTEM)
    layer = est.chunks[0].ops
    off = next(o for o in layer if o.module == MODULE)
    names = {n for n, _ in off.offloads}
    assert names == {"L0.q", "L0.k", "L0.qkv.out", "L0.attn.lse"}  # not L0.attn.out
    q, kv, qkv_buffer, lse = S * H * 2, S * 8 * 128 * 2, S * (H + 2 * 8 * 128) * 2, 32 * S * 4
    assert sum(b for _, b in off.offloads) == q + kv + qkv_buffer + lse
    # stored per micro-batch drops by that much per layer of the stage (16)
    plain = Estimate(MODEL, BASE, SYSTEM).memory().stages[0].fwd_activation_cache_per_micro_batch
    assert plain - est.memory().stages[0].fwd_activation_cache_per_micro_batch == 16 * (q + kv + qkv_buffer + lse)


def test_copies_over_the_host_link_hide_under_the_layer() -> None:
    """Each layer copies its offloaded bytes out in forward and back in backward at
    host_link_gbps; the part longer than the layer's compute is exposed as offload_comm."""
    est = Estimate(MODEL, _offloading("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"), SYSTEM)
    off = next(o for o in est.chunks[0].ops if o.module == MODULE)
    nbytes = sum(b for _, b in off.offloads)
    copy = nbytes / (SYSTEM.host_link_gbps * 1e9)
    assert est.network.time(off.fwd[0]) == pytest.approx(copy)
    plain = Estimate(MODEL, BASE, SYSTEM)
    layer_off = est.layer_profiles.layer_time(0, False)
    layer_plain = plain.layer_profiles.layer_time(0, False)
    for phase in ("fwd", "bwd_input"):
        busy = getattr(layer_plain, phase).compute + getattr(layer_plain, phase).membound
        exposed = max(0.0, copy - busy)
        assert getattr(layer_off, phase).total == pytest.approx(getattr(layer_plain, phase).total + exposed)
        assert getattr(layer_off, phase).comm.get("offload", 0.0) == pytest.approx(exposed)
    cost = est.cost()
    assert cost.breakdown["offload_comm"] > 0
    assert sum(cost.breakdown.values()) == pytest.approx(cost.duration_time_per_iter)


def test_prefetch_one_layer_ahead_and_recompute_offloads_nothing() -> None:
    """In backward a layer's offloaded tensors are back while the layer after it (in
    forward order) runs its backward: the stage's backward peak holds two layers' worth
    at most, and what the forward stored drops by every layer's."""
    from simumax.memory.activation_walk import walk

    st = _offloading("core_attn")
    ops_off, ops_plain = Estimate(MODEL, st, SYSTEM).chunks[0].ops, Estimate(MODEL, BASE, SYSTEM).chunks[0].ops
    per_layer = sum(b for _, b in offloaded_tensors([o for o in ops_off if o.layer == 0], st))
    w_off, w_plain = walk(ops_off), walk(ops_plain)
    assert w_plain.stored - w_off.stored == 16 * per_layer
    # backward peak: everything not offloaded, plus at most this layer's and the prefetched one's
    assert w_off.bwd_peak <= w_plain.bwd_peak - 14 * per_layer + 1e-6
    assert w_off.bwd_peak >= w_plain.bwd_peak - 16 * per_layer
    full = st.with_updates({"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None})
    assert not any(o.module == MODULE for o in Estimate(MODEL, full, SYSTEM).chunks[0].ops)


def test_flags_checked_and_round_trip() -> None:
    with pytest.raises(ConfigError, match="offload_modules"):
        BASE.with_updates({"fine_grained_activation_offloading": True})
    with pytest.raises(ConfigError, match="offload_modules"):
        BASE.with_updates({"offload_modules": ["core_attn"]})
    with pytest.raises(ConfigError, match="unknown module"):
        _offloading("mlp")
    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --vocab-size 32000 "
            "--fine-grained-activation-offloading --offload-modules core_attn attn_proj --micro-batch-size 1")
    _, st, _ = parse_megatron_args(args, world_size=1)
    assert st.fine_grained_activation_offloading and st.offload_modules == ["core_attn", "attn_proj"]
    assert "--fine-grained-activation-offloading" in megatron_flags(_offloading("core_attn"))
    assert "--offload-modules core_attn" in megatron_flags(_offloading("core_attn"))
