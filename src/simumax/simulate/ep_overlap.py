"""Expert-parallel all-to-all overlap as Megatron-Core runs it
(``--overlap-moe-expert-parallel-comm``: the paired "combined 1F1B" schedule,
``megatron/core/pipeline_parallel/combined_1f1b.py`` and the layer split of
``models/gpt/fine_grained_callables.py``).

One micro-batch's forward and another's backward run together, layer against layer (the
forward's layer i with the backward's layer n-1-i), each MoE layer cut into sub-modules:
``attn`` (attention, pre-MLP norm, router, permute), ``dispatch`` (all-to-all),
``mlp`` (experts and shared experts), ``combine`` (all-to-all). Communication of one runs on
its own stream while the other computes, in four fixed slots:

    b.combine (comm)  || f.attn (compute)
    f.dispatch (comm) || b.mlp (compute)
    b.dispatch (comm) || f.mlp (compute)
    f.combine (comm)  || b.attn (compute)

so each all-to-all hides only under the compute that shares its slot, not under the whole
partner pass. With ``delay_wgrad_compute`` the backward's expert weight gradients run under
its dispatch backward instead of beside its data gradients. What the communication kernels
take from the GEMMs (their SMs) is the EP tier's ``processor_usage``, applied by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from simumax.graph.shared_experts import SHARED_EXPERT_MODULES

MLP_MODULES = frozenset({"expert_fc1", "moe_act", "expert_fc2", "moe_sum"}) | SHARED_EXPERT_MODULES
EP_GROUPS = ("ep", "etp")


@dataclass(frozen=True, slots=True)
class MoeSlots:
    """Seconds of one MoE layer's sub-modules in one pass (forward, or the backward with
    its recompute); ``mlp_wgrad`` is the experts' weight-gradient part (backward only)."""

    attn: float = 0.0
    dispatch: float = 0.0
    mlp: float = 0.0
    mlp_wgrad: float = 0.0
    combine: float = 0.0


SLOTS = tuple(f.name for f in fields(MoeSlots))


def layer_slots(op_times: list, phases: tuple[str, ...]) -> list[MoeSlots]:
    """Per MoE layer of a chunk (forward order), its slots over ``phases``, from the
    chunk's per-op times (``StageTime.op_times``: (Op, {phase: PhaseTime}), in op order;
    layers of one kind share their op objects, so a layer ends at its ``mlp_add``)."""
    out: list[MoeSlots] = []
    acc = dict.fromkeys(SLOTS, 0.0)
    moe = False
    for op, ph in op_times:
        if op.layer < 0:
            continue
        moe = moe or op.module == "dispatch"
        for name in phases:
            t = ph.get(name)
            if t is None:
                continue
            comm = sum(t.comm.get(g, 0.0) for g in EP_GROUPS)
            compute = t.total - sum(t.comm.values())
            if op.module in ("dispatch", "combine"):
                acc[op.module] += comm
                if op.module == "dispatch":
                    acc["attn"] += compute  # permute: before the all-to-all in forward
            elif op.module in MLP_MODULES:
                acc["mlp_wgrad" if name == "bwd_weight" else "mlp"] += compute
            elif not op.module.endswith("_add"):
                acc["attn"] += compute
        if op.module == "mlp_add":  # the layer's last op
            if moe:
                out.append(MoeSlots(**acc))
            acc = dict.fromkeys(acc, 0.0)
            moe = False
    return out


def hidden_all_to_all(fwd: list[MoeSlots], bwd: list[MoeSlots], delay_wgrad: bool) -> float:
    """Seconds of all-to-all hidden when a forward (layers ``fwd``) and a backward (layers
    ``bwd``) run paired: per layer pair, each all-to-all up to the compute in its slot."""
    hidden = 0.0
    for f, b in zip(fwd, reversed(bwd)):
        b_mlp = b.mlp if delay_wgrad else b.mlp + b.mlp_wgrad
        under_b_dispatch = f.mlp + (b.mlp_wgrad if delay_wgrad else 0.0)
        hidden += min(b.combine, f.attn) + min(f.dispatch, b_mlp) + min(b.dispatch, under_b_dispatch) + min(f.combine, b.attn)
    return hidden
