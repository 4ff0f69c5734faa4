"""Evaluate one candidate: a memory lower bound first (model states only, no activation
walk), then the memory walk, and the time only for those that fit. For full_block
recompute, the fewest recomputed layers per chunk that fit, found by bisection (memory
falls as the count rises). Estimates share one ProfileCache, so each layer kind is built
and costed once per family of candidates."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.estimate import Estimate
from simumax.memory.model_states import model_states
from simumax.profiles import ProfileCache
from simumax.report.format import zero_label

GIB = 2**30


@dataclass(frozen=True, slots=True)
class SearchRow:
    """One evaluated strategy. Times in seconds, memory in bytes."""

    tp: int
    pp: int
    vp: int
    dp: int
    cp: int
    ep: int
    etp: int
    mbs: int
    mbc: int
    zero: int
    schedule: str
    first_stage_layers: int | None
    last_stage_layers: int | None
    recompute: str  # variant name (search.space.RECOMPUTE_VARIANTS)
    recompute_layer_num: int | None
    fits: bool
    pruned: bool  # rejected by the model-state lower bound: peak_mem is that bound
    peak_mem: float  # max over stages (allocated, or reserved when searching on reserved)
    peak_mem_per_stage: tuple[float, ...]
    headroom: float  # capacity - gmi reserve - peak
    iter_time: float | None = None
    mfu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    strategy: dict[str, Any] | None = None
    pipeline_split: str = ""  # "E", "L", "E+L": the embedding / loss counted as a layer in the pipeline split
    offload: str = "none"  # what goes to host memory: none, optimizer, activations, both
    replicas: int = 1  # HSDP replicas (fsdp_replicate_size)
    fsdp: str = "megatron_fsdp"  # sharded-DP implementation (fsdp_impl)
    # the busiest rank's host issue time of its passes over their GPU time (StageCost.host_issue):
    # from 1 the passes are host-bound, which iter_time does not include
    host_issue_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["peak_mem_per_stage"] = list(self.peak_mem_per_stage)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SearchRow":
        return cls(**{**d, "peak_mem_per_stage": tuple(d["peak_mem_per_stage"])})

    @property
    def key(self) -> str:
        """The candidate, unique within a search (the resume key): all but the
        recompute layer count the evaluation found."""
        return self._text(with_count=False)

    @property
    def label(self) -> str:
        return self._text(with_count=True)

    def _text(self, with_count: bool) -> str:
        pp = f"pp{self.pp}" + (f"[{self.first_stage_layers},{self.last_stage_layers}]" if self.first_stage_layers else "")
        pp += f"[{self.pipeline_split}]" if self.pipeline_split else ""
        vp = f" vp{self.vp}" if self.vp > 1 else ""
        etp = f" etp{self.etp}" if self.etp > 1 else ""
        sched = f" {self.schedule}" if self.schedule not in ("1f1b", "interleaved") else ""
        hsdp = f" hsdp{self.replicas}" if self.replicas > 1 else ""
        count = f"({self.recompute_layer_num})" if with_count and self.recompute_layer_num else ""
        off = f" offload:{self.offload}" if self.offload != "none" else ""
        return (
            f"tp{self.tp} {pp}{vp} dp{self.dp} ep{self.ep}{etp} cp{self.cp} mbs{self.mbs} mbc{self.mbc} "
            f"{zero_label(self.zero, self.fsdp)}{hsdp}{sched} {self.recompute}{count}{off}"
        )


def offload_name(st: StrategyConfig) -> str:
    """none, optimizer, activations or both (search.space.OFFLOAD_VARIANTS)."""
    activations = st.fine_grained_activation_offloading or st.cpu_offloading
    names = [n for n, on in (("optimizer", st.optimizer_cpu_offload), ("activations", activations)) if on]
    return "both" if len(names) == 2 else (names[0] if names else "none")


def candidate_key(rc: str, st: StrategyConfig) -> str:
    """The key of the row a candidate will give."""
    return _row(rc, st, fits=False, pruned=False, per_stage=[0.0], budget=0.0).key


def _row(rc: str, st: StrategyConfig, *, fits: bool, pruned: bool, per_stage: list[float], budget: float, **extra: Any) -> SearchRow:
    peak = max(per_stage)
    return SearchRow(
        tp=st.tp_size, pp=st.pp_size, vp=st.interleaving_size, dp=st.dp_size, cp=st.cp_size, ep=st.ep_size,
        etp=st.etp_size, mbs=st.micro_batch_size, mbc=st.micro_batch_num, zero=st.zero_state, schedule=st.schedule,
        first_stage_layers=st.num_layers_in_first_pipeline_stage, last_stage_layers=st.num_layers_in_last_pipeline_stage,
        recompute=rc, recompute_layer_num=st.recompute_layer_num if st.recompute_mode == "full_block" else None,
        fits=fits, pruned=pruned, peak_mem=peak, peak_mem_per_stage=tuple(per_stage), headroom=budget - peak,
        strategy=st.to_dict(),
        pipeline_split="+".join(p for p, on in (("E", st.account_for_embedding_in_pipeline_split),
                                                 ("L", st.account_for_loss_in_pipeline_split)) if on),
        offload=offload_name(st), replicas=st.fsdp_replicate_size, fsdp=st.fsdp_impl,
        **extra,
    )


def _scale(st: StrategyConfig, use_reserved: bool) -> float:
    return 1.0 / st.mem_factor if use_reserved else 1.0


def _walked(est: Estimate, use_reserved: bool) -> list[float]:
    mem = est.memory()
    return [s.peak_mem_with_reserved if use_reserved else s.peak_mem for s in mem.stages]


def evaluate(
    model: ModelConfig,
    rc: str,
    st: StrategyConfig,
    system: SystemConfig,
    profiles: ProfileCache,
    *,
    gmi_error: float = 0.0,
    use_reserved_memory: bool = True,
) -> SearchRow:
    budget = float(system.mem_bytes) - gmi_error * GIB
    est = Estimate(model, st, system, profiles)
    scale = _scale(st, use_reserved_memory)
    bound = [model_states(st, s, system.sys_name).total * scale for s in est.stages]
    if max(bound) > budget:
        return _row(rc, st, fits=False, pruned=True, per_stage=bound, budget=budget)
    per_stage = _walked(est, use_reserved_memory)
    if st.recompute_mode == "full_block" and max(per_stage) <= budget:
        lo, hi = 1, max(len(c.layers) for c in est.chunks)
        best = (est, per_stage)
        while lo < hi:  # fewest recomputed layers per chunk that still fit
            mid = (lo + hi) // 2
            trial = Estimate(model, st.with_updates({"recompute_layer_num": mid}), system, profiles)
            ps = _walked(trial, use_reserved_memory)
            if max(ps) <= budget:
                best, hi = (trial, ps), mid
            else:
                lo = mid + 1
        est, per_stage = best
        if est.strategy.recompute_layer_num is None:  # all layers: say how many
            est = Estimate(model, st.with_updates({"recompute_layer_num": hi}), system, profiles)
    fits = max(per_stage) <= budget and all(math.isfinite(x) for x in per_stage)
    if not fits:
        return _row(rc, est.strategy, fits=False, pruned=False, per_stage=per_stage, budget=budget)
    cost = est.cost(band=False)  # ranked by the point estimate: no band needed
    return _row(
        rc, est.strategy, fits=True, pruned=False, per_stage=per_stage, budget=budget,
        iter_time=cost.duration_time_per_iter, mfu=cost.mfu, tokens_per_s_per_gpu=cost.throughput_per_accelerator,
        host_issue_share=max((s.host_issue_share for s in cost.stages), default=0.0),
    )
