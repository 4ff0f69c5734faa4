"""The legal strategies of a search space (Megatron's divisibility rules via the config checks)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from simumax.config.checks import check_compatible
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError

RECOMPUTE_TYPES = ("none", "selective", "full_block")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, slots=True)
class SearchSpace:
    world_size: int
    global_batch_size: int
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] | None = None  # None: every divisor of the layer count that fits
    ep: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1,)
    recompute: tuple[str, ...] = RECOMPUTE_TYPES
    zero: tuple[int, ...] = (1,)
    extra: dict = field(default_factory=dict)  # fixed strategy fields (seq_len, dtype, ...)


def _recompute_fields(kind: str) -> dict:
    if kind == "none":
        return {"enable_recompute": False, "recompute_granularity": None}
    if kind == "selective":  # Megatron's default selective recompute: core attention
        return {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True}
    if kind == "full_block":
        return {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None}
    raise ConfigError("recompute_search_type", f"unknown recompute type {kind!r}; allowed {RECOMPUTE_TYPES}")


def candidates(model: ModelConfig, system: SystemConfig, base: StrategyConfig, space: SearchSpace) -> Iterator[StrategyConfig]:
    """Every legal strategy of the space, in a deterministic order."""
    pp_list = space.pp or tuple(p for p in divisors(model.layer_num) if p <= space.world_size)
    ep_list = space.ep if model.is_moe else (1,)
    for tp, pp, ep, cp, mbs, rc, zero in itertools.product(space.tp, pp_list, ep_list, space.cp, space.mbs, space.recompute, space.zero):
        denom = tp * pp * cp
        if space.world_size % denom:
            continue
        dp = space.world_size // denom
        if space.global_batch_size % (mbs * dp):
            continue
        fields = {
            **base.to_dict(), **space.extra, "world_size": space.world_size, "tp_size": tp, "pp_size": pp, "ep_size": ep,
            "cp_size": cp, "micro_batch_size": mbs, "micro_batch_num": space.global_batch_size // (mbs * dp), "zero_state": zero,
            "enable_sequence_parallel": tp > 1, "interleaving_size": 1, "num_layers_in_first_pipeline_stage": None,
            "num_layers_in_last_pipeline_stage": None, "megatron_recompute": False, "megatron_recompute_modules": [],
            "attn_recompute": False, "mlp_recompute": False, "mlp_rms_recompute": False, "mla_rms_recompute": False,
            **_recompute_fields(rc),
        }
        try:
            st = StrategyConfig.init_from_dict(fields, source="search")
            check_compatible(model, st, system)
        except ConfigError:
            continue
        yield st
