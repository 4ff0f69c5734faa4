"""SimuMax's result keys over our results (issue 21 part 4): ``perf.analysis_cost()`` and
``perf.analysis_mem()`` return our typed results, which also answer SimuMax's keys through
``.data`` and item access (``cost["duration_time_per_iter"]``, ``mem["first_stage"]["peak_mem"]``).
All values are SI numbers (seconds, bytes, FLOPs, tokens), TFLOP/s keys excepted.
The key names live here only; our own result types do not carry them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from simumax.report.results import CostResult, MemResult, StageMemory, _clean

if TYPE_CHECKING:
    from simumax.estimate import Estimate


class _Keyed:
    """Item access and ``.data`` over a SimuMax-keyed dict; ``to_dict`` stays ours."""

    __slots__ = ()
    data: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def keys(self) -> Any:
        return self.data.keys()

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)  # type: ignore[call-overload]
        out.pop("data")
        return _clean(out)


@dataclass(frozen=True, slots=True)
class SimuMaxCostResult(_Keyed, CostResult):
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class SimuMaxMemResult(_Keyed, MemResult):
    data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def cost_view(cost: CostResult, est: "Estimate") -> SimuMaxCostResult:
    st, m = est.strategy, est.model
    p = est.params
    comm_parts = {k: v for k, v in cost.breakdown.items() if k.endswith(("_comm", "_p2p", "_sync"))}
    compute = {"fwd": 0.0, "bwd": 0.0, "recompute": 0.0}
    membound = dict(compute)
    for t in est.chunk_times:  # one micro-batch through every model chunk (the whole model)
        for ph, pt in (("fwd", t.fwd), ("bwd", t.bwd), ("recompute", t.recompute)):
            compute[ph] += pt.compute
            membound[ph] += pt.membound
    data: dict[str, Any] = {
        "duration_time_per_iter": cost.duration_time_per_iter,
        "mfu": cost.mfu,
        "mfu_6nd_with_attn": cost.mfu_6nd_with_attn,
        "throughput_per_accelerator": cost.throughput_per_accelerator,
        "tflops": cost.tflops_per_gpu,
        "tflops_6nd_with_attn": cost.mfu_6nd_with_attn * est.peak_flops() / 1e12,
        "all_tokens_per_iter": cost.tokens_per_iter,
        "breakdown_result": dict(cost.breakdown),
        "comm_details": comm_parts,
        "compute_details": {
            "gemm_and_attention_per_micro_batch": compute, "memory_bound_per_micro_batch": membound,  # all chunks
        },
        "all_chunk_times": [
            {"fwd_time": t.fwd.total, "bwd_time": t.bwd.total, "recompute_time": t.recompute.total, "p2p_time": t.p2p}
            for t in est.chunk_times
        ],
        "straggle_ratio": 1.0,  # the straggler model is not modelled
        "flops_info": {
            "model_flops_per_iter": cost.flops_per_iter,
            "flops_6nd_with_attn_per_iter": est.flops_6nd_with_attn(),
            "model_flops_per_token": cost.flops_per_iter / max(cost.tokens_per_iter, 1),
            "peak_flops_per_gpu": est.peak_flops(),
        },
        "param_numel_info": {"total": p.total, "activated": p.active, "expert": p.expert},
        "moe_param_numel": p.expert,
        "world_size": st.world_size,
        "model_name": m.model_name,
    }
    kwargs = {f.name: getattr(cost, f.name) for f in fields(cost)}
    return SimuMaxCostResult(**kwargs, data=data)


def _stage(s: StageMemory, mem_factor: float) -> dict[str, Any]:
    return {
        "model_mem": s.model_mem,
        "weights": s.weights,
        "grads": s.grads,
        "optimizer": s.optimizer,
        "fwd_activation_cache_per_micro_batch": s.fwd_activation_cache_per_micro_batch,
        "peak_activation_mem_in_1F1B": s.activation_mem,
        "peak_mem": s.peak_mem,
        "peak_mem_with_reserved": s.peak_mem_with_reserved,
        "memory_reserved_ratio": mem_factor,
        "peak_path": dict(s.peak_path),
        "layers": s.layers,
    }


def mem_view(mem: MemResult, est: "Estimate") -> SimuMaxMemResult:
    """Flat for one pipeline stage, else ``first_stage`` / ``middle_stage`` (pp > 2) /
    ``last_stage``, as SimuMax reports them."""
    factor = est.strategy.mem_factor
    stages = mem.stages
    if len(stages) == 1:
        data = _stage(stages[0], factor)
    else:
        data = {"first_stage": _stage(stages[0], factor), "last_stage": _stage(stages[-1], factor)}
        if len(stages) > 2:
            data["middle_stage"] = _stage(stages[len(stages) // 2], factor)
    data.update({"peak_mem": mem.peak_mem, "peak_mem_with_reserved": mem.peak_mem_with_reserved,
                 "capacity": mem.capacity, "fits": mem.fits})
    kwargs = {f.name: getattr(mem, f.name) for f in fields(mem)}
    return SimuMaxMemResult(**kwargs, data=data)
