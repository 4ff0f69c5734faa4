"""Building blocks: norms, TP linears, activations, embedding, head, loss (core attention:
graph/attention.py).

Each function returns Ops for one micro-batch on one rank. Where Megatron/TransformerEngine
place TP collectives and what they save is described here once (see docs/modeling.md):

* column-parallel linear (QKV, FC1, LM head): with SP, all-gather of the sequence-sharded
  input in forward; in backward the input is re-gathered for the weight gradient and the
  input gradient is reduce-scattered. Without SP: one all-reduce of the input gradient in
  backward. All exposed: the validation runs disabled TP communication overlap, and
  treating TE's asynchronous re-gather as hidden under-predicts every TP>1 case.
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

FP32 = 4
# loss forward size per logit in the convention of a measured cross-entropy line, as
# (passes in the activation dtype, fp32 passes): SimuMax's unfused loss reads the logits
# once and makes three fp32 passes; TE's fused kernel reads and overwrites the logits
LOSS_FWD_PASSES = {"ce": (1, 3), "ce_fusion": (2, 0)}


def loss_fwd_bytes_per_logit(family: str, act_bytes: int) -> float:
    act_passes, fp32_passes = LOSS_FWD_PASSES[family]
    return float(act_passes * act_bytes + fp32_passes * FP32)


def megatron_ce_traffic(act_bytes: int) -> tuple[tuple[float, int], tuple[float, int]]:
    """((bytes per logit, kernels) forward, (bytes per logit, kernels) backward) of
    Megatron's unfused vocab-parallel cross-entropy over [tokens, vocab/tp] logits
    (megatron/core/tensor_parallel/cross_entropy.py, VocabParallelCrossEntropy; the same
    chain in Megatron-LM's mpu/cross_entropy.py of 2021-22, whose GPT model passed
    ``output.float()``). Forward: the fp32 copy of the logits (read a, write 4), max over
    the vocabulary (read 4), subtract it in place (4 + 4), exp in place (4 + 4), sum (4),
    divide by the sum in place (4 + 4): the softmax it saves. Backward: the gradient is
    the saved softmax, its target entries lowered in place (per token), scaled by the
    loss gradient in place (4 + 4), then cast back to the logits' dtype by the copy's
    backward (read 4, write a). With fp32 logits there is no copy and no cast. The
    per-token kernels (target mask, gathers, log) are latency only and not counted."""
    cast = act_bytes != FP32
    fwd = (act_bytes + FP32 if cast else 0) + FP32 + 2 * FP32 + 2 * FP32 + FP32 + 2 * FP32
    bwd = 2 * FP32 + (FP32 + act_bytes if cast else 0)
    return (float(fwd), 5 + cast), (float(bwd), 1 + cast)


def megatron_native_ce_traffic(act_bytes: int) -> tuple[tuple[float, int], tuple[float, int]]:
    """The same as ``megatron_ce_traffic`` for Megatron-Core's native fused cross-entropy
    (``--cross-entropy-loss-fusion``, megatron/core/fusions/fused_cross_entropy.py): the
    unfused chain's steps in three functions compiled by ``jit_fuser`` (torch.compile from
    PyTorch 2.2, megatron/core/jit.py), each reading its inputs and writing its outputs
    and the inputs it mutates once: the fp32 copy with its max (read a, write 4), the
    shifted exponent in place with its sum (4 + 4), the division in place (4 + 4); backward
    one function reads the softmax, writes it back scaled (an input mutation is written
    back) and writes the gradient cast to bf16 (4 + 4 + 2, bf16 whatever the dtype:
    ``grad_input.to(torch.bfloat16)``)."""
    first = act_bytes + FP32 if act_bytes != FP32 else FP32
    return (float(first + 2 * FP32 + 2 * FP32), 3), (float(2 * FP32 + 2), 1)


def norm(
    name: str, module: str, layer: int, d: Dims, x: Tensor, *, rms: bool, save_rstd: bool = True, width: int | None = None,
    residual: bool = False,
) -> Op:
    """RMSNorm / LayerNorm over ``width`` (default hidden) features of the sequence-sharded
    tokens; saves input and rstd. ``residual``: the input also feeds the residual add (a
    pre-norm layer's norms), so its gradient arrives twice and autograd sums the two
    (torch/csrc/autograd/input_buffer.cpp, InputBuffer::add: one element-wise add reading
    both, writing the sum) after this norm's backward."""
    n = d.local_tokens
    x_bytes = x[1]
    stats = float(n * FP32 * (1 if rms else 2))
    saved: list[Tensor] = [x]
    if save_rstd:
        saved.append((f"{name}.rstd", stats))
    bwd = [MemBound(f"{op_label(name)}.bwd", 3 * x_bytes)]
    if residual:
        bwd.append(MemBound(f"{op_label(name)}.grad_accumulate", 3 * x_bytes))
    return Op(
        name=name,
        module=module,
        layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", 2 * x_bytes),),
        bwd_input=tuple(bwd),
        saved=tuple(saved),
        input=(x,),
        bwd_transient=2 * x_bytes,
        params=(width or d.h) * (1 if rms else 2),
        tp_replicated_params=(width or d.h) * (1 if rms else 2),
    )


def _linear(
    name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, *, fwd_before: list, fwd_after: list,
    bwd_before: list, bwd_after: list, fwd_transient: float, bwd_transient: float, bias: bool, te: bool,
    rows: int | None = None,
) -> Op:
    """A linear on [rows, k] -> [rows, n] (this rank's shard; rows default to the gathered
    tokens) with the TP collectives around its forward GEMM and its input-gradient GEMM."""
    t = d.tokens if rows is None else rows
    fam = "matmul"
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
        saved = (f"{x[0]}.fp8", fp8.saved_input_bytes(r, x_elems))
        fwd_cast, bwd_cast = fp8.linear_casts(r, name, x_elems, t * n, k * n, d.act_bytes, d.fp8_weight_caching)
    # the bias gradient: TE folds it into the weight-gradient GEMM's epilogue (or the fp8
    # cast-transpose); Megatron-Core's own linears reduce the output gradient over tokens
    # (grad_output.sum(0), or the autograd sum behind a fused bias-GeLU / bias-dropout-add)
    bias_grad = [MemBound(f"{op_label(name)}.bias_grad", t * n * d.act_bytes)] if bias and d.local else []
    wgrad, grad_buffer = weight_gradient(name, d, Gemm(n, t, k, "NT", accumulate=True, out_dtype="fp32", family=fam))
    return Op(
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


def weight_gradient(name: str, d: Dims, fused: Gemm) -> tuple[tuple[Gemm | MemBound, ...], float]:
    """(kernels, transient bytes) of a linear's weight gradient: the GEMM accumulating into
    the main grad (``fused``, Megatron's gradient-accumulation fusion), or without the fusion
    the GEMM writing it and DDP's hook adding it (``written_wgrad``, ``wgrad_hook_add``)."""
    if d.wgrad_fused:
        return (fused,), 0.0
    add, held = wgrad_hook_add(op_label(name), fused.m * fused.n * fused.b, d.act_bytes, d.main_grad_bytes)
    return (written_wgrad(fused, d.act_bytes), add), held


def written_wgrad(g: Gemm, act_bytes: int) -> Gemm:
    """A weight-gradient GEMM without gradient-accumulation fusion (``--no-gradient-
    accumulation-fusion``; TE's ``fuse_wgrad_accumulation`` follows it): it writes the
    gradient in the parameter dtype instead of accumulating into the main grad."""
    return g._replace(accumulate=False, out_dtype="bf16" if act_bytes == 2 else "fp32")  # 2 B: bf16 or fp16


def wgrad_hook_add(label: str, params: float, act_bytes: int, main_grad_bytes: int) -> tuple[MemBound, float]:
    """(kernel, bytes held) of DDP's backward hook adding a written weight gradient to the
    main grad (``distributed_data_parallel._make_backward_post_hook``:
    ``param.main_grad.add_(param.grad.data)``, then ``param.grad = None``): read both,
    write the main grad, every micro-batch; the gradient is held from its GEMM to the add."""
    return MemBound(f"{label}.main_grad_add", params * (act_bytes + 2 * main_grad_bytes)), float(params * act_bytes)


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
    bias_fused: bool = True,
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
        fwd_transient=gathered, bwd_transient=d.act(n) + full_in + gathered, bias=bias, te=te,
    )


def row_linear(name: str, module: str, layer: int, d: Dims, x: Tensor, k: int, n: int, *, bias: bool = False) -> Op:
    """Row-parallel linear: k inputs on this rank -> n outputs (full, then reduced)."""
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
        fwd_transient=full_out, bwd_transient=grad_gathered + d.act(k), bias=bias, te=True,
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


def rope(name: str, layer: int, d: Dims, qk_width: int, *, fused: bool = True, rot_dim: int = 0) -> Op:
    """Rotary embedding on q and k. Fused (TE): reads and writes them once, saves nothing.
    Unfused (Megatron-Core local: t * cos + rotate_half(t) * sin, once for q and once for
    k): each call makes cos and sin [s, 1, 1, rot_dim] in the activation dtype, which the
    two products keep for backward; about four passes over q and k each way."""
    nbytes = d.act(qk_width)
    if fused:
        return Op(
            name=name, module="rope", layer=layer,
            fwd=(MemBound(f"{op_label(name)}.fwd", 2 * nbytes),), bwd_input=(MemBound(f"{op_label(name)}.bwd", 2 * nbytes),),
            bwd_transient=nbytes,
        )
    table = float(d.s * rot_dim * d.act_bytes)
    saved = tuple((f"{name}.{t}_{f}", table) for t in ("q", "k") for f in ("cos", "sin"))
    return Op(
        name=name, module="rope", layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", 8 * nbytes),), bwd_input=(MemBound(f"{op_label(name)}.bwd", 8 * nbytes),),
        saved=saved, fwd_transient=2 * nbytes, bwd_transient=2 * nbytes,
    )


def _activation(name: str, layer: int, x: Tensor, out: float, saved: tuple[Tensor, ...]) -> Op:
    """An elementwise activation: reads x, writes out; backward reads x and the output grad."""
    return Op(
        name=name,
        module="act",
        layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", x[1] + out),),
        bwd_input=(MemBound(f"{op_label(name)}.bwd", 2 * x[1] + out),),
        saved=saved,
        input=(x,),
        bwd_transient=x[1] + out,
    )


def swiglu(name: str, layer: int, d: Dims, x: Tensor, ffn: int, *, fused: bool) -> Op:
    """SwiGLU on the [tokens, 2*ffn] FC1 output; saves the input (and, unfused, the two
    factors of the product)."""
    out = d.act(ffn)
    saved: list[Tensor] = [x]
    if not fused:
        # Megatron-Core's glu: gate, up = chunk(x); silu(gate) * (up + glu_linear_offset).
        # silu keeps gate (a view of x, kept above); the product keeps silu's output and
        # up + offset, a new tensor even with the default offset 0
        saved += [(f"{name}.silu_out", out), (f"{name}.up", out)]
    return _activation(name, layer, x, out, tuple(saved))


def gelu(name: str, layer: int, d: Dims, x: Tensor, ffn: int) -> Op:
    return _activation(name, layer, x, d.act(ffn), (x,))


def dropout_add(name: str, module: str, layer: int, d: Dims, *, dropout: bool) -> Op:
    """Residual add (with dropout when enabled) on the sequence-sharded hidden state:
    reads x and the residual, writes the sum (and the 1-byte dropout mask); backward of
    the dropout reads the gradient and the mask and writes the gradient."""
    x = d.act(d.h, local=True)
    mask = x / d.act_bytes
    saved: tuple[Tensor, ...] = ((f"{name}.mask", mask),) if dropout else ()
    return Op(
        name=name,
        module=module,
        layer=layer,
        fwd=(MemBound(f"{op_label(name)}.fwd", 3 * x + (mask if dropout else 0.0)),),
        bwd_input=(MemBound(f"{op_label(name)}.bwd", 2 * x + mask),) if dropout else (),
        saved=saved,
    )


def _table_wgrad(name: str, d: Dims, rows: int, main_grad_bytes: int) -> MemBound:
    """Weight gradient of an ``F.embedding`` table of ``rows`` × h, per micro-batch, as
    Megatron-Core runs it (VocabParallelEmbedding and the position table call
    ``F.embedding``, whose backward is dense): PyTorch's ``embedding_dense_backward``
    zero-fills a [rows, h] gradient in the activation dtype and scatter-adds the tokens'
    gradients into it (reading them, with fp32 partial sums per index), then Megatron's
    DDP hook adds it to the main gradient (``param.main_grad.add_(param.grad)``:
    read both, write the main gradient)."""
    a = d.act_bytes
    dense = rows * d.h
    scatter = d.tokens * d.h * (a + FP32)
    return MemBound(name, dense * a + scatter + dense * (2 * main_grad_bytes + a), launches=3)


def embedding(d: Dims, vocab_local: int, position_rows: int = 0, *, main_grad_bytes: int = FP32,
              shares_head_weight: bool = False) -> Op:
    """Vocab-parallel embedding: lookup, then all-reduce (or reduce-scatter with SP) over TP.

    Learned absolute positions (Megatron's ``LanguageModelEmbedding``, replicated over TP):
    the position lookup and its add to the word embeddings read two [tokens, h] tensors and
    write one; their gradients go through the same dense path as the words' (``_table_wgrad``).
    ``shares_head_weight``: the output layer uses the same weight on this rank (tied, one
    pipeline stage): Megatron sets ``zero_out_wgrad``, so the head's weight-gradient GEMM,
    accumulating into the main gradient itself, hands autograd a zero-filled dummy that
    autograd adds to the embedding's gradient (``language_module.py``,
    ``tensor_parallel/layers.py``)."""
    full = d.act(d.h)
    table = float(vocab_local * d.h * d.act_bytes)
    fwd: list = [MemBound("embedding.fwd", 2 * full)]
    wgrads = [_table_wgrad("embedding.wgrad", d, vocab_local, main_grad_bytes)]
    if shares_head_weight:
        wgrads.append(MemBound("embedding.tied_wgrad_sum", table + 3 * table, launches=2))  # zero the dummy, add
    if position_rows:
        fwd.append(MemBound("embedding.position_add", 3 * full))
        wgrads.append(_table_wgrad("embedding.position_wgrad", d, position_rows, main_grad_bytes))
    bwd_in: list = []
    if d.sp:
        fwd.append(Collective("reduce_scatter", full, "tp"))
        bwd_in.append(Collective("all_gather", full, "tp"))
    elif d.tp > 1:
        fwd.append(Collective("all_reduce", full, "tp"))
    ids = ("embedding.ids", float(d.tokens * 8))
    return Op(
        name="embedding",
        module="embedding",
        layer=-1,
        fwd=tuple(fwd),
        bwd_input=tuple(bwd_in),
        bwd_weight=tuple(wgrads),
        saved=(ids,),
        # the incoming gradient and the dense table gradient (and the tied head's dummy)
        bwd_transient=full + table * (2 if shares_head_weight else 1),
        params=(vocab_local + position_rows) * d.h,
        tp_replicated_params=position_rows * d.h,  # every TP rank holds the whole position table
    )


def cross_entropy(d: Dims, logits: Tensor, *, fused: bool, impl: str = "te") -> Op:
    """Vocab-parallel cross-entropy over logits [tokens, vocab/tp].

    Fused by TE (``impl`` te): bf16 logits are kept and overwritten with their gradient in
    place; the kernel upcasts to fp32 internally (an fp32 logits-sized buffer during the
    loss). Unfused (Megatron), and fused by Megatron-Core's compiled functions (``impl``
    native): an fp32 copy of the logits becomes the saved softmax (exp and normalisation
    run in place on it), while the bf16 logits it was made from die. All all-reduce
    per-token max, sum-exp and target logit over TP (the native form the last two in one).
    """
    n = d.tokens * d.vocab
    bf16 = logits[1]
    f32 = float(n * FP32)
    stats: list[Collective] = []
    if d.tp > 1 and fused and impl == "native":  # the max, then the target logit and sum-exp concatenated
        stats = [Collective("all_reduce", d.tokens * FP32, "tp"), Collective("all_reduce", 2.0 * d.tokens * FP32, "tp")]
    elif d.tp > 1:
        stats = [Collective("all_reduce", d.tokens * FP32, "tp") for _ in range(3)]
    if fused and impl == "te":
        fwd = (MemBound("loss.fwd", n * loss_fwd_bytes_per_logit("ce_fusion", d.act_bytes), family="ce_fusion"), *stats)
        bwd = (MemBound("loss.bwd", 2 * bf16, family="ce_fusion"),)
        return Op(
            name="loss", module="loss", layer=-1, fwd=fwd, bwd_input=bwd, saved=(logits,), input=(logits,),
            fwd_transient=f32, bwd_transient=bf16,
        )
    # Megatron's kernels (the unfused chain, or its three compiled functions); a measured
    # line of the family times them as one unit, in its own size convention
    if fused:
        family, table_fwd, table_bwd = "ce_fusion", loss_fwd_bytes_per_logit("ce_fusion", d.act_bytes), 2 * bf16
        (fwd_b, fwd_k), (bwd_b, bwd_k) = megatron_native_ce_traffic(d.act_bytes)
    else:
        family, table_fwd, table_bwd = "ce", loss_fwd_bytes_per_logit("ce", d.act_bytes), f32 + bf16
        (fwd_b, fwd_k), (bwd_b, bwd_k) = megatron_ce_traffic(d.act_bytes)
    fwd = (MemBound("loss.fwd", n * fwd_b, family=family, table_bytes=n * table_fwd, launches=fwd_k), *stats)
    bwd = (MemBound("loss.bwd", n * bwd_b, family=family, table_bytes=table_bwd, launches=bwd_k),)
    return Op(
        name="loss", module="loss", layer=-1, fwd=fwd, bwd_input=bwd,
        saved=(("loss.softmax_fp32", f32),), input=(logits,),
        fwd_transient=bf16, bwd_transient=bf16,
    )
