"""Model + strategy -> one Stage (ordered ops for one micro-batch) per pipeline rank."""

from __future__ import annotations

from simumax.config.checks import stage_layer_counts
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError
from simumax.graph import blocks
from simumax.graph.dense_layer import dense_layer
from simumax.graph.dims import Dims
from simumax.graph.ops import Op, Stage
from simumax.graph.recompute import apply_recompute


def _head_ops(model: ModelConfig, st: StrategyConfig, d: Dims) -> list[Op]:
    """Final norm, LM head (Megatron's column-parallel linear) and the loss."""
    x = ("final.x", d.act(d.h, local=True))
    ln_out = ("final_norm.out", d.act(d.h, local=True))
    logits = ("logits", d.act(d.vocab))
    head = blocks.column_linear("lm_head", "lm_head", -1, d, ln_out, d.h, d.vocab, te=False).with_(output=logits)
    if not model.untie_embeddings_and_output_weights and st.pp_size == 1:
        head = head.with_(params=0)  # shares the embedding weight
    return [
        blocks.norm("final_norm", "final_norm", -1, d, x, rms=model.norm_type == "rmsnorm").with_(output=ln_out),
        head,
        blocks.cross_entropy(d, logits, fused=st.cross_entropy_loss_fusion),
    ]


def build_stages(model: ModelConfig, st: StrategyConfig) -> list[Stage]:
    """Per pipeline rank: embedding on the first, its layers, head + loss on the last."""
    d = Dims.of(model, st)
    counts = stage_layer_counts(model, st)
    stages: list[Stage] = []
    first_layer = 0
    for r, n in enumerate(counts):
        stage = Stage(index=r, layers=list(range(first_layer, first_layer + n)))
        if r == 0:
            pos_rows = 0
            if model.position_embedding_type == "learned_absolute":  # replicated over TP
                pos_rows = model.max_position_embeddings or st.seq_len
            stage.ops.append(blocks.embedding(d, d.vocab, pos_rows))
        for pos, layer in enumerate(stage.layers):
            if model.is_moe_layer(layer):
                raise ConfigError("model_type", "MoE layers are not modelled by this version (dense models only)")
            stage.ops.extend(apply_recompute(st, dense_layer(model, st, d, layer), pos))
        if r == len(counts) - 1:
            stage.ops.extend(_head_ops(model, st, d))
        stage.p2p_bytes = d.act(d.h, local=True) if r < len(counts) - 1 else 0.0
        stages.append(stage)
        first_layer += n
    return stages
