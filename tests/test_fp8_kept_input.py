"""FP8 linears that keep their BF16 input (TransformerEngine's ``save_original_input``, set by
megatron-core on attention's output projection)."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy
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
    assert proj_new.saved == (x,) and proj_old.saved[0][0] == f"{x[0]}.fp8"
    assert proj_old.saved_bytes == x[1] / 2 * (1 + 4 / 128)  # 1 B, and an fp32 scale per 128 (blockwise)
    names = [k.name for k in proj_new.bwd_input if isinstance(k, MemBound)]
    assert names[0] == "attn_proj.quantize_kept_input"
    delayed = _ops(m, st.with_updates({"te_version": "2.6.0", "fp8_recipe": "delayed"}))["attn_proj"]
    assert delayed.saved[0][0] == f"{x[0]}.fp8"
