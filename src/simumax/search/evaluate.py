"""Evaluate candidates: memory first (cheap), time only for those that fit; for full-block
recompute, the fewest recomputed layers per stage that fit, found by bisection."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.estimate import Estimate

GIB = 2**30


@dataclass(frozen=True, slots=True)
class SearchRow:
    """One evaluated strategy. Times in seconds, memory in bytes."""

    tp: int
    pp: int
    dp: int
    ep: int
    cp: int
    mbs: int
    mbc: int
    zero: int
    recompute: str
    recompute_layer_num: int | None
    fits: bool
    peak_mem: float  # max over stages (allocated, or reserved when searching on reserved)
    peak_mem_per_stage: tuple[float, ...]
    headroom: float  # capacity - gmi reserve - peak
    iter_time: float | None = None
    mfu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    strategy: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_mem_per_stage"] = list(self.peak_mem_per_stage)
        return d

    @property
    def label(self) -> str:
        rc = self.recompute + (f"({self.recompute_layer_num})" if self.recompute_layer_num else "")
        return f"tp{self.tp} pp{self.pp} dp{self.dp} ep{self.ep} cp{self.cp} mbs{self.mbs} mbc{self.mbc} {rc}"


def _recompute_kind(st: StrategyConfig) -> str:
    mode = st.recompute_mode
    return "none" if mode == "none" else ("full_block" if mode == "full_block" else "selective")


def _memory(model: ModelConfig, st: StrategyConfig, system: SystemConfig, use_reserved: bool) -> tuple[Estimate, list[float]]:
    est = Estimate(model, st, system)
    mem = est.memory()
    per_stage = [s.peak_mem_with_reserved if use_reserved else s.peak_mem for s in mem.stages]
    return est, per_stage


def evaluate(
    model: ModelConfig, st: StrategyConfig, system: SystemConfig, *, gmi_error: float = 0.0, use_reserved_memory: bool = True
) -> SearchRow:
    """Memory of the candidate; for full_block the fewest layers that fit; time if it fits."""
    budget = float(system.mem_bytes) - gmi_error * GIB
    est, per_stage = _memory(model, st, system, use_reserved_memory)
    if st.recompute_mode == "full_block" and max(per_stage) <= budget:
        # fewest recomputed layers per stage that still fit (memory falls as layers rise)
        lo, hi = 1, max(len(s.layers) for s in est.stages)
        best = (est, per_stage, hi)
        while lo < hi:
            mid = (lo + hi) // 2
            trial = st.with_updates({"recompute_layer_num": mid})
            e, ps = _memory(model, trial, system, use_reserved_memory)
            if max(ps) <= budget:
                best, hi = (e, ps, mid), mid
            else:
                lo = mid + 1
        est, per_stage, n = best
        st = est.strategy
    peak = max(per_stage)
    fits = peak <= budget and math.isfinite(peak)
    row = dict(
        tp=st.tp_size, pp=st.pp_size, dp=st.dp_size, ep=st.ep_size, cp=st.cp_size, mbs=st.micro_batch_size,
        mbc=st.micro_batch_num, zero=st.zero_state, recompute=_recompute_kind(st),
        recompute_layer_num=st.recompute_layer_num if st.recompute_mode == "full_block" else None,
        fits=fits, peak_mem=peak, peak_mem_per_stage=tuple(per_stage), headroom=budget - peak,
        strategy=st.to_dict(),
    )
    if fits:
        cost = est.cost()
        row.update(iter_time=cost.duration_time_per_iter, mfu=cost.mfu, tokens_per_s_per_gpu=cost.throughput_per_accelerator)
    return SearchRow(**row)
