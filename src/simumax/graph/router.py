"""The MoE router of one layer as Megatron-Core's ``TopKRouter`` runs it
(``megatron/core/transformer/moe/router.py`` and ``moe_utils.topk_softmax_with_capacity``):
the gating GEMM, then a chain of small [tokens, experts] kernels that the routing options
choose. Each small kernel costs at least its launch latency, so the chain is listed kernel
by kernel (bytes: what it reads and writes).

Forward, in order:
* forced load balancing (``moe_router_force_load_balancing``, a benchmark option): the
  logits replaced by random ones (``moe_utils.RandomSTE``: a clone of the logits filled by
  ``normal_`` from a per-rank generator; its backward passes the gradient through, no kernel);
* z-loss (``moe_z_loss_coeff``): logsumexp of the logits, its square's mean;
* scores: ``softmax`` pre-top-k (softmax over all experts, then top-k), or post (top-k of
  the logits, softmax over the k); ``sigmoid``: sigmoid of the logits, plus the expert bias
  (``moe_router_enable_expert_bias``) for choosing, top-k, the unbiased scores gathered back
  and, for k > 1, normalised (sum, divide);
* group-limited top-k (``moe_router_num_groups`` / ``moe_router_group_topk``): per group the
  top scores summed, top groups, a group mask (zeros, scatter), expanded over the experts,
  the scores masked, before the top-k;
* ``moe_router_topk_scaling_factor``: the probabilities scaled;
* dense probabilities and routing map (zeros, scatter, bool), tokens per expert;
* a capacity factor: the capacity top-k over tokens, its mask, the masked probabilities;
* load balancing: ``aux_loss`` (softmax scores over all experts, their per-expert sum, the
  loss; tokens per expert all-reduced over TP with SP), ``seq_aux_loss`` (the same per
  sequence: one more scatter), ``global_aux_loss`` (tokens per expert also all-reduced over
  DP), ``none``; the expert bias accumulates tokens per expert for its update at the step.

Backward mirrors the differentiable ones (the rest carry no gradient): capacity mask,
gather of the dense probabilities, scaling, normalisation, the score function, the group
mask, the aux and z losses, the sum of the logit gradients, then the data-gradient GEMM.
"""

from __future__ import annotations

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph.dims import Dims
from simumax.graph.kernels import TF32_PREFIX, Collective, Gemm, Kernel, MemBound

FP32 = 4
INDEX = 8  # torch.topk indices: int64


def _score_topk(model: ModelConfig, t: int, ab: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Megatron's unfused ``topk_routing_with_score_function``: the score function, group-limited
    top-k, top-k, normalisation and scaling, then the dense probabilities and routing map."""
    E, k = model.expert_num or 1, model.topk or 1
    te, tk = float(t * E), float(t * k)
    sigmoid = model.moe_router_score_function == "sigmoid"
    groups = model.moe_router_num_groups
    chain: list[tuple[str, float]] = []
    back: list[tuple[str, float]] = []
    # the scores top-k picks from (fp32 unless top-k runs on the logits directly)
    if sigmoid:
        chain.append(("sigmoid", te * (ab + FP32)))
        if model.moe_router_enable_expert_bias:
            chain.append(("add_expert_bias", 2 * te * FP32))
        score_bytes = FP32
    elif model.moe_router_pre_softmax:
        chain.append(("softmax", te * (ab + FP32)))
        score_bytes = FP32
    else:
        score_bytes = ab
    if groups:
        g = float(t * groups)
        chain += [
            ("group_scores_topk", te * score_bytes), ("group_scores_sum", 2 * g * FP32), ("group_topk", g * FP32 + t * INDEX),
            ("group_mask_zeros", g * FP32), ("group_mask_scatter", g * FP32), ("group_mask_expand", te),
            ("masked_scores", te * (2 * score_bytes + 1)),
        ]
        back.append(("masked_scores_bwd", te * (2 * FP32 + 1)))
    chain.append(("topk", te * score_bytes + tk * (score_bytes + INDEX)))
    if sigmoid:
        if model.moe_router_enable_expert_bias:
            chain.append(("gather_scores", tk * (FP32 + INDEX) + tk * FP32))
        if k > 1:
            chain += [("probs_sum", tk * FP32 + t * FP32), ("probs_normalise", 2 * tk * FP32 + t * FP32)]
            back.append(("probs_normalise_bwd", 3 * tk * FP32 + 2 * t * FP32))
        back += [("topk_bwd", 2 * te * FP32), ("sigmoid_bwd", 3 * te * FP32)]
    elif model.moe_router_pre_softmax:
        back += [("topk_bwd", 2 * te * FP32), ("softmax_bwd", 3 * te * FP32)]
    else:
        chain.append(("topk_softmax", tk * 2 * FP32))
        back += [("softmax_bwd", tk * 3 * FP32), ("topk_bwd", 2 * te * ab)]
    if model.moe_router_topk_scaling_factor:
        chain.append(("scale_probs", 2 * tk * FP32))
        back.insert(0, ("scale_probs_bwd", 2 * tk * FP32))
    chain += [("gates_zeros", te * ab), ("gates_scatter", te * ab), ("map_zeros", te * 4), ("map_scatter", te * 4),
              ("map_bool", te * 5)]
    back.insert(0, ("gather_bwd", te * ab))
    return chain, back


def _fused_score_topk(te: float, ab: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """TE's ``fused_topk_with_score_function`` (``--moe-router-fusion``;
    transformer_engine/pytorch/router.py ``FusedTopkScoreFunction``, csrc/extensions/router.cpp):
    one kernel reads the logits and writes the dense probabilities (logit dtype), the bool
    routing map and an fp32 intermediate kept for backward, whatever the score function, groups,
    expert bias and scaling; its backward one kernel (map, intermediate and gradient in, the
    logits' gradient out)."""
    return [("fused_topk", te * (2 * ab + 1 + FP32))], [("fused_topk_bwd", te * (1 + FP32 + 2 * ab))]


def router_kernels(model: ModelConfig, d: Dims, P: str, tokens: int, h: int, capacity: bool,
                   dp_reduce: bool, fused: bool = False, fp32: bool = False) -> tuple[list[Kernel], list[Kernel]]:
    """(forward, backward-input) kernels of one router on ``tokens`` local tokens; ``fused``:
    TE's fused router kernels (``moe_router_fusion``); ``fp32``: ``moe_router_dtype`` fp32
    (logits and every routing tensor in fp32, the data-gradient GEMM on fp32 operands:
    ``fp32_gemm_kernels``)."""
    t, E = tokens, model.expert_num or 1
    te = float(t * E)
    ab = FP32 if fp32 else d.act_bytes  # the logits' dtype, which the routing tensors keep
    lb = model.moe_router_load_balancing_type
    chain: list[tuple[str, float]] = []
    back: list[tuple[str, float]] = []
    if model.moe_router_force_load_balancing:
        chain += [("random_logits.clone", 2 * te * ab), ("random_logits.normal", te * ab)]
    if model.moe_z_loss_coeff:
        chain += [("z_loss.logsumexp", te * ab + t * FP32), ("z_loss.mean", 2 * t * FP32)]
    routed, routed_back = _fused_score_topk(te, ab) if fused else _score_topk(model, t, ab)
    chain += [*routed, ("tokens_per_expert", te)]
    back += routed_back
    if capacity:
        chain += [("capacity_topk", te * ab), ("cap_zeros", te * ab), ("cap_scatter", te * ab), ("cap_bool", te * 3),
                  ("mask_probs", te * 3 * ab)]
        back.insert(0, ("mask_probs_bwd", te * 3 * ab))
    extra_grads = 0
    comm: list[Kernel] = []
    if lb != "none":
        if fused:
            # TE's fused_compute_score_for_moe_aux_loss (scores fp32, its own routing map, an fp32
            # intermediate kept), the map's per-expert count, fused_moe_aux_loss; backward: the
            # loss's gradient over the scores, then the scores' back to the logits
            chain += [("aux_fused_scores", te * (ab + 2 * FP32 + 1)), ("aux_tokens_per_expert", te)]
        else:
            chain += [("aux_scores", te * (ab + FP32))]
        if lb == "seq_aux_loss":
            chain.append(("aux_seq_tokens_per_expert", te + float(d.b * E * FP32)))
        chain.append(("aux_loss", te * FP32))
        if fused:
            back += [("aux_fused_loss_bwd", te * FP32), ("aux_fused_scores_bwd", te * (2 * FP32 + ab))]
        else:
            back.append(("aux_bwd", te * (ab + 2 * FP32)))
        extra_grads += 1
        if d.sp and d.tp > 1:
            comm.append(Collective("all_reduce", float(E * FP32), "tp"))
        if lb == "global_aux_loss" and dp_reduce:
            comm.append(Collective("all_reduce", float(E * FP32), "dp"))
    if model.moe_router_enable_expert_bias:
        chain.append(("expert_bias_tokens", 2.0 * E * FP32))
    if model.moe_z_loss_coeff:
        back.append(("z_loss_bwd", te * (2 * ab + FP32) + t * FP32))
        extra_grads += 1
    if extra_grads:
        back.append(("add_grads", (2 + extra_grads) * te * ab))
    gating = Gemm(t, h, E, "TN", out_dtype="fp32") if fp32 else Gemm(t, h, E, "TN")
    dgrad = fp32_gemm_kernels("dgrad", Gemm(t, E, h, "NN"), cast_in=float(E * h), d=d) if fp32 else [Gemm(t, E, h, "NN")]
    fwd: list[Kernel] = [gating, *(MemBound(f"router.{n}", b) for n, b in chain), *comm]
    bwd: list[Kernel] = [*(MemBound(f"router.{n}", b) for n, b in back), *dgrad]
    return fwd, bwd


def routing_bytes(st: StrategyConfig, d: Dims) -> int:
    """Bytes per element of the router's logits and of the routing probabilities made from them
    (``probs.type_as(logits)``): fp32 with ``moe_router_dtype`` fp32, else the activation dtype."""
    return FP32 if st.moe_router_dtype == "fp32" else d.act_bytes


def router_saved(model: ModelConfig, P: str, tokens: int, batch: int, ab: int) -> tuple[tuple[str, float], ...]:
    """What Megatron-Core's unfused routing keeps for backward (autograd's saved tensors of
    ``moe_utils.topk_routing_with_score_function`` and the losses; TransformerEngine does not
    enter it, so both transformer implementations keep the same), beside the gating GEMM's
    input. ``ab``: the logits' bytes per element. Checked against Megatron-Core on CPU
    (tests/test_megatron_reference.py: softmax, pre-softmax top-1, sigmoid with expert bias and
    groups, aux / seq-aux loss, z-loss).

    * softmax after top-k: the top-k indices (int64) and the fp32 softmax over the k scores;
      softmax first (top-1): the fp32 softmax over all experts and the indices;
    * sigmoid: its fp32 output over all experts and the indices (gathered from it; the expert
      bias and group-limited top-k only pick them, their tensors are freed) and, with k > 1,
      the normalisation's operands (the k scores and their [t, 1] sum);
    * a load-balancing loss: the fp32 scores over all experts (softmax, or sigmoid and its
      [t, 1] sum), the tokens per expert (int64; per sequence with seq_aux_loss) and the loss;
    * z-loss: logsumexp's input (the logits) and output, and the loss.
    Dropping to a capacity (``apply_router_token_dropping``) changes what routing and the
    permutation keep; that path is not checked against Megatron-Core and adds nothing here."""
    t, E, k = tokens, model.expert_num or 1, model.topk or 1
    te = float(t * E)
    idx = (f"{P}.router.topk_idx", float(t * k * INDEX))
    if model.moe_router_score_function == "sigmoid":
        saved = [(f"{P}.router.sigmoid", te * FP32), idx]
        if k > 1:
            saved += [(f"{P}.router.topk_scores", float(t * k * FP32)), (f"{P}.router.score_sum", float(t * FP32))]
    elif model.moe_router_pre_softmax:
        saved = [(f"{P}.router.softmax", te * FP32), idx]
    else:
        saved = [idx, (f"{P}.router.softmax", float(t * k * FP32))]
    lb = model.moe_router_load_balancing_type
    if lb != "none":
        saved.append((f"{P}.router.aux_scores", te * FP32))
        if model.moe_router_score_function == "sigmoid":
            saved.append((f"{P}.router.aux_score_sum", float(t * FP32)))
        counts = batch * E if lb == "seq_aux_loss" else E
        saved += [(f"{P}.router.aux_tokens_per_expert", float(counts * INDEX)), (f"{P}.router.aux_loss", float(FP32))]
    if model.moe_z_loss_coeff:
        saved += [(f"{P}.router.z_logits", te * ab), (f"{P}.router.z_logsumexp", float(t * ab)), (f"{P}.router.z_loss", float(ab))]
    return tuple(saved)


def fp32_gemm_kernels(name: str, g: Gemm, cast_in: float, d: Dims) -> list[Kernel]:
    """A router gradient GEMM with ``moe_router_dtype`` fp32, as megatron-core's
    ``RouterGatingLinearFunction.backward`` runs it (``transformer/moe/moe_utils.py``): the
    bf16 operand it takes from forward (``cast_in`` elements: the weight for the data
    gradient, the input for the weight gradient) cast to fp32, the GEMM on fp32 operands
    (TF32 tensor cores: TE's GEMM runs fp32 inputs so) writing fp32, its output cast back to
    the bf16 of the input or weight."""
    ab = d.act_bytes
    return [
        MemBound(f"router.{name}_cast_fp32", cast_in * (ab + FP32)),
        g._replace(out_dtype="fp32", accumulate=False, family=TF32_PREFIX + g.family),
        MemBound(f"router.{name}_cast_back", float(g.m * g.n) * (FP32 + ab)),
    ]
