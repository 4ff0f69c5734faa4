"""``moe_apply_probs_on_input`` (Megatron's --moe-apply-probs-on-input, top-1 routing):
megatron-core 0.19 ``experts.py`` multiplies the permuted tokens by their fp32 routing prob
before FC1 and casts the product back; the probs then reset to ones."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.kernels import MemBound

H = 4096  # Mixtral's hidden size


def _est(topk: int = 1, **kw) -> Estimate:
    m = load_model("mixtral-8x7b").with_updates({"layer_num": 2, "topk": topk, "moe_router_pre_softmax": topk == 1})
    st = load_strategy("ep4_pp2_dp4_mbs1").with_updates(
        {"pp_size": 1, "world_size": 8, "ep_size": 8, "seq_len": 4096, "enable_recompute": False, "dispatch_probs": True, **kw})
    return Estimate(m, st, load_system("h100-sxm-80gb"))


def _ops(est: Estimate, layer: int = 1) -> dict:
    return {o.name.split(".", 1)[1]: o for o in est.chunks[0].ops if o.layer == layer}


def test_probs_on_input_kernels_and_tensors_by_hand() -> None:
    """Per MoE layer, rows = the tokens the rank's experts receive (4096 at top-1, EP8):
    forward an fp32 product (2 B in, 4 B out per element, the fp32 prob per row) and its cast
    back (4 in, 2 out); backward the cast's (2 in, 4 out), the tokens' gradient (4 + 4, the
    prob per row) and its cast back (4 + 2), the probs' gradient (4 + 2 in, 4 out) and its
    sum over the hidden size (4 in, 4 B per row out). FC1 keeps the weighted tokens, the new
    op the unweighted ones and the probs."""
    ops = _ops(_est(moe_apply_probs_on_input=True))
    op = ops["probs_on_input"]
    rows = 4096
    e = float(rows * H)
    assert [k.bytes for k in op.fwd] == [e * 6 + rows * 4, e * 6]
    assert [k.bytes for k in op.bwd_input] == [e * 6, e * 8 + rows * 4, e * 6, e * 10, e * 4 + rows * 4]
    assert all(isinstance(k, MemBound) for k in (*op.fwd, *op.bwd_input))
    assert [(n.split(".", 1)[1], b) for n, b in op.saved] == [("moe.tokens", e * 2), ("moe.probs_on_input", rows * 4.0)]
    assert [n.split(".", 1)[1] for n, _ in ops["expert_fc1"].saved] == ["moe.tokens_weighted"]
    assert ops["expert_fc1"].input == (op.output,)
    # its cost: slower by the new kernels, more memory by the unweighted tokens and probs
    plain, on = _est(), _est(moe_apply_probs_on_input=True)
    assert on.cost().duration_time_per_iter > plain.cost().duration_time_per_iter
    per_layer = e * 2 + rows * 4
    stored = [x.memory().stages[0].stored_activation_mem for x in (plain, on)]
    assert stored[1] - stored[0] == pytest.approx(2 * per_layer)


def test_probs_on_input_needs_top1_and_round_trips_its_flag() -> None:
    with pytest.raises(ConfigError, match="moe_apply_probs_on_input"):
        _est(topk=2, moe_apply_probs_on_input=True).cost()
    from simumax.export.megatron_flags import megatron_flags, model_flags
    from simumax.importers.megatron_args import parse_megatron_args

    est = _est(moe_apply_probs_on_input=True)
    flags = megatron_flags(est.strategy, est.model)
    assert "--moe-apply-probs-on-input" in flags
    _, st, _ = parse_megatron_args(model_flags(est.model) + flags, world_size=8)
    assert st.moe_apply_probs_on_input
