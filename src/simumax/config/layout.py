"""Which transformer layers each virtual pipeline stage holds: one validated layout the
stage builder consumes (graph/model_graph.py).

Three ways to state it, as Megatron-Core does:
* even split (default), or uneven first / last stages
  (``num_layers_in_first_pipeline_stage`` / ``..._last_...``); each rank's layers split
  evenly over its model chunks;
* ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the
  embedding / the loss counts as one layer in the split (Megatron's
  ``--account-for-*-in-pipeline-split``): layer_num + 1 (+ 1) divide evenly over the
  p x v virtual stages, the first (last) of which holds one transformer layer fewer;
* ``pipeline_model_parallel_layout``: Megatron's layout string
  (megatron/core/transformer/pipeline_parallel_layer_layout.py): ``E`` embedding, ``t``
  transformer layer, ``m`` MTP layer, ``L`` loss, ``|`` between virtual stages (forward
  order), ``x*n`` and ``(...)*n`` repeat, commas are cosmetic (Megatron removes them).
  ``Et*3|(tttt|)*14ttmL`` (or ``Et*3|(tttt|)*14,ttmL``) is DeepSeek-V3 on PP16.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from simumax.errors import ConfigError

if TYPE_CHECKING:
    from simumax.config.model import ModelConfig
    from simumax.config.strategy import StrategyConfig

FIELD = "pipeline_model_parallel_layout"
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_TOKEN = re.compile(r"([EtmL])\*(\d+)")


def expand(layout: str) -> list[str]:
    """The layout's virtual stages as strings of E / t / m / L, repetitions expanded; split on
    ``|`` as Megatron's ``parse_str_to_list`` splits (a trailing ``|`` opens an empty stage)."""
    text = "".join(layout.split()).replace(",", "")
    for _ in range(100):  # innermost groups first
        new = _GROUP.sub(lambda g: g.group(1) * int(g.group(2)), text)
        if new == text:
            break
        text = new
    text = _TOKEN.sub(lambda g: g.group(1) * int(g.group(2)), text)
    bad = set(text) - set("EtmL|")
    if bad:
        raise ConfigError(FIELD, f"unexpected {''.join(sorted(bad))!r} in {layout!r} (E, t, m, L, |, x*n, (...)*n)")
    return text.split("|")


def parse_layout(layout: str, n_stages: int, layer_num: int, mtp_layers: int = 0, pp: int | None = None) -> list[int]:
    """Transformer layers of each virtual stage, checked as Megatron checks a layout (``pp``:
    the pipeline ranks, virtual stage k on rank k % pp)."""
    stages = expand(layout)
    if len(stages) != n_stages:
        raise ConfigError(FIELD, f"{len(stages)} stages in the layout; pp_size x virtual stages per rank = {n_stages}")
    joined = "".join(stages)
    if joined.count("E") != 1 or not stages[0].startswith("E"):
        raise ConfigError(FIELD, "the embedding (E) must appear once, first in the first stage")
    if joined.count("L") != 1 or not stages[-1].endswith("L"):
        raise ConfigError(FIELD, "the loss (L) must appear once, last in the last stage")
    if joined.count("t") != layer_num:
        raise ConfigError(FIELD, f"{joined.count('t')} transformer layers (t) in the layout; layer_num is {layer_num}")
    if joined.count("m") != mtp_layers:
        raise ConfigError(FIELD, f"{joined.count('m')} MTP layers (m) in the layout; mtp_num_layers is {mtp_layers}")
    if "m" in joined:
        # megatron-core pipeline_parallel_layer_layout.validate_layer_layout: every MTP layer in
        # one stage, after every decoder layer, in the last virtual stage of its rank (a
        # standalone MTP stage when that is not the loss's)
        at = next(i for i, s in enumerate(stages) if "m" in s)
        if stages[at].count("m") != mtp_layers:
            raise ConfigError(FIELD, "all MTP layers (m) go in one stage")
        if "t" in joined[joined.index("m"):]:
            raise ConfigError(FIELD, "decoder layers (t) go before the MTP layers (m)")
        if pp and at // pp != n_stages // pp - 1:
            raise ConfigError(FIELD, "the MTP layers (m) go in the last virtual stage of their pipeline rank")
    return [s.count("t") for s in stages]


def mtp_stage(layout: str | None, n_stages: int) -> int:
    """The virtual stage the MTP layers run in: the layout's stage holding them, else the last."""
    if layout:
        for i, s in enumerate(expand(layout)):
            if "m" in s:
                return i
    return n_stages - 1


def virtual_stage_layers(model: "ModelConfig", st: "StrategyConfig", per_rank: list[int]) -> list[int]:
    """Transformer layers of each virtual stage in forward order. ``per_rank``: the even or
    uneven-first/last split per pipeline rank (config.checks.stage_layer_counts)."""
    p, v = st.pp_size, st.chunks_per_rank
    n_stages = p * v
    uneven = st.num_layers_in_first_pipeline_stage is not None or st.num_layers_in_last_pipeline_stage is not None
    emb, loss = st.account_for_embedding_in_pipeline_split, st.account_for_loss_in_pipeline_split
    if st.pipeline_model_parallel_layout:
        if uneven or emb or loss:
            raise ConfigError(FIELD, "a layout states every stage: drop num_layers_in_first/last_pipeline_stage and "
                              "account_for_*_in_pipeline_split")
        return parse_layout(st.pipeline_model_parallel_layout, n_stages, model.layer_num, model.mtp_num_layers, p)
    if (emb or loss) and uneven:
        raise ConfigError("account_for_embedding_in_pipeline_split",
                          "cannot be combined with num_layers_in_first/last_pipeline_stage (Megatron)")
    if emb or loss:
        total = model.layer_num + int(emb) + int(loss)
        if total % n_stages:
            raise ConfigError(
                "account_for_embedding_in_pipeline_split",
                f"layer_num ({model.layer_num}) + embedding / loss ({int(emb) + int(loss)}) must split evenly over "
                f"{n_stages} virtual stages",
            )
        each = total // n_stages
        counts = [each] * n_stages
        counts[0] -= int(emb)
        counts[-1] -= int(loss)
        return counts
    return _even_chunks(st, per_rank)


def _even_chunks(st: "StrategyConfig", per_rank: list[int]) -> list[int]:
    from simumax.graph.placement import virtual_stage_places

    v = st.chunks_per_rank
    return [per_rank[r] // v for r, _ in virtual_stage_places(st)]
