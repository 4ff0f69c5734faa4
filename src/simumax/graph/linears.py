"""Tensor-parallel linears as Megatron-Core / TransformerEngine run them, for one micro-batch
on one rank (see docs/modeling.md):

* column-parallel linear (QKV, FC1, LM head): with SP, all-gather of the sequence-sharded
  input in forward; in backward the input is re-gathered for the weight gradient and the
  input gradient is reduce-scattered. Without SP: one all-reduce of the input gradient in
  backward. All exposed: the validation runs disabled TP communication overlap, and
  treating TE's asynchronous re-gather as hidden under-predicts every TP>1 case. An fp8
  linear gathers the quantized tensor (``gathered_bytes``).
* row-parallel linear (attention out, FC2): reduce-scatter (SP) or all-reduce of the output
  in forward; all-gather of the output gradient in backward with SP.
* a linear saves its local (not gathered) input; weight gradients accumulate into fp32
  main_grad (Megatron's gradient-accumulation fusion: NT GEMM with accumulate=True), or
  without the fusion are written and added by DDP's hook (``weight_gradient``).
"""

from __future__ import annotations

from simumax.graph import fp8
from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, Gemm, MemBound, op_label
from simumax.graph.ops import Op, Tensor


def _linear(
    name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, *, fwd_before: list, fwd_after: list,
    bwd_before: list, bwd_after: list, fwd_transient: float, bwd_transient: float, bias: bool, te: bool,
    rows: int | None = None, keep_original: bool = False,
) -> Op:
    """A linear on [rows, k] -> [rows, n] (this rank's shard; rows default to the gathered
    tokens) with the TP collectives around its forward GEMM and its input-gradient GEMM.
    ``keep_original``: an fp8 linear that keeps its BF16 input rather than an FP8 copy (TE's
    ``save_original_input``): the input cast row-wise only in forward, column-wise from the kept
    input in backward."""
    t = d.tokens if rows is None else rows
    fam = wgrad_fam = "matmul"
    saved = x
    fwd_cast: list[MemBound] = []
    bwd_cast: list[MemBound] = []
    if d.fp8 and te:
        # quantize the input (kept in fp8 for the weight gradient) and, in backward, the
        # output gradient, each in both layouts, as the recipe does (graph/fp8.py); the
        # bf16 input is not kept by this op
        r = fp8.recipe(d.fp8_recipe)
        fam = f"{r.family}_matmul"
        x_elems = x[1] / d.act_bytes
        if d.fp8_wgrad:
            # each TE module quantizes its own input: two linears on one tensor (MLA's q and kv
            # down-projections) keep two copies
            wgrad_fam, saved = fam, (fp8_copy_name(x[0], name), fp8.saved_input_bytes(r, x_elems))
        # else the weight gradient runs in BF16 on the BF16 input, which the op keeps
        fwd_cast, bwd_cast = fp8.linear_casts(r, name, x_elems, t * n, k * n, d.act_bytes, d.fp8_weight_caching,
                                              d.fp8_wgrad)
    # the bias gradient: TE folds it into the weight-gradient GEMM's epilogue (or the fp8
    # cast-transpose); Megatron-Core's own linears reduce the output gradient over tokens
    # (grad_output.sum(0), or the autograd sum behind a fused bias-GeLU / bias-dropout-add)
    bias_grad = [MemBound(f"{op_label(name)}.bias_grad", t * n * d.act_bytes)] if bias and d.local else []
    wgrad, grad_buffer = weight_gradient(name, d, Gemm(n, t, k, "NT", accumulate=True, out_dtype="fp32", family=wgrad_fam))
    op = Op(
        name=name,
        module=module,
        layer=layer,
        fwd=(*fwd_cast, *fwd_before, Gemm(t, k, n, "TN", family=fam), *fwd_after),
        bwd_input=(*bwd_cast, *bwd_before, Gemm(t, n, k, "NN", family=fam), *bwd_after),
        bwd_weight=(*wgrad, *bias_grad),
        saved=(saved,),
        input=(x,),
        fwd_transient=fwd_transient,
        bwd_transient=bwd_transient + grad_buffer,
        params=k * n + (n if bias else 0),
        weight_shapes=((n, k),) if te else (),
    )
    return keep_original_input(op, d.fp8_recipe, d.act_bytes) if keep_original and d.fp8 and te else op


def fp8_copy_name(tensor: str, op_name: str) -> str:
    """The FP8 copy of ``tensor`` that the TE linear ``op_name`` keeps for its weight gradient."""
    return f"{tensor}.fp8.{op_label(op_name)}"


def keep_original_input(op: Op, recipe: str, act_bytes: int) -> Op:
    """An fp8 linear told to keep its BF16 input instead of its FP8 copy (TransformerEngine's
    ``save_original_input``, megatron-core's ``set_save_original_input``): forward casts the
    input row-wise only, backward casts the kept input column-wise for the weight gradient. An
    op that keeps no FP8 copy (BF16 weight gradient) is returned as it is."""
    x = op.input[0]
    copy = fp8_copy_name(x[0], op.name)
    if not any(t[0] == copy for t in op.saved):
        return op
    r = fp8.recipe(recipe)
    one_layout = fp8.quantize_bytes(r, x[1] / act_bytes, act_bytes, layouts=1)
    label = op_label(op.name)
    fwd = tuple(k._replace(bytes=one_layout) if isinstance(k, MemBound) and k.name == f"{label}.quantize_input" else k
                for k in op.fwd)
    return op.with_(saved=tuple(x if t[0] == copy else t for t in op.saved), fwd=fwd,
                    bwd_input=(MemBound(f"{label}.quantize_kept_input", one_layout), *op.bwd_input))


def weight_gradient(name: str, d: Dims, fused: Gemm) -> tuple[tuple[Gemm | MemBound, ...], float]:
    """(kernels, transient bytes) of a linear's weight gradient: the GEMM accumulating into
    the main grad (``fused``, Megatron's gradient-accumulation fusion), or without the fusion
    the GEMM writing it and DDP's hook adding it (``written_wgrad``, ``wgrad_hook_add``)."""
    if d.wgrad_fused:
        return (fused,), 0.0
    add, held = wgrad_hook_add(op_label(name), fused.m * fused.n * fused.b, d.act_bytes, d.main_grad_bytes, d.grad_hook)
    return (written_wgrad(fused, d.act_bytes), *add), held


def written_wgrad(g: Gemm, act_bytes: int) -> Gemm:
    """A weight-gradient GEMM without gradient-accumulation fusion (``--no-gradient-
    accumulation-fusion``; TE's ``fuse_wgrad_accumulation`` follows it): it writes the
    gradient in the parameter dtype instead of accumulating into the main grad."""
    return g._replace(accumulate=False, out_dtype="bf16" if act_bytes == 2 else "fp32")  # 2 B: bf16 or fp16


def wgrad_hook_add(label: str, params: float, act_bytes: int, main_grad_bytes: int,
                   hook: bool) -> tuple[tuple[MemBound, ...], float]:
    """(kernels, bytes held) of DDP's backward hook adding a written weight gradient to the
    main grad (``distributed_data_parallel._make_backward_post_hook``:
    ``param.main_grad.add_(param.grad.data)``, then ``param.grad = None``): read both,
    write the main grad, every micro-batch; the gradient is held from its GEMM to the add.
    Under FSDP2 (``hook`` false: ``Dims.grad_hook``) no hook runs: fully_shard reduce-scatters the written
    gradients of its unit, which the model states hold (memory/model_states.py)."""
    if not hook:
        return (), 0.0
    return (MemBound(f"{label}.main_grad_add", params * (act_bytes + 2 * main_grad_bytes)),), float(params * act_bytes)


def gathered_bytes(d: Dims, full: float, te: bool) -> float:
    """Bytes of a sequence-parallel all-gather feeding a linear's GEMM (``full``: the
    gathered tensor in the activation dtype). TE quantizes the local shard first and gathers
    the FP8 data row-wise with its scales: TE 1.x ``_LayerNormLinear`` / ``_LayerNormMLP``
    gather ``ln_out``, which the norm wrote in FP8, and ``_Linear``'s backward casts the
    output gradient before gathering it ("FP8 case with gather: unfused bgrad, cast,
    transpose for efficient gather"); TE 2.x ``distributed.gather_along_first_dim`` gathers
    Float8, blockwise and MXFP8 tensors quantized. So an FP8 linear's gathers carry 1 B and
    the recipe's scales per element (NVFP4 kept in the activation dtype: its weight-gradient
    operand takes the Hadamard transform over full columns)."""
    if not (d.fp8 and te):
        return full
    r = fp8.recipe(d.fp8_recipe)
    if r.family != "fp8":
        return full
    return full / d.act_bytes * (r.elem_bytes + r.act_scale_bytes)


def _current_scaling(d: Dims) -> bool:
    return d.fp8 and fp8.recipe(d.fp8_recipe).amax_pass


def column_linear(
    name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, *, bias: bool = False, te: bool = True,
    bias_fused: bool = True, keep_original: bool = False,
) -> Op:
    """Column-parallel linear: k inputs (full) -> n outputs on this rank. ``bias_fused``
    False: the bias is added by its own kernel after the GEMM (Megatron-Core's local
    linear without skip_bias_add: matmul, then ``output + bias``)."""
    full_in = d.act(k)
    add = [MemBound(f"{op_label(name)}.bias_add", 2 * d.act(n))] if bias and not bias_fused else []
    gathered = gathered_bytes(d, full_in, te) if d.sp else 0.0
    gather = [Collective("all_gather", gathered, "tp")] if d.sp else []
    if d.sp and te and _current_scaling(d):
        # current scaling of a sequence-sharded input: its amax is all-reduced over TP
        # before the cast, so every rank quantizes its shard with the one TP-wide scale
        gather = [Collective("all_reduce", fp8.AMAX_BYTES_PER_TENSOR, "tp"), *gather]
    if d.sp:
        reduce = [Collective("reduce_scatter", full_in, "tp")]
    else:
        reduce = [Collective("all_reduce", full_in, "tp")] if d.tp > 1 else []
    return _linear(
        name, module, layer, d, x, k, n, fwd_before=gather, fwd_after=add, bwd_before=gather, bwd_after=reduce,
        fwd_transient=gathered, bwd_transient=d.act(n) + full_in + gathered, bias=bias, te=te, keep_original=keep_original,
    )


def row_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, *, bias: bool = False,
               keep_original: bool = False) -> Op:
    """Row-parallel linear: k inputs on this rank -> n outputs (full, then reduced).
    ``keep_original``: see ``_linear``."""
    full_out = d.act(n)
    grad_gathered = gathered_bytes(d, full_out, True) if d.sp else full_out
    if d.sp:
        reduce, gather = [Collective("reduce_scatter", full_out, "tp")], [Collective("all_gather", grad_gathered, "tp")]
        if _current_scaling(d):  # the output gradient arrives sequence-sharded: amax over TP
            gather = [Collective("all_reduce", fp8.AMAX_BYTES_PER_TENSOR, "tp"), *gather]
    else:
        reduce, gather = ([Collective("all_reduce", full_out, "tp")] if d.tp > 1 else []), []
    op = _linear(
        name, module, layer, d, x, k, n, fwd_before=[], fwd_after=reduce, bwd_before=gather, bwd_after=[],
        fwd_transient=full_out, bwd_transient=grad_gathered + d.act(k), bias=bias, te=True, keep_original=keep_original,
    )
    # the bias is added after the reduction, so every TP rank holds all of it
    return op.with_(tp_replicated_params=n) if bias else op


def replicated_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int) -> Op:
    """A linear whose weight every TP rank holds whole (Megatron's "duplicated" mode, e.g.
    MLA down-projections): it runs on the rank's own (sequence-sharded) tokens, no TP comm."""
    op = _linear(
        name, module, layer, d, x, k, n, fwd_before=[], fwd_after=[], bwd_before=[], bwd_after=[],
        fwd_transient=0.0, bwd_transient=d.act(n, local=True) + d.act(k, local=True), bias=False, te=True,
        rows=d.local_tokens,
    )
    return op.with_(tp_replicated_params=op.params)


def gathered_column_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, *, te: bool = True) -> Op:
    """A column-parallel linear (k -> n / tp outputs per rank) whose output Megatron-Core
    then all-gathers over TP (``gather_from_tensor_model_parallel_region``: every rank holds
    all n features again) and, with SP, hands each rank its sequence shard back
    (``scatter_to_sequence_parallel_region``: a split forward, an all-gather of the gradient
    backward; the gather's own backward is a split). Used by MTP's eh_proj and the local
    spec's MLA down-projections."""
    op = column_linear(name, module, layer, d, x, k, n // d.tp, te=te)
    if d.tp == 1:
        return op
    full = d.act(n)
    bwd = (Collective("all_gather", full, "tp"),) if d.sp else ()
    return op.with_(fwd=(*op.fwd, Collective("all_gather", full, "tp")), bwd_input=(*bwd, *op.bwd_input),
                    fwd_transient=op.fwd_transient + full)


def _duplicated_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, bwd_transient: float) -> Op:
    """A "duplicated" TE linear: the whole weight on every TP rank, on the gathered tokens, no
    TP collective."""
    op = _linear(
        name, module, layer, d, x, k, n, fwd_before=[], fwd_after=[], bwd_before=[], bwd_after=[],
        fwd_transient=0.0, bwd_transient=bwd_transient, bias=False, te=True,
    )
    return op.with_(tp_replicated_params=op.params)


def no_grad_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int) -> Op:
    """A duplicated linear run under ``torch.no_grad`` (DSA's indexer without its loss): its
    forward only, keeping nothing."""
    op = _duplicated_linear(name, module, layer, d, x, k, n, 0.0)
    return op.with_(bwd_input=(), bwd_weight=(), saved=())


def wgrad_only_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int) -> Op:
    """A duplicated linear whose input is detached (DSA's indexer under its loss): its forward,
    and in backward only the weight gradient (no data gradient for an input that takes none);
    it keeps its input for that."""
    op = _duplicated_linear(name, module, layer, d, x, k, n, d.act(n))
    return op.with_(bwd_input=tuple(kern for kern in op.bwd_input if not isinstance(kern, Gemm)))
