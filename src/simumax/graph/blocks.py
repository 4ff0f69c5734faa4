"""Building blocks: norms, activations, embedding, head, loss (TP linears:
graph/linears.py; core attention: graph/attention.py).

Each function returns Ops for one micro-batch on one rank (see docs/modeling.md).
"""

from __future__ import annotations

from simumax.graph.dims import Dims
from simumax.graph.kernels import Collective, MemBound, op_label
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
              shares_head_weight: bool = False, dropout: bool = False) -> Op:
    """Vocab-parallel embedding: lookup, then all-reduce (or reduce-scatter with SP) over TP.

    Learned absolute positions (Megatron's ``LanguageModelEmbedding``, replicated over TP):
    the position lookup and its add to the word embeddings read two [tokens, h] tensors and
    write one; their gradients go through the same dense path as the words' (``_table_wgrad``).
    ``shares_head_weight``: the output layer uses the same weight on this rank (tied, one
    pipeline stage): Megatron sets ``zero_out_wgrad``, so the head's weight-gradient GEMM,
    accumulating into the main gradient itself, hands autograd a zero-filled dummy that
    autograd adds to the embedding's gradient (``language_module.py``,
    ``tensor_parallel/layers.py``). ``dropout``: ``LanguageModelEmbedding`` drops out its
    output (hidden dropout) on the rank's sequence shard, keeping the 1-byte mask."""
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
    local = d.act(d.h, local=True)
    mask = local / d.act_bytes
    if dropout:
        fwd.append(MemBound("embedding.dropout", 2 * local + mask))
        bwd_in.insert(0, MemBound("embedding.dropout_bwd", 2 * local + mask))
    # the int64 ids (with TP, the shifted copy the lookup indexes with) and, with TP, the
    # bool mask of the ids outside this rank's vocabulary shard, kept by the masked zero-fill
    # (tensor_parallel.layers.VocabParallelEmbedding.forward)
    ids = ("embedding.ids", float(d.tokens * 8))
    saved = (ids, ("embedding.vocab_mask", float(d.tokens))) if d.tp > 1 else (ids,)
    if position_rows:  # the position ids the position lookup indexes with (int64, one sequence's)
        saved += (("embedding.position_ids", float(d.s * 8)),)
    if dropout:
        saved += (("embedding.dropout_mask", mask),)
    return Op(
        name="embedding",
        module="embedding",
        layer=-1,
        fwd=tuple(fwd),
        bwd_input=tuple(bwd_in),
        bwd_weight=tuple(wgrads),
        saved=saved,
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
    # the unfused chain (tensor_parallel/cross_entropy.py) also keeps the target mask (bool)
    # and the shifted targets (int64), one per token
    extra = () if fused else (("loss.target_mask", float(d.tokens)), ("loss.masked_target", float(d.tokens * 8)))
    return Op(
        name="loss", module="loss", layer=-1, fwd=fwd, bwd_input=bwd,
        saved=(("loss.softmax_fp32", f32), *extra), input=(logits,),
        fwd_transient=bf16, bwd_transient=bf16,
    )
