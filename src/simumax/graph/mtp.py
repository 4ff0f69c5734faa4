"""Multi-token prediction (DeepSeek-V3; Megatron-Core ``--mtp-num-layers``,
megatron/core/transformer/multi_token_prediction.py ``MultiTokenPredictionLayer``).

Each MTP depth d predicts the token d + 2 ahead: it looks up the shifted tokens in the
shared word embedding, normalises that (``enorm``) and the previous depth's hidden state
(``hnorm``; depth 0 takes the decoder's output), concatenates the two and projects 2h -> h
(``eh_proj``, column-parallel), runs one transformer layer of the model's kind (MoE for
DeepSeek-V3; in a hybrid stack the blocks after '/' in its pattern, megatron-core's
MultiTokenPredictionBlock with ``mtp_layer_pattern``), normalises, and computes logits with
the shared output head and its own cross-entropy loss. The block sits on the last pipeline stage, before the main head, as
Megatron places it, or on a standalone stage of its own that a pipeline layout names (``m``
before the loss's stage): its depths' heads and losses then run on the loss's stage, their
hidden states sent with the main one. Off the first stage the word embedding is a copy
whose gradient is all-reduced with the first stage's (as tied embeddings are:
Estimate.embedding_grad_sync). The layers reuse
the transformer-layer builder, renamed ``mtp<d>.*`` so their tensors stay their own.
"""

from __future__ import annotations

from typing import Callable

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import MemBound
from simumax.graph.ops import Op, Tensor

MODULE_EMBEDDING = "mtp_embedding"  # the word-embedding copy (not counted again in the model's parameters)


def _renamer(first: int, blocks: int, prefix: str) -> Callable[[str], str]:
    """Names of the ops and tensors of layers ``first`` .. ``first + blocks - 1`` (one
    transformer layer, or the blocks of a hybrid stack's MTP depth) -> the depth's: the first
    one's input ``x``, the last one's output ``out``, a block's own under ``b<j>.`` (none for
    one layer)."""

    def ren(name: str) -> str:
        head, sep, rest = name.partition(".")
        if not (sep and head[:1] == "L" and head[1:].isdigit()):
            return name
        j = int(head[1:]) - first
        if rest == "x" and 0 <= j <= blocks:
            return prefix + ("x" if j == 0 else "out" if j == blocks else f"b{j}.x")
        if 0 <= j < blocks:
            return prefix + (rest if blocks == 1 else f"b{j}.{rest}")
        return name

    return ren


def _renamed(op: Op, ren: Callable[[str], str]) -> Op:
    def t(x: Tensor | None) -> Tensor | None:
        return None if x is None else (ren(x[0]), x[1])

    return op.with_(
        name=ren(op.name), saved=tuple(t(x) for x in op.saved), input=tuple(t(x) for x in op.input),  # type: ignore[misc]
        output=t(op.output), also_outputs=tuple(t(x) for x in op.also_outputs),  # type: ignore[misc]
        recompute_group=ren(op.recompute_group) if op.recompute_group else None,
    )


def mtp_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer_ops: Callable[[int], list[Op]],
            embedding_on_this_rank: bool, part: str = "all") -> list[Op]:
    """Every MTP depth's ops for one micro-batch, in forward order. ``layer_ops(k)``: the
    transformer layer builder (global index k = layer_num + depth, so a MoE model gets a
    MoE layer; a hybrid stack's depth runs the blocks of its MTP pattern, indices k .. k +
    blocks - 1 from layer_num + depth x blocks); ``embedding_on_this_rank``: the main
    embedding lives on this rank (no copy).
    ``part``: all, or a standalone MTP stage's ``body`` (embedding, norms, projection, layer)
    and the loss stage's ``tail`` (each depth's final norm, output head and loss: megatron-core
    computes the MTP losses where the main loss is, from hidden states sent along with it)."""
    out: list[Op] = []
    tail: list[Op] = []
    act = d.act(d.h, local=True)
    hidden: Tensor = (f"L{model.layer_num}.x", act)  # the decoder's output
    rms = model.norm_type == "rmsnorm"
    per_depth = model.mtp_blocks
    for depth in range(model.mtp_num_layers):
        p = f"mtp{depth}."
        k = model.layer_num + depth * per_depth
        emb = blocks.embedding(d, d.vocab, main_grad_bytes=st.main_grad_bytes, dropout=st.enable_dropout)
        emb_out: Tensor = (p + "emb", act)
        out.append(emb.with_(name=p + "embedding", module=MODULE_EMBEDDING, layer=k, output=emb_out,
                             params=0 if embedding_on_this_rank else emb.params))
        e_norm: Tensor = (p + "enorm.out", act)
        h_norm: Tensor = (p + "hnorm.out", act)
        out.append(blocks.norm(p + "enorm", "mtp_norm", k, d, emb_out, rms=rms).with_(output=e_norm))
        out.append(blocks.norm(p + "hnorm", "mtp_norm", k, d, hidden, rms=rms, residual=True).with_(output=h_norm))
        cat: Tensor = (p + "cat", 2 * act)  # [enorm, hnorm] along the features
        # torch.cat: one copy of both (its backward hands each norm a slice of the gradient)
        out.append(Op(name=p + "cat", module="mtp_norm", layer=k, fwd=(MemBound(p + "cat", 2 * cat[1]),),
                      input=(e_norm, h_norm), output=cat))
        # column-parallel, its output gathered over TP and sequence-sharded again under SP
        # (MultiTokenPredictionLayer._concat_embeddings)
        proj = linears.gathered_column_linear(p + "eh_proj", "mtp_proj", k, d, cat, 2 * d.h, d.h)
        out.append(proj.with_(output=(p + "x", act), input=(cat,)))  # the layer's input, renamed
        ren = _renamer(k, per_depth, p)
        out += [_renamed(o, ren) for j in range(per_depth) for o in layer_ops(k + j)]
        hidden = (p + "out", act)
        ln: Tensor = (p + "final_norm.out", act)
        logits: Tensor = (p + "logits", d.act(d.vocab))
        head = linears.column_linear(p + "lm_head", "lm_head", -1, d, ln, d.h, d.vocab, te=False)
        loss = blocks.cross_entropy(d, logits, fused=st.cross_entropy_loss_fusion, impl=st.cross_entropy_fusion_impl)
        ends = [
            blocks.norm(p + "final_norm", "mtp_norm", k, d, hidden, rms=rms).with_(output=ln),
            head.with_(output=logits, params=0),  # the shared output head (the main head's weight)
            # process_mtp_loss also keeps the rolled labels (int64), the rolled loss mask (fp32)
            # and the token count it divides by
            loss.with_(name=p + "loss", saved=(*((p + n if n.startswith("loss.") else n, b) for n, b in loss.saved),
                                               (p + "labels", float(d.tokens * 8)), (p + "loss_mask", float(d.tokens * 4)),
                                               (p + "num_tokens", 8.0))),
        ]
        if part == "all":
            out += ends
        else:
            tail += ends
    return tail if part == "tail" else out


def checkpointed_depths(model: ModelConfig, ops: list[Op]) -> list[Op]:
    """Full recompute with the uniform method (``MultiTokenPredictionLayer.forward``): each
    depth's norms, projection, layer(s) and final norm run in one checkpoint, which keeps its
    two inputs (the previous hidden state and the embedding's output, looked up before it);
    the embedding, the output head and the loss stay outside."""
    first = model.layer_num
    per_depth = model.mtp_blocks

    def group(o: Op) -> str | None:
        if o.module == MODULE_EMBEDDING or not first <= o.layer < first + model.mtp_num_layers * per_depth:
            return None
        return f"mtp{(o.layer - first) // per_depth}.block"

    return [o.with_(recompute_group=g) if (g := group(o)) else o for o in ops]
