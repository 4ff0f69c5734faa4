"""Parameter counts of the whole model, summed from the per-rank op IR.

Each op knows the parameters one rank holds; the model's count multiplies them back by
the shards: TP for TP-split weights (replicated ones once: norms, router, MLA
down-projections, KV heads copied when tp > kv_head_num), EP x ETP for experts; a tied
output layer's copy of the embedding on the last stage is not counted again. Embedding rows are the padded vocab.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph.mtp import MODULE_EMBEDDING as MTP_EMBEDDING
from simumax.graph.ops import Op, Stage


@dataclass(frozen=True, slots=True)
class ParamCount:
    total: int
    expert: int  # routed-expert parameters of all layers
    active: int  # per token: everything except the (E - topk) / E unused routed experts
    mtp: int = 0  # of total: the multi-token-prediction block's own (it shares embedding and head)

    def to_dict(self) -> dict[str, int]:
        return {"total": self.total, "expert": self.expert, "active": self.active, "mtp": self.mtp}


def count_params(model: ModelConfig, st: StrategyConfig, stages: list[Stage]) -> ParamCount:
    """The model's parameters, each counted once over stages and shards; the MTP block's
    own (ops of layers past layer_num) apart, as published counts leave them out
    (DeepSeek-V3: 671B without its MTP module)."""
    return count_params_of(model, st, (g for s in stages for g in s.groups()))


def count_params_of(model: ModelConfig, st: StrategyConfig, groups: Iterable[tuple[list[Op], int]]) -> ParamCount:
    """``count_params`` over (ops, times) groups: ops that occur ``times`` times (the layers
    of one kind carry the same parameters under other names)."""
    dense = expert = mtp = 0
    for ops, times in groups:
        for o in ops:
            if not o.params:
                continue
            if o.name == "lm_head" and not model.untie_embeddings_and_output_weights:
                continue  # tied: the last stage's copy of the embedding weight (counted there)
            if o.module == MTP_EMBEDDING:
                continue  # the MTP block's copy of the word embedding
            non_expert = o.params - o.expert_params
            rep = o.tp_replicated_params
            n_dense = ((non_expert - rep) * st.tp_size + rep * st.tp_size // (o.tp_copies or st.tp_size)) * times
            n_expert = o.expert_params * st.ep_size * st.etp_size * times
            if o.layer >= model.layer_num:
                mtp += n_dense + n_expert
                continue
            dense += n_dense
            expert += n_expert
    active = dense + (expert * model.topk // model.expert_num if model.is_moe else 0)
    return ParamCount(total=dense + expert, expert=expert, active=active, mtp=mtp)
