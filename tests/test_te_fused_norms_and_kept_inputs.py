"""What megatron-core 0.19's TransformerEngine spec changes in what a layer keeps: norms fused
into the next linear (and so outside or inside a recompute module's checkpoint), and fp8 linears
that keep their BF16 input (TransformerEngine's ``save_original_input``)."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.estimate import Estimate
from simumax.graph.dims import Dims
from simumax.graph.kernels import MemBound
from simumax.graph.model_graph import layer_ops


def _ops(m, st, layer=1):
    return {o.name.split(".", 1)[1]: o for o in layer_ops(m, st, Dims.of(m, st), layer)}


@pytest.mark.parametrize("model", ["llama3.1-8b", "deepseek-v3", "deepseek-v3.2"])
def test_output_projection_keeps_attentions_bf16_output_under_new_fp8(model) -> None:
    """megatron-core 0.19 (Attention / MLA / AbsorbedMLA.__init__, set_save_original_input): with
    an fp8 recipe other than delayed on TransformerEngine >= 2.6, the attention's output
    projection keeps its BF16 input — attention's output, kept anyway — instead of an FP8 copy:
    a layer keeps the copy's bytes less; the input is cast row-wise in forward and column-wise in
    backward."""
    m = load_model(model).with_updates({"layer_num": 4, **({"dense_layers": 1} if model != "llama3.1-8b" else {})})
    base = dict(fp8=True, fp8_recipe="blockwise")
    if model == "llama3.1-8b":
        st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 4096, **base})
    else:
        st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": 4096, "dsa_kernel_backend": "tilelang", **base})
    old, new = (_ops(m, st.with_updates({"te_version": v})) for v in ("2.5.0", "2.6.0"))
    proj_old, proj_new = old["attn_proj"], new["attn_proj"]
    x = proj_new.input[0]
    assert proj_new.saved == (x,) and proj_old.saved[0][0] == f"{x[0]}.fp8.attn_proj"
    assert proj_old.saved_bytes == x[1] / 2 * (1 + 4 / 128)  # 1 B, and an fp32 scale per 128 (blockwise)
    names = [k.name for k in proj_new.bwd_input if isinstance(k, MemBound)]
    assert names[0] == "attn_proj.quantize_kept_input"
    delayed = _ops(m, st.with_updates({"te_version": "2.6.0", "fp8_recipe": "delayed"}))["attn_proj"]
    assert delayed.saved[0][0] == f"{x[0]}.fp8.attn_proj"


def _layer(model, st, layer):
    est = Estimate(model, st, load_system("h100-sxm-80gb"))
    return {o.name.split(".", 1)[1]: o for c in est.chunks for o in c.ops if o.layer == layer}


def test_layernorm_recompute_only_where_the_norm_is_a_module() -> None:
    """Megatron's --recompute-modules layernorm recomputes input_layernorm / pre_mlp_layernorm
    where they are modules (transformer_layer.py: not an IdentityOp). With TransformerEngine
    (gpt_layer_specs.py) a dense attention's norm is fused into linear_qkv and a dense MLP's into
    fc1 — nothing to recompute — while MLA's input norm and a MoE layer's pre-MLP norm are
    modules; the local spec's norms all are."""
    rec = {"megatron_recompute": True, "megatron_recompute_modules": ["layernorm"], "seq_len": 4096}
    llama = load_model("llama3.1-8b").with_updates({"layer_num": 2})
    te = _layer(llama, load_strategy("tp1_pp1_dp8_mbs1").with_updates(rec), 1)
    local = _layer(llama, load_strategy("tp1_pp1_dp8_mbs1").with_updates({**rec, "transformer_impl": "local"}), 1)
    assert te["attn_norm"].recompute_group is None and te["mlp_norm"].recompute_group is None
    assert local["attn_norm"].recompute_group and local["mlp_norm"].recompute_group
    v3 = load_model("deepseek-v3").with_updates({"layer_num": 3, "dense_layers": 1})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates(rec)
    dense, moe = _layer(v3, st, 0), _layer(v3, st, 1)
    assert dense["attn_norm"].recompute_group and dense["mlp_norm"].recompute_group is None
    assert moe["attn_norm"].recompute_group and moe["mlp_norm"].recompute_group


def test_fp8_linears_keep_a_recomputed_norms_output() -> None:
    """Under fp8 each TE linear keeps its own FP8 copy of its input (MLA's q and kv
    down-projections: two copies of the normed hidden state); with the norm recomputed
    (set_for_recompute_input_layernorm / set_for_recompute_pre_mlp_layernorm) they and the shared
    experts' FC1 keep the BF16 norm output instead — discarded with the norm and brought back with
    it — and cast it column-wise in backward."""
    v3 = load_model("deepseek-v3").with_updates({"layer_num": 2, "dense_layers": 0})
    fp8 = {"seq_len": 4096, "fp8": True, "fp8_recipe": "blockwise"}
    plain = _layer(v3, load_strategy("ep8_pp1_dp8_mbs1").with_updates(fp8), 1)
    names = {t[0] for k in ("q_down", "kv_down") for t in plain[k].saved}
    assert names == {"L1.attn_norm.out.fp8.q_down", "L1.attn_norm.out.fp8.kv_down"}
    rec = load_strategy("ep8_pp1_dp8_mbs1").with_updates(
        {**fp8, "megatron_recompute": True, "megatron_recompute_modules": ["layernorm"]})
    ops = _layer(v3, rec, 1)
    for k in ("q_down", "kv_down", "shared_fc1"):
        assert ops[k].saved == (ops[k].input[0],), k
        assert ops[k].bwd_input[0].name == f"{k}.quantize_kept_input"


def test_shared_experts_fc1_keeps_the_routers_input_under_new_fp8() -> None:
    """SharedExpertMLP.__init__: with an fp8 recipe other than delayed on TE >= 2.6 the shared
    experts' FC1 keeps the pre-MLP norm's BF16 output — the router keeps it anyway — not an FP8
    copy."""
    v3 = load_model("deepseek-v3").with_updates({"layer_num": 2, "dense_layers": 0})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": 4096, "fp8": True, "fp8_recipe": "mxfp8"})
    new, old = (_ops(v3, st.with_updates({"te_version": v}), 1)["shared_fc1"] for v in ("2.6.0", "2.5.0"))
    assert new.saved == (new.input[0],) == (("L1.mlp_norm.out", new.input[0][1]),)
    assert old.saved[0][0] == "L1.mlp_norm.out.fp8.shared_fc1"


def test_mlp_recompute_checkpoints_the_fused_norm_too() -> None:
    """--recompute-modules mlp checkpoints ``self.mlp``: with TransformerEngine a dense layer's
    MLP is TELayerNormMLP-style (its pre-MLP norm fused into FC1, pre_mlp_layernorm an
    IdentityOp), so the checkpoint holds the norm's input and the norm is recomputed with it;
    the local spec's norm stays outside, its output the checkpoint's input."""
    rec = {"megatron_recompute": True, "megatron_recompute_modules": ["mlp"], "seq_len": 4096}
    llama = load_model("llama3.1-8b").with_updates({"layer_num": 2})
    te = _layer(llama, load_strategy("tp1_pp1_dp8_mbs1").with_updates(rec), 1)
    local = _layer(llama, load_strategy("tp1_pp1_dp8_mbs1").with_updates({**rec, "transformer_impl": "local"}), 1)
    assert te["mlp_norm"].recompute_group == te["fc1"].recompute_group == "L1.mlp"
    assert local["mlp_norm"].recompute_group is None and local["fc1"].recompute_group == "L1.mlp"


def test_mla_up_proj_recompute_takes_the_fused_qk_norms() -> None:
    """MLA's TransformerEngine spec fuses the q / kv norms into the up-projections
    (TELayerNormColumnParallelLinear; q_layernorm / kv_layernorm IdentityOps), so the
    mla_up_proj checkpoint starts from the un-normed latents and recomputes the norms; DSA's
    absorbed MLA keeps its norms as modules outside it, and so does the local spec."""
    rec = {"megatron_recompute": True, "megatron_recompute_modules": ["mla_up_proj"], "seq_len": 4096}
    v3 = load_model("deepseek-v3").with_updates({"layer_num": 2, "dense_layers": 0})
    te = _layer(v3, load_strategy("ep8_pp1_dp8_mbs1").with_updates(rec), 1)
    local = _layer(v3, load_strategy("ep8_pp1_dp8_mbs1").with_updates({**rec, "transformer_impl": "local"}), 1)
    assert te["q_norm"].recompute_group == te["kv_norm"].recompute_group == te["q_up"].recompute_group == "L1.mla_up"
    assert local["q_norm"].recompute_group is None and local["q_up"].recompute_group == "L1.mla_up"
    v32 = load_model("deepseek-v3.2").with_updates({"layer_num": 2, "dense_layers": 0})
    dsa = _layer(v32, load_strategy("ep8_pp1_dp8_mbs1").with_updates({**rec, "dsa_kernel_backend": "tilelang", "apply_rope_fusion": False}), 1)
    assert dsa["q_norm"].recompute_group is None and dsa["q_up"].recompute_group == "L1.mla_up"
