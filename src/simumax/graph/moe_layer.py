"""The MoE MLP of one layer, as Megatron-Core's MoELayer runs it.

router (GEMM h -> E and the routing options' small kernels, graph/router.py) -> dispatch (permute tokens by expert, EP
all-to-all, ETP all-gather, sort received chunks by local expert) -> experts (grouped
GEMM FC1, activation, grouped GEMM FC2) -> combine (the mirror of dispatch; the fused
unpermute merges the top-k copies of each token weighted by their routing probabilities)
-> shared experts (a TP MLP on the same input, graph/shared_experts.py) -> sum. ``moe_dispatcher_policy: all_gather``
swaps dispatch/combine for an all-gather of all tokens and a reduce-scatter of the output;
``flex`` (DeepEP / HybridEP) sends each token once per destination node and rank instead of
once per routed expert (the all-to-all's ``fanout``, costed in cost/network.py).

Sizes per rank: ``MoeDims`` (graph/moe_rows.py).
"""

from __future__ import annotations

import math

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, linears
from simumax.graph import fp8 as fp8_recipe
from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, Gemm, GroupGemm, Kernel, MemBound, host_wait
from simumax.graph.moe_rows import MoeDims
from simumax.graph.ops import Op, Tensor
from simumax.graph.router import fp32_gemm_kernels, router_kernels, router_saved, routing_bytes
from simumax.graph.shared_experts import shared_expert_ops

FP32 = 4
INDEX = 4  # int32 row-id maps


def _router(P: str, layer: int, model: ModelConfig, st: StrategyConfig, d: Dims, md: MoeDims, x: Tensor, h: int) -> Op:
    """Gating GEMM (weight replicated over TP), then Megatron's routing as the chain of
    small kernels its options choose (graph/router.py)."""
    t, E = md.tokens, md.experts
    te = float(t * E)
    fp32 = st.moe_router_dtype == "fp32"
    ab = routing_bytes(st, d)  # the logits' dtype
    fwd, bwd = router_kernels(model, d, P, t, h, model.capacity is not None, st.dp_size > 1, st.moe_router_fusion, fp32)
    wgrad = Gemm(E, t, h, "NT", accumulate=True, out_dtype="fp32")
    bwd_weight: tuple[Kernel, ...] = (wgrad,)
    bwd_transient = 4 * te * ab
    if fp32:
        # the weight gradient from the fp32 copy of the input, cast to bf16, which DDP's hook
        # adds to the fp32 main grad (main_grad.add_(grad)); alive at its peak: the fp32 input
        # copy, the fp32 input gradient (cast back after both GEMMs) and the fp32 weight gradient
        bwd_weight = (*fp32_gemm_kernels("wgrad", wgrad, cast_in=float(t * h), d=d),
                      MemBound("router.main_grad_add", float(E * h) * (2 * st.main_grad_bytes + d.act_bytes)))
        bwd_transient += float(t * h) * 2 * FP32 + float(E * h) * FP32
    scores = te * FP32
    if st.moe_router_fusion:
        # TE's fused top-k keeps its routing map and fp32 intermediate; its fused aux-loss
        # scores keep another fp32 intermediate (transformer_engine/pytorch/router.py)
        aux = ((f"{P}.router.aux_intermediate", scores),) if model.moe_router_load_balancing_type != "none" else ()
        saved: tuple[Tensor, ...] = (x, (f"{P}.router.intermediate", scores), (f"{P}.router.map", te), *aux)
    else:
        saved = (x, *router_saved(model, P, t, d.b, ab))
    return Op(
        name=f"{P}.router", module="router", layer=layer,
        fwd=tuple(fwd), bwd_input=tuple(bwd),
        bwd_weight=bwd_weight,
        saved=saved,
        input=(x,), fwd_transient=4 * te * ab, bwd_transient=bwd_transient,
        params=E * h, tp_replicated_params=E * h,
    )


def _chunk_sort(P: str, name: str, md: MoeDims, nbytes: float, pad: bool) -> tuple[list[Kernel], list[Kernel]]:
    """Re-order received rows between source-rank and local-expert order (only needed when
    a rank holds several experts and receives from several ranks): a transpose + contiguous
    copy with drop-and-pad, the fused sort_chunks_by_idxs permute kernel otherwise."""
    if md.local_experts <= 1 or md.ep <= 1:
        return [], []
    f_fam, b_fam = ("default", "default") if pad else ("permute_fwd", "permute_bwd")
    return [MemBound(name, 2.0 * nbytes, family=f_fam)], [MemBound(f"{name}_bwd", 2.0 * nbytes, family=b_fam)]


def _permute_kernels(P: str, md: MoeDims, moved: float, fused: bool) -> tuple[list[Kernel], list[Kernel]]:
    """Token permute (forward) and its backward. Fused: TE's row-id-map + permute kernels.
    Unfused: the routing map transposed, the sorted indices built (argsort / masked_select),
    then an index_select gather (backward: zeros + index_add scatter)."""
    if fused:
        return [MemBound("permute", moved, family="permute_fwd")], [MemBound("permute_bwd", moved, family="permute_bwd")]
    te = float(md.tokens * md.experts)
    fwd: list[Kernel] = [
        MemBound("map_transpose", 2 * te), MemBound("sort_indices", 2 * te + md.rows_sent * 8.0),
        MemBound("index_select", moved),
    ]
    return fwd, [MemBound("grad_zeros", moved / 2), MemBound("index_add", moved)]


def _dispatch(
    P: str, layer: int, d: Dims, md: MoeDims, x: Tensor, out: Tensor, h: int, probs: bool, pad: bool, fused: bool
) -> Op:
    """Permute by expert, EP all-to-all, ETP all-gather, sort chunks by local expert.

    Without padding to capacity the split sizes are the data's: Megatron's all-to-all
    dispatcher gathers every rank's tokens per expert over the EP x ETP group
    (``preprocess``), copies them to the host and waits for them before the all-to-all
    (``_maybe_dtoh_and_synchronize``), and DeepEP's dispatch (the flex dispatcher) waits on the
    host for the received counts; the recomputed forward waits again."""
    row = h * d.act_bytes + (FP32 if probs else 0)  # the routing prob travels with its token
    sent, recv = md.rows_sent * row, md.rows_received * row
    a2a = Collective("all2all", float(max(sent, recv)), "ep", md.fanout)
    perm_f, perm_b = _permute_kernels(P, md, float(md.tokens * h * d.act_bytes + sent), fused)
    counts: list[Kernel] = []
    wait: list[Kernel] = []
    if not pad:
        if md.fanout is None and md.ep * md.etp > 1:  # the all-to-all dispatcher's int64 counts
            counts.append(Collective("all_gather", float(md.experts * 8 * md.ep * md.etp), "ep" if md.ep > 1 else "etp"))
        wait.append(host_wait("dispatch.host_wait"))
    fwd: list[Kernel] = [*counts, *perm_f, *wait, a2a]
    bwd: list[Kernel] = []
    gathered = recv * md.etp
    if md.etp > 1:
        fwd.append(Collective("all_gather", float(gathered), "etp"))
        bwd.append(Collective("reduce_scatter", float(gathered), "etp"))
    sort_f, sort_b = _chunk_sort(P, "sort_chunks", md, gathered, pad)
    fwd += sort_f
    bwd = [*sort_b, *bwd, a2a, *perm_b]
    row_map: tuple[Tensor, ...] = ((f"{P}.dispatch.row_map", float(md.tokens * md.topk * INDEX)),)
    if not fused:  # int64 indices: the gather's sorted token ids and the [tokens x experts] map
        row_map = ((f"{P}.dispatch.sorted_ids", float(md.rows_sent * 8)), (f"{P}.dispatch.map", float(md.tokens * md.experts * 8)))
    return Op(
        name=f"{P}.dispatch", module="dispatch", layer=layer, fwd=tuple(fwd), bwd_input=tuple(bwd),
        saved=row_map,
        input=(x,), output=out, fwd_transient=float(sent + recv), bwd_transient=float(sent + recv + gathered),
    )


def _experts(P: str, name: str, module: str, layer: int, st: StrategyConfig, md: MoeDims, x: Tensor, k: int, n: int,
             bias: bool = False) -> Op:
    """One expert linear over all local experts: grouped GEMM (TE GroupedLinear), one GEMM
    per expert (``serial``), or one GEMM over all rows (``merged``, an efficiency bound)."""
    ng, M = md.local_experts, md.rows_per_expert
    grad = "fp32" if st.main_grad_bytes == 4 else "bf16"
    mode = st.group_linear_mode
    fp8 = st.low_precision
    wgrad_fp8 = fp8 and st.fp8_wgrad_on  # else BF16 weight gradients on the kept BF16 input (linears._linear)
    recipe = fp8_recipe.recipe(st.lp_recipe)
    if mode == "grouped":
        fam, dt = (f"{recipe.family}_group_matmul", recipe.family) if fp8 else ("group_matmul", "bf16")
        w_fam, w_dt = (fam, dt) if wgrad_fp8 else ("group_matmul", "bf16")
        fwd: tuple[Kernel, ...] = (GroupGemm(ng, M, n, k, "fwd", grad, dt, fam),)
        dgrad: tuple[Kernel, ...] = (GroupGemm(ng, M, n, k, "bwd_grad_act", grad, dt, fam),)
        wgrad: tuple[Kernel, ...] = (GroupGemm(ng, M, n, k, "bwd_grad_w", grad, w_dt, w_fam),)
    else:
        fam = f"{recipe.family}_matmul" if fp8 else "matmul"
        w_fam = fam if wgrad_fp8 else "matmul"
        reps, rows = (ng, M) if mode == "serial" else (1, M * ng)
        fwd = (Gemm(rows, k, n, "TN", family=fam),) * reps
        dgrad = (Gemm(rows, n, k, "NN", family=fam),) * reps
        wgrad = (Gemm(n, rows, k, "NT", accumulate=True, out_dtype=grad, family=w_fam),) * reps
    out_bytes = float(md.expert_rows * n * st.dtype_bytes)
    saved: tuple[Tensor, ...] = (x,)
    if st.offload_groupgemm_col_inputs:
        saved = ()
    elif wgrad_fp8 and st.cache_groupgemm_col_fp8_inputs:
        saved = ((f"{x[0]}.fp8_col", fp8_recipe.saved_input_bytes(recipe, x[1] / st.dtype_bytes)),)
    if fp8:  # quantize the input in forward and the output gradient in backward (graph/fp8.py)
        casts, grad_cast = fp8_recipe.linear_casts(recipe, f"{P}.{name}", x[1] / st.dtype_bytes, out_bytes / st.dtype_bytes,
                                                   ng * k * n, st.dtype_bytes, st.fp8_weights_kept, wgrad_fp8)
        fwd, dgrad = (*casts, *fwd), (*grad_cast, *dgrad)
    fwd_transient = 0.0
    if fp8 and mode != "merged" and not st.moe_router_padding_for_quantization:
        # megatron-core experts.py: each expert's rows padded to the quantized GEMMs' alignment
        # (TE's Fp8Padding before FC1, Fp8Unpadding after FC2; SequentialMLP pads per expert
        # and concatenates), a copy of the rows each way and of their gradients in backward
        if module == "expert_fc1":
            pad = MemBound(f"{name}.quant_pad", 2.0 * x[1] + md.expert_rows * 2.0 * FP32)
            fwd, dgrad = (pad, *fwd), (*dgrad, MemBound(f"{name}.quant_unpad_grad", 2.0 * x[1]))
            fwd_transient = x[1]
        else:
            fwd, dgrad = (*fwd, MemBound(f"{name}.quant_unpad", 2.0 * out_bytes)), (
                MemBound(f"{name}.quant_pad_grad", 2.0 * out_bytes), *dgrad)
    grad_buffer = 0.0
    if not st.gradient_accumulation_fusion:
        # TE GroupedLinear's fuse_wgrad_accumulation off: the weight gradients are written and
        # DDP's hook adds them (linears.weight_gradient); the grouped GEMM keeps its table key
        if mode != "grouped":
            wgrad = tuple(linears.written_wgrad(g, st.dtype_bytes) for g in wgrad if isinstance(g, Gemm))
        add, grad_buffer = linears.wgrad_hook_add(f"{P}.{name}", ng * k * n, st.dtype_bytes, st.main_grad_bytes,
                                                  not st.fsdp2)
        wgrad = (*wgrad, *add)
    params = ng * (k * n + (n if bias else 0))
    return Op(
        name=f"{P}.{name}", module=module, layer=layer, fwd=fwd, bwd_input=dgrad, bwd_weight=wgrad,
        saved=saved, input=(x,), fwd_transient=fwd_transient, bwd_transient=out_bytes + x[1] + grad_buffer,
        params=params, expert_params=params, weight_shapes=((n, k),),
    )


def _combine(
    P: str, layer: int, d: Dims, md: MoeDims, x: Tensor, out: Tensor, h: int, probs_in_experts: bool, pad: bool, fused: bool
) -> Op:
    """Mirror of dispatch; the fused unpermute sums each token's top-k rows. When the
    routing probabilities were not applied in the experts it weights by them here and keeps
    its input (the combined rows) for the probabilities' gradient."""
    row = h * d.act_bytes
    sent, recv = md.rows_sent * row, md.rows_received * row
    gathered = recv * md.etp
    a2a = Collective("all2all", float(max(sent, recv)), "ep", md.fanout)
    sort_f, sort_b = _chunk_sort(P, "unsort_chunks", md, gathered, pad)
    fwd: list[Kernel] = list(sort_f)
    bwd: list[Kernel] = []
    if md.etp > 1:
        fwd.append(Collective("reduce_scatter", float(gathered), "etp"))
        bwd.append(Collective("all_gather", float(gathered), "etp"))
    unpermute = float(sent + md.tokens * row)
    if fused:
        fwd += [a2a, MemBound("unpermute", unpermute, family="permute_fwd")]
        bwd = [MemBound("unpermute_bwd", unpermute, family="permute_bwd"), a2a, *bwd]
    else:  # gather the probs, weight the rows, zeros + scatter_add back to token order
        weight = [MemBound("gather_probs", md.rows_sent * 12.0), MemBound("weight_rows", 2.0 * sent)]
        fwd += [a2a, *(weight if not probs_in_experts else []), MemBound("out_zeros", md.tokens * row), MemBound("scatter_add", unpermute)]
        bwd = [MemBound("unpermute_gather", unpermute), *([MemBound("weight_rows_bwd", 3.0 * sent)] if not probs_in_experts else []), a2a, *bwd]
    bwd += sort_b
    saved: list[Tensor] = []
    if not probs_in_experts:
        saved.append((f"{P}.combine.rows", float(sent)))
    return Op(
        name=f"{P}.combine", module="combine", layer=layer, fwd=tuple(fwd), bwd_input=tuple(bwd),
        saved=tuple(saved), input=(x,), output=out, fwd_transient=float(sent + recv), bwd_transient=float(sent + recv + gathered),
    )


def _allgather_dispatch(P: str, layer: int, d: Dims, md: MoeDims, x: Tensor, out: Tensor, h: int, fused: bool,
                        ab: int) -> tuple[Op, Op]:
    """Megatron's all-gather dispatcher: every rank gathers all tokens (and the routing map)
    of its EP x ETP group, picks the rows of its local experts with a local permute, and
    after the experts scatters them back and reduce-scatters the full output. Its tokens per
    local expert go to the host (``.cpu()`` in ``token_permutation``), which waits for them,
    padded or not. Kept for backward (``MoEAllGatherTokenDispatcher.dispatch_postprocess``):
    the permutation's index (int64 sorted ids unfused, TE's int32 row map fused; the
    un-permutation's scatter reuses it) and ``masked_select``'s mask and input, the local
    experts' routing map and probs over the gathered tokens, transposed (``ab``: the probs'
    bytes); the probs weight the experts' output."""
    row = h * d.act_bytes
    group = md.ep * md.etp
    gathered = float(md.tokens * group * row)
    local = float(md.expert_rows * row)
    picked = float(md.local_experts * md.tokens * group)  # [local experts, gathered tokens]
    index = ((f"{P}.dispatch.row_map", float(md.expert_rows * INDEX)) if fused
             else (f"{P}.dispatch.sorted_ids", float(md.expert_rows * 8)))
    ag = Collective("all_gather", gathered, "ep")
    rs = Collective("reduce_scatter", gathered, "ep")
    dispatch = Op(
        name=f"{P}.dispatch", module="dispatch", layer=layer,
        fwd=(ag, host_wait("dispatch.host_wait"), MemBound("permute", gathered + local, family="permute_fwd")),
        bwd_input=(MemBound("permute_bwd", gathered + local, family="permute_bwd"), rs),
        saved=(index, (f"{P}.dispatch.local_map", picked), (f"{P}.dispatch.local_probs", picked * ab)),
        input=(x,), output=out, fwd_transient=gathered, bwd_transient=2 * gathered,
    )
    combine = Op(
        name=f"{P}.combine", module="combine", layer=layer,
        fwd=(MemBound("unpermute", gathered + local, family="permute_fwd"), rs),
        bwd_input=(ag, MemBound("unpermute_bwd", gathered + local, family="permute_bwd")),
        input=(x,), output=out, fwd_transient=gathered, bwd_transient=2 * gathered,
    )
    return dispatch, combine


def _probs_on_input(P: str, layer: int, md: MoeDims, tokens: Tensor, h: int, ab: int) -> tuple[Op, Tensor]:
    """``moe_apply_probs_on_input`` (top-1; megatron-core 0.19 ``experts.py``, the grouped and
    sequential MLPs' forward): the permuted tokens times their fp32 routing prob (an fp32
    product), cast back to the activation dtype, then fed to FC1; the probs reset to ones, so
    the activation's weighting stays, by 1. Keeps the unweighted tokens and the probs for the
    probs' gradient. Backward: the cast's (to fp32), the tokens' gradient (times the probs,
    cast back) and the probs' (gradient times tokens, summed over the hidden size)."""
    rows = md.expert_rows
    e = float(rows * h)
    weighted = (f"{P}.moe.tokens_weighted", e * ab)
    fwd = (MemBound("probs_on_input.mul", e * (ab + FP32) + rows * FP32), MemBound("probs_on_input.cast", e * (FP32 + ab)))
    bwd = (
        MemBound("probs_on_input.cast_bwd", e * (ab + FP32)),
        MemBound("probs_on_input.tokens_grad", e * 2 * FP32 + rows * FP32), MemBound("probs_on_input.tokens_grad_cast", e * (FP32 + ab)),
        MemBound("probs_on_input.probs_grad", e * (FP32 + ab + FP32)), MemBound("probs_on_input.probs_grad_sum", e * FP32 + rows * FP32),
    )
    op = Op(name=f"{P}.probs_on_input", module="moe_probs", layer=layer, fwd=fwd, bwd_input=bwd,
            saved=(tokens, (f"{P}.moe.probs_on_input", float(rows * FP32))), input=(tokens,), output=weighted,
            fwd_transient=e * FP32, bwd_transient=2 * e * FP32)
    return op, weighted


def _latent_projections(P: str, layer: int, d: Dims, ln_out: Tensor, down_out: Tensor, up_in: Tensor, up_out: Tensor,
                        w: int) -> tuple[list[Op], list[Op]]:
    """Latent MoE's projections (megatron-core 0.19 moe_layer.py ``fc1_latent_proj`` /
    ``fc2_latent_proj``: TE linears in "duplicated" mode, every TP rank the whole weight, on its
    own sequence-sharded tokens): hidden -> latent after the router, latent -> hidden after the
    combine; the router and the shared experts keep the full hidden state."""
    down = linears.replicated_linear(f"{P}.moe_latent_down", "moe_latent_proj", layer, d, ln_out, d.h, w)
    up = linears.replicated_linear(f"{P}.moe_latent_up", "moe_latent_proj", layer, d, up_in, w, d.h)
    return [down.with_(output=down_out)], [up.with_(output=up_out)]


def moe_mlp_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int, x_mid: Tensor) -> list[Op]:
    P = f"L{layer}"
    md = MoeDims.of(model, st, d)
    h = d.h
    rms = model.norm_type == "rmsnorm"
    ln_out = (f"{P}.mlp_norm.out", d.act(h, local=True))
    rows = md.expert_rows
    ab = st.dtype_bytes
    # latent MoE (Megatron --moe-latent-size): the tokens go down to the latent width before
    # the dispatch and come back up after the combine; the experts run in it
    w = model.moe_latent_size or h
    tokens = (f"{P}.moe.tokens", float(rows * w * ab))
    swiglu = model.use_swiglu
    fc1_n = 2 * md.ffn if swiglu else md.ffn
    fc1_out = (f"{P}.expert_fc1.out", float(rows * fc1_n * ab))
    act_out = (f"{P}.moe_act.out", float(rows * md.ffn * ab))
    fc2_out = (f"{P}.expert_fc2.out", float(rows * w * ab))
    routed = (f"{P}.moe.routed", d.act(h, local=True))
    disp_in, combined, latent_down, latent_up = ln_out, routed, [], []
    if model.moe_latent_size:
        disp_in, combined = (f"{P}.moe.latent_in", d.act(w, local=True)), (f"{P}.moe.latent_out", d.act(w, local=True))
        latent_down, latent_up = _latent_projections(P, layer, d, ln_out, disp_in, combined, routed, w)
    local = st.transformer_impl == "local"
    # the local spec's experts always weight by the probs; applying them on the input needs them there
    probs_in_experts = st.dispatch_probs or local or st.moe_apply_probs_on_input
    pad = model.moe_pad_expert_input_to_capacity and model.capacity is not None

    act_saved: list[Tensor] = [fc1_out]
    if local:
        # Megatron-Core's SequentialMLP: the dense MLP's unfused activation (SwiGLU keeps
        # silu(gate) and up + offset), then the activation times the routing prob (bf16),
        # which keeps the activation and the probs; FC2 keeps the product
        unit = float(rows * md.ffn * ab)
        if swiglu:
            act_saved += [(f"{P}.moe_act.silu_out", unit), (f"{P}.moe_act.up", unit)]
        if probs_in_experts:  # the probs in the router's dtype
            act_saved += [(f"{P}.moe_act.unweighted", unit), (f"{P}.moe_act.probs", float(rows * routing_bytes(st, d)))]
    elif probs_in_experts:  # weighted activation: prob * act(x); keeps the probs for their grad
        act_saved.append((f"{P}.moe_act.probs", float(rows * FP32)))
    act = Op(
        name=f"{P}.moe_act", module="moe_act", layer=layer,
        fwd=(MemBound("moe_act.fwd", fc1_out[1] + act_out[1]),),
        bwd_input=(MemBound("moe_act.bwd", 2 * fc1_out[1] + act_out[1]),),
        saved=tuple(act_saved), input=(fc1_out,), output=act_out, bwd_transient=fc1_out[1] + act_out[1],
    )
    if st.moe_dispatcher_policy == "all_gather":
        dispatch, combine = _allgather_dispatch(P, layer, d, md, disp_in, tokens, w, st.moe_permute_fusion and not local,
                                                routing_bytes(st, d))
        combine = combine.with_(input=(fc2_out,), output=combined)
    else:
        fused = st.moe_permute_fusion and not local  # TE's fused permute kernels
        dispatch = _dispatch(P, layer, d, md, disp_in, tokens, w, probs_in_experts, pad, fused)
        combine = _combine(P, layer, d, md, fc2_out, combined, w, probs_in_experts, pad, fused)
    on_input: list[Op] = []
    fc1_in = tokens
    if st.moe_apply_probs_on_input:
        op, fc1_in = _probs_on_input(P, layer, md, tokens, w, ab)
        on_input.append(op)
    routed_ops = [
        dispatch,
        *on_input,
        _experts(P, "expert_fc1", "expert_fc1", layer, st, md, fc1_in, w, fc1_n, bias=model.add_bias_linear).with_(output=fc1_out),
        act,
        _experts(P, "expert_fc2", "expert_fc2", layer, st, md, act_out, md.ffn, w, bias=model.add_bias_linear).with_(output=fc2_out),
        combine,
    ]
    for i, op in enumerate(routed_ops):
        guess = MoeDims.approximate(op.module in ("dispatch", "combine"), pad, st.moe_dispatcher_policy,
                                    model.moe_router_force_load_balancing)
        if guess:
            routed_ops[i] = op.with_(approximate=guess)
    ops = [
        blocks.norm(f"{P}.mlp_norm", "mlp_norm", layer, d, x_mid, rms=rms, save_rstd=not st.recompute_variance, residual=True).with_(output=ln_out),
        _router(P, layer, model, st, d, md, ln_out, h),
        *latent_down,
        *routed_ops,
        *latent_up,
    ]
    if model.moe_shared_expert_intermediate_size:
        ops += [*shared_expert_ops(P, layer, model, st, d, ln_out),
                Op(name=f"{P}.moe_sum", module="moe_sum", layer=layer, fwd=(MemBound("moe_sum", 3 * routed[1]),))]
    ops.append(blocks.dropout_add(f"{P}.mlp_add", "mlp_add", layer, d, dropout=st.enable_dropout))
    return ops
