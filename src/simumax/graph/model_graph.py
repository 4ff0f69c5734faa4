"""Model + strategy -> one Stage (ordered ops for one micro-batch) per pipeline rank."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from simumax.config.checks import vstage_layer_counts
from simumax.config.layout import mtp_stage
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, fp8, linears
from simumax.graph.dense_layer import attention_ops, mlp_ops
from simumax.graph.dims import Dims
from simumax.graph.dsa import dsa_attention_ops
from simumax.graph.gdn_layer import gdn_ops
from simumax.graph.kernels import Collective, host_wait
from simumax.graph.mamba_layer import mamba_ops
from simumax.graph.ops import Op, Stage, StagePart
from simumax.graph.placement import virtual_stage_places
from simumax.graph.mla import mla_attention_ops
from simumax.graph.moe_layer import moe_mlp_ops
from simumax.graph.mtp import checkpointed_depths, mtp_ops
from simumax.graph.recompute import is_recomputed, tag_recompute, uniform_groups
from simumax.graph.relabel import Relabeler
from simumax.graph.offload import with_offload
from simumax.graph.sharding import sharding_ops, with_sharding


def _head_ops(model: ModelConfig, st: StrategyConfig, d: Dims, same_rank_as_embedding: bool) -> list[Op]:
    """Final norm, LM head (Megatron's column-parallel linear) and the loss."""
    x = (f"L{model.layer_num}.x", d.act(d.h, local=True))  # the last layer's output
    ln_out = ("final_norm.out", d.act(d.h, local=True))
    logits = ("logits", d.act(d.vocab))
    head = linears.column_linear("lm_head", "lm_head", -1, d, ln_out, d.h, d.vocab, te=False).with_(output=logits)
    if not model.untie_embeddings_and_output_weights and same_rank_as_embedding:
        head = head.with_(params=0)  # shares the embedding weight
    loss = blocks.cross_entropy(d, logits, fused=st.cross_entropy_loss_fusion, impl=st.cross_entropy_fusion_impl)
    if st.check_for_nan_in_grad:
        # Megatron's loss_func checks the loss for NaN on the host before backward
        # (pretrain_gpt.py: rerun_state_machine.validate_result(rejection_func=torch.isnan)
        # evaluates the check even with reruns disabled): a host wait per micro-batch
        loss = loss.with_(fwd=(*loss.fwd, host_wait("loss.nan_check")))
    return [
        blocks.norm("final_norm", "final_norm", -1, d, x, rms=model.norm_type == "rmsnorm").with_(output=ln_out),
        head,
        loss,
    ]


def layer_ops(model: ModelConfig, st: StrategyConfig, d: Dims, layer: int) -> list[Op]:
    """One transformer layer: MHA/GQA, MLA, DSA or Gated DeltaNet attention, then a dense or MoE
    MLP; in a hybrid stack (``hybrid_layer_pattern``) one block per layer: a Mamba-2 mixer, a
    Gated DeltaNet, attention (MHA/GQA, MLA or DSA), an MLP or a MoE MLP, each with its own norm
    and residual add (megatron-core's HybridStack)."""
    x_in = (f"L{layer}.x", d.act(d.h, local=True))
    symbol = model.layer_symbol(layer)
    if symbol != "T":
        block = {"M": mamba_ops, "G": gdn_ops, "*": attention_ops, "+": mla_attention_ops, "D": dsa_attention_ops,
                 "-": mlp_ops, "E": moe_mlp_ops}[symbol]
        ops = block(model, st, d, layer, x_in)
        ops[-1] = ops[-1].with_(output=(f"L{layer + 1}.x", x_in[1]))
        return ops
    x_mid = (f"L{layer}.x_mid", d.act(d.h, local=True))
    if model.linear_attention(layer):
        attn = gdn_ops
    elif model.attention_type == "mla":
        attn = dsa_attention_ops if model.experimental_attention_variant == "dsa" else mla_attention_ops
    else:
        attn = attention_ops
    mlp = moe_mlp_ops if model.is_moe_layer(layer) else mlp_ops
    a, m = attn(model, st, d, layer, x_in), mlp(model, st, d, layer, x_mid)
    # the residual adds produce the next block's input (named, so checkpoints see it)
    a[-1] = a[-1].with_(output=x_mid)
    m[-1] = m[-1].with_(output=(f"L{layer + 1}.x", x_in[1]))
    return a + m


def _fp8_amax_reduction(st: StrategyConfig, linears: int, vstage: int) -> Op | None:
    """Delayed scaling: at the end of each forward and backward of an fp8_autocast region
    (Megatron wraps each TransformerBlock, i.e. model chunk) TE all-reduces the amaxes of
    its fp8 tensors (input, weight, output gradient of each fp8 linear: one fp32 each) over
    the amax-reduction group, data x tensor x context parallel; costed on the DP group (the
    widest part of it), or TP without data parallelism."""
    if not st.low_precision or not fp8.recipe(st.lp_recipe).history_amax:
        return None
    if not linears:
        return None
    group = "dp" if st.dp_size * st.cp_size > 1 else "tp"
    reduce = Collective("all_reduce", 3 * fp8.AMAX_BYTES_PER_TENSOR * linears, group)
    return Op(name=f"fp8.amax_reduce.v{vstage}", module="fp8_amax", layer=-1, fwd=(reduce,), bwd_input=(reduce,))


LayerKind = tuple[bool, bool, bool, int | None, bool, str, bool, bool]  # OpSource.kind
CostKind = tuple[bool, bool, bool, bool, int | None, bool, str, bool, bool]  # OpSource.cost_kind: recomputed, then the LayerKind


@dataclass
class PlainLayers:
    """Each layer's own ops (before the passes), and the first layer built of each kind,
    shared by the op sources of strategies that differ only in their passes."""

    ops: dict[int, list[Op]] = field(default_factory=dict)
    first: dict[LayerKind, int] = field(default_factory=dict)
    renamers: dict[int, Relabeler] = field(default_factory=dict)  # by first layer of a kind


class OpSource:
    """Each layer's ops built once (plain and checkpointed), the embedding and the head.

    Ops depend on the strategy's per-layer fields only (tp, cp, ep, etp, sp, mbs, seq,
    kernels, recompute type), not on the pipeline layout, so estimates that differ only in
    pp / vp / dp / ZeRO / micro-batch count can share one source (see profiles.py).
    """

    def __init__(self, model: ModelConfig, st: StrategyConfig, plain: PlainLayers | None = None) -> None:
        """``plain``: each layer's own ops, to share with sources whose strategies differ only
        in the passes applied on top (which ops are checkpointed, what is offloaded, ZeRO-2/3
        collectives): the passes leave the plain ops as they are."""
        self.model, self.st = model, st
        self.dims = Dims.of(model, st)
        # Megatron's --first-last-layers-bf16: those layers are built from the strategy without fp8 / fp4
        off = {"fp8": False, "fp4": False, "fp8_recipe": "delayed", "fp4_recipe": None}
        self._st_bf16 = st.model_copy(update=off) if st.low_precision else st
        self._dims_bf16 = Dims.of(model, self._st_bf16) if st.low_precision else self.dims
        self._plain = PlainLayers() if plain is None else plain
        self._passes: dict[tuple[int, bool], list[Op]] = {}
        self._first_recomputed: dict[LayerKind, int] = {}  # kind -> its first recomputed layer
        self._recomputed_renamers: dict[int, Relabeler] = {}  # by first recomputed layer of a kind
        self._embedding: Op | None = None
        self._head: dict[bool, list[Op]] = {}
        self._mtp: dict[tuple[bool, str], list[Op]] = {}
        self._amax: dict[tuple[int, int], Op | None] = {}
        self._kinds: dict[int, LayerKind] = {}
        self._kind_first: dict[CostKind, int] = {}

    def bf16_layer(self, layer: int) -> bool:
        """A layer kept in BF16 under an fp8 / fp4 recipe (first_last_layers_bf16)."""
        st = self.st
        if not (st.low_precision and st.first_last_layers_bf16):
            return False
        return layer < st.num_layers_at_start_in_bf16 or layer >= self.model.layer_num - st.num_layers_at_end_in_bf16

    def te_offloaded(self, layer: int) -> bool:
        """A layer whose activations TE's layer offload moves to the host (cpu_offloading)."""
        return self.st.cpu_offloading and layer < self.st.cpu_offloading_num_layers

    def kind(self, layer: int) -> LayerKind:
        """What makes layers' ops alike but for their names: dense or MoE, kept in BF16 or
        not, offloaded by TE's layer offload or not, the attention window (gpt-oss
        alternates sliding-window and full-attention layers), RoPE or NoPE (Llama 4), the hybrid
        block (Mamba, Gated DeltaNet, attention, MLP, MoE), Gated DeltaNet or softmax attention
        (Qwen3-Next), a DSA layer running its indexer or sharing an earlier one's top-k. Kept
        per layer: a search builds the chunks of many layouts from one source."""
        got = self._kinds.get(layer)
        if got is None:
            got = self._kinds[layer] = (self.model.is_moe_layer(layer), self.bf16_layer(layer), self.te_offloaded(layer),
                                        self.model.attention_window(layer), self.model.uses_rope(layer),
                                        self.model.layer_symbol(layer), self.model.linear_attention(layer),
                                        self.model.dsa_computes_topk(layer))
        return got

    def cost_kind(self, layer: int, recomputed: bool) -> CostKind:
        """What makes layers cost alike: their kind (the same ops but for their names) and
        whether they are recomputed (a chunk's runs, StagePart.kind; profiles' per-kind costs)."""
        return (recomputed, *self.kind(layer))

    def kind_layer(self, layer: int, recomputed: bool) -> int:
        """The first layer seen of this layer's cost kind: its ops stand for the kind's in
        every run of such layers (StagePart.ops), so making a chunk renames no layer."""
        return self._kind_first.setdefault(self.cost_kind(layer, recomputed), layer)

    def plain_layer(self, layer: int) -> list[Op]:
        """The layer's own ops (no passes): built for the first layer of its kind, the
        others renamed from it (graph/relabel.py); shared by the sources of PlainLayers."""
        own = self._plain.ops.get(layer)
        if own is None:
            first = self._plain.first.setdefault(self.kind(layer), layer)
            if first == layer:
                own = self._build_plain(layer)
            else:
                renamer = self._plain.renamers.get(first)
                if renamer is None:
                    renamer = self._plain.renamers[first] = Relabeler(self.plain_layer(first), first)
                own = renamer.to(layer)
            self._plain.ops[layer] = own
        return own

    def layer(self, layer: int, recomputed: bool) -> list[Op]:
        """The layer's ops: its own (plain_layer, shared with other sources), checkpointed
        when ``recomputed`` (graph/recompute.py), then the activation offload op
        (graph/offload.py) and the ZeRO-2/3 collectives (graph/sharding.py). The passes
        keep the plain ops they do not change (a search's many families share them); a
        recomputed layer is the first recomputed layer of its kind renamed."""
        ops = self._passes.get((layer, recomputed))
        if ops is None:
            first = self._first_recomputed.setdefault(self.kind(layer), layer) if recomputed else layer
            if first == layer:
                ops = self._with_passes(layer, recomputed, self.plain_layer(layer))
            else:  # checkpointing copies every op anyway: renaming the first such layer is cheaper
                renamer = self._recomputed_renamers.get(first)
                if renamer is None:
                    renamer = self._recomputed_renamers[first] = Relabeler(self.layer(first, True), first)
                ops = renamer.to(layer)
            self._passes[(layer, recomputed)] = ops
        return ops

    def built_layer(self, layer: int, recomputed: bool) -> list[Op]:
        """The layer's ops built for it, nothing renamed or cached (what layer() must equal)."""
        return self._with_passes(layer, recomputed, self._build_plain(layer))

    def _build_plain(self, layer: int) -> list[Op]:
        bf16 = self.bf16_layer(layer)
        return layer_ops(self.model, self._st_bf16 if bf16 else self.st, self._dims_bf16 if bf16 else self.dims, layer)

    def _with_passes(self, layer: int, recomputed: bool, own: list[Op]) -> list[Op]:
        body = tag_recompute(self.st, own) if recomputed else own
        return with_sharding(f"L{layer}", layer, with_offload(f"L{layer}", layer, body, self.st), self.st)

    def mtp(self, embedding_on_this_rank: bool, part: str = "all") -> list[Op]:
        """The multi-token-prediction block (graph/mtp.py); ``part``: all, or a standalone MTP
        stage's body and the loss stage's tail. Megatron-Core builds each depth's layer from
        the model's config, so selective recompute (SimuMax's flags, --recompute-modules)
        checkpoints its modules as in any layer; full recompute checkpoints a depth's
        projection, layer and final norm as one with the uniform method only
        (``MultiTokenPredictionLayer._checkpointed_forward``; the block method warns and skips
        it)."""
        key = (embedding_on_this_rank, part)
        ops = self._mtp.get(key)
        if ops is None:
            selective = self.st.recompute_mode in ("selective", "megatron")
            ops = mtp_ops(self.model, self.st, self.dims, lambda k: self.layer(k, selective), embedding_on_this_rank, part)
            if self.st.recompute_mode == "full_block" and self.st.recompute_method == "uniform":
                ops = checkpointed_depths(self.model, ops)
            own = [o for o in ops if o.module in ("mtp_embedding", "mtp_proj", "mtp_norm")]  # its layers carry their own
            name = "mtp" if part == "all" else f"mtp_{part}"  # the block's sharding op, as named before parts
            ops = self._mtp[key] = [*sharding_ops(name, self.model.layer_num, own, self.st), *ops]
        return ops

    def amax_reduction(self, groups: list[tuple[list[Op], int]], vstage: int) -> Op | None:
        """The fp8 amax all-reduce of a chunk holding ``groups`` ((ops, times): Stage.groups;
        one op per linear count and chunk position: estimates of one family share it)."""
        linears = sum(n * sum(1 for o in ops if fp8.low_precision_linear(o)) for ops, n in groups) if self.st.low_precision else 0
        key = (linears, vstage)
        if key not in self._amax:
            self._amax[key] = _fp8_amax_reduction(self.st, linears, vstage)
        return self._amax[key]

    def embedding(self) -> Op:
        if self._embedding is None:
            self._embedding = blocks.embedding(self.dims, self.dims.vocab, self.model.position_rows(self.st.seq_len),
                                               main_grad_bytes=self.st.main_grad_bytes, shares_head_weight=self._tied_here,
                                               dropout=self.st.enable_dropout)
        return self._embedding

    @property
    def _tied_here(self) -> bool:
        """The output layer uses the embedding's weight on the same rank."""
        return not self.model.untie_embeddings_and_output_weights and self.st.pp_size == 1

    def pre_ops(self) -> list[Op]:
        """What the first virtual stage runs before its layers: the embedding (and its
        ZeRO-2/3 collectives)."""
        # torchtitan shards a tied embedding with the final norm and output layer as one unit
        return with_sharding("embedding", -1, [self.embedding()], self.st, "tied_embedding" if self._tied_here else "embedding")

    def head(self, same_rank_as_embedding: bool) -> list[Op]:
        ops = self._head.get(same_rank_as_embedding)
        if ops is None:
            own = _head_ops(self.model, self.st, self.dims, same_rank_as_embedding)
            unit = "tied_head" if same_rank_as_embedding and not self.model.untie_embeddings_and_output_weights else "head"
            ops = self._head[same_rank_as_embedding] = with_sharding("head", -1, own, self.st, unit)
        return ops


def build_virtual_stages(model: ModelConfig, st: StrategyConfig, source: OpSource | None = None) -> list[Stage]:
    """One Stage per virtual stage (model chunk) in forward order: embedding on the first,
    head + loss on the last; the layers of each from config/layout.py. As in
    Megatron, each chunk is its own TransformerBlock, so ``recompute_layer_num`` counts
    from the first layer of each chunk."""
    src = source or OpSource(model, st)
    counts = vstage_layer_counts(model, st)
    places = virtual_stage_places(st)
    mtp_at = mtp_stage(st.pipeline_model_parallel_layout, len(places))
    p2p = src.dims.act(src.dims.h, local=True)
    group = st.recompute_group_layers  # layers per checkpoint (uniform recompute)
    out: list[Stage] = []
    first_layer = 0
    for k, (r, chunk) in enumerate(places):
        n = counts[k]
        stage = Stage(index=r, layers=list(range(first_layer, first_layer + n)), vstage=k, chunk=chunk)
        runs: list[tuple[CostKind, list[int]]] = []  # (kind, layers): consecutive layers of one kind
        for pos, layer in enumerate(stage.layers):
            kind = src.cost_kind(layer, is_recomputed(st, pos))
            if runs and runs[-1][0] == kind:
                runs[-1][1].append(layer)
            else:
                runs.append((kind, [layer]))
        parts = [StagePart(list(src.pre_ops()) if k == 0 else [])]
        grouped = partial(_grouped_layer_of, src, first_layer, group) if group > 1 else None
        parts += [StagePart(src.layer(src.kind_layer(ls[0], kind[0]), kind[0]), tuple(ls),
                            grouped if kind[0] and grouped else partial(_layer_of, src, kind[0]), kind)
                  for kind, ls in runs]
        post: list[Op] = []
        last = k == len(places) - 1
        if model.mtp_num_layers and k == mtp_at:
            post.extend(src.mtp(embedding_on_this_rank=r == places[0][0], part="all" if last else "body"))
        if last:
            if model.mtp_num_layers and mtp_at != k:
                post.extend(src.mtp(embedding_on_this_rank=r == places[0][0], part="tail"))
            post.extend(src.head(same_rank_as_embedding=r == places[0][0]))
        amax = src.amax_reduction([(p.ops, p.times) for p in parts] + [(post, 1)], k)
        if amax is not None:
            post.append(amax)
        stage.parts = [*parts, StagePart(post)]
        # from a standalone MTP stage on, each depth's hidden state travels with the main one
        stage.p2p_bytes = (p2p * (1 + model.mtp_num_layers if mtp_at <= k else 1)) if not last else 0.0
        out.append(stage)
        first_layer += n
    return out


def _layer_of(src: OpSource, recomputed: bool, layer: int) -> list[Op]:
    """A layer's ops (StagePart.expand of a run of layers)."""
    return src.layer(layer, recomputed)


def _grouped_layer_of(src: OpSource, chunk_first: int, n: int, layer: int) -> list[Op]:
    """A layer's ops in its uniform recompute group of ``n`` layers from the chunk's first
    (StagePart.expand under ``recompute_method`` uniform)."""
    return uniform_groups(src.layer(layer, True), chunk_first + (layer - chunk_first) // n * n)


def merge_chunks(chunks: list[Stage], pp: int) -> list[Stage]:
    """Per pipeline rank: all its chunks' ops (chunk order), for model states and totals."""
    stages = [Stage(index=r) for r in range(pp)]
    for c in sorted(chunks, key=lambda c: (c.index, c.chunk)):
        s = stages[c.index]
        s.parts.extend(c.parts)
        s.layers.extend(c.layers)
    return stages


def build_stages(model: ModelConfig, st: StrategyConfig) -> list[Stage]:
    """Per pipeline rank: everything it holds (embedding on the first, head on the last
    virtual stage's rank)."""
    return merge_chunks(build_virtual_stages(model, st), st.pp_size)
