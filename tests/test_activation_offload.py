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


def test_core_attention_offloads_q_k_v_and_lse_not_its_output() -> None:
    """Flash attention saves q, k (RoPE's outputs), the contiguous copy of v that TE makes
    (a strided view of the QKV output beside contiguous q, k), its output and the fp32
    log-sum-exp; the output is also the projection's input, so it stays."""
    est = Estimate(MODEL, _offloading("core_attn"), SYSTEM)
    layer = est.chunks[0].ops
    off = next(o for o in layer if o.module == MODULE)
    names = {n for n, _ in off.offloads}
    assert names == {"L0.q", "L0.k", "L0.v_contiguous", "L0.attn.lse"}  # not L0.attn.out
    q, kv, lse = S * H * 2, S * 8 * 128 * 2, 32 * S * 4
    assert sum(b for _, b in off.offloads) == q + 2 * kv + lse
    # stored per micro-batch drops by that much per layer of the stage (16)
    plain = Estimate(MODEL, BASE, SYSTEM).memory().stages[0].fwd_activation_cache_per_micro_batch
    assert plain - est.memory().stages[0].fwd_activation_cache_per_micro_batch == 16 * (q + 2 * kv + lse)


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


def test_te_layer_offload_moves_every_activation_of_the_first_layers() -> None:
    """TransformerEngine's layer offload (Megatron --cpu-offloading --cpu-offloading-num-layers
    N): everything layers 0..N-1 save for backward goes to the host, the rest stays; the
    stored bytes per micro-batch drop by exactly those layers' saved bytes, and the copies
    cost host-link time like the fine-grained offload's."""
    from simumax.memory.activation_walk import walk

    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 8192, "micro_batch_num": 8})
    te = st.with_updates({"cpu_offloading": True, "cpu_offloading_num_layers": 3})
    ops_te, ops_plain = Estimate(MODEL, te, SYSTEM).chunks[0].ops, Estimate(MODEL, st, SYSTEM).chunks[0].ops
    offloading = [o for o in ops_te if o.module == MODULE]
    assert [o.layer for o in offloading] == [0, 1, 2]
    layer0 = [o for o in ops_plain if o.layer == 0]
    saved = dict(t for o in layer0 for t in o.saved)
    assert dict(offloading[0].offloads) == saved  # every tensor of the layer
    assert walk(ops_plain).stored - walk(ops_te).stored == pytest.approx(3 * sum(saved.values()))
    assert Estimate(MODEL, te, SYSTEM).network.time(offloading[0].fwd[0]) == pytest.approx(
        sum(saved.values()) / (SYSTEM.host_link_gbps * 1e9))
    # layers 3.. cost as before, layers 0..2 pay what their copies do not hide
    t_te, t_plain = Estimate(MODEL, te, SYSTEM).cost(), Estimate(MODEL, st, SYSTEM).cost()
    assert t_te.duration_time_per_iter > t_plain.duration_time_per_iter and t_te.breakdown["offload_comm"] > 0


def test_te_layer_offload_refusals_and_flags() -> None:
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 8192})
    on = {"cpu_offloading": True, "cpu_offloading_num_layers": 2}
    for bad, field in (({"cpu_offloading": True}, "cpu_offloading_num_layers"),
                       ({**on, "pp_size": 2}, "cpu_offloading"),
                       ({**on, "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None},
                        "cpu_offloading"),
                       ({**on, "fine_grained_activation_offloading": True, "offload_modules": ["core_attn"]}, "cpu_offloading")):
        with pytest.raises(ConfigError, match=field):
            st.with_updates(bad)
    with pytest.raises(ConfigError, match="cpu_offloading_num_layers"):
        Estimate(MODEL, st.with_updates({**on, "cpu_offloading_num_layers": 32}), SYSTEM).cost()
    flags = megatron_flags(st.with_updates(on))
    # Megatron-LM 0.19: the layer count turns it on (older scripts also say --cpu-offloading)
    assert "--cpu-offloading" not in flags and "--cpu-offloading-num-layers 2" in flags
    args = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 2048 --vocab-size 32000 "
            "--cpu-offloading-num-layers 2 --micro-batch-size 1")
    for older in ("", " --cpu-offloading"):
        _, back, _ = parse_megatron_args(args + older, world_size=1)
        assert back.cpu_offloading and back.cpu_offloading_num_layers == 2
