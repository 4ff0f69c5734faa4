"""Typed results. Every number is SI: seconds, bytes, FLOPs, FLOP/s, tokens/s."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


class _ToDict:
    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class StageCost(_ToDict):
    stage: int
    layers: int
    fwd: float  # one micro-batch, seconds
    bwd: float
    recompute: float
    p2p: float
    comm_exposed: dict[str, float]  # per micro-batch, by group (tp, cp, ep ...)
    dp_comm: float  # per iteration
    optimizer: float  # per iteration
    end_of_backward: float  # when this stage's last backward finishes
    # tensor-core rate vs the tables under the board's power limit (cost/power.py; 1 without a curve)
    tensor_core_rate: float = 1.0
    # host seconds to issue one micro-batch's passes (kernel launches x system.host_op_us); not
    # in the time, which takes the GPU as never waiting for the host (Estimate.host_issue_seconds)
    host_issue: float = 0.0

    @property
    def host_issue_share(self) -> float:
        """``host_issue`` over the GPU time of the passes it issues; from 1 they are host-bound."""
        busy = self.fwd + self.bwd + self.recompute
        return self.host_issue / busy if busy > 0 else 0.0


@dataclass(frozen=True, slots=True)
class CostResult(_ToDict):
    duration_time_per_iter: float  # s
    mfu: float  # model FLOPs (causal attention halved) / (time * peak * GPUs)
    mfu_6nd_with_attn: float  # SimuMax convention: 6*N*D + full (non-causal) attention
    tflops_per_gpu: float  # model FLOP/s per GPU / 1e12
    tflops_per_gpu_megatron: float  # what Megatron-LM's log prints for this time (report/megatron_flops.py)
    throughput_per_accelerator: float  # tokens / s / GPU
    flops_per_iter: float  # model FLOPs over all GPUs
    tokens_per_iter: int
    breakdown: dict[str, float]  # seconds on the critical rank: fwd, bwd, recompute, tp_comm, ...
    stages: list[StageCost]
    efficiency_lookups: dict[str, Any] = field(default_factory=dict)
    # 80 % bands (simumax/uncertainty.py); the point estimates above never move
    duration_time_interval: tuple[float, float] | None = None  # s
    mfu_interval: tuple[float, float] | None = None
    throughput_interval: tuple[float, float] | None = None  # tokens / s / GPU
    unmeasured_share: float | None = None  # share of compute and collective seconds nothing measured gave


@dataclass(frozen=True, slots=True)
class StageMemory(_ToDict):
    stage: int
    layers: int
    params: int
    weights: float  # bytes (at the peak's moment, where a backward holds other states: DeepSpeed's)
    grads: float
    optimizer: float
    te_buffers: float
    model_mem: float  # weights + grads + optimizer + te_buffers
    fwd_activation_cache_per_micro_batch: float
    in_flight_micro_batches: float
    # at the peak, all in-flight micro-batches (FSDP2: with the gathered units' change from
    # the weights' forward-end figure, memory/activation_walk.py)
    activation_mem: float
    stored_activation_mem: float  # most stored activations held between passes (no pass transients)
    peak_mem: float  # allocated
    peak_mem_with_reserved: float  # allocated / mem_factor
    # where the peak is: {"phase": "bwd", "op": "L3.fc1", "in_flight": 2.0, "micro_batch": 5, "vstage": 0}
    # (micro_batch / vstage None when no activation is live)
    peak_path: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MemResult(_ToDict):
    stages: list[StageMemory]
    peak_mem: float  # max over stages, allocated
    peak_mem_with_reserved: float
    peak_stage: int
    capacity: float  # device memory, bytes
    fits: bool
    peak_mem_interval: tuple[float, float] | None = None  # 80 % band of peak_mem, bytes


@dataclass(frozen=True, slots=True)
class SimRank(_ToDict):
    rank: int
    end_of_backward: float  # s, last pipeline pass done
    end: float  # s, optimizer step (and blocking parameter gathers) done
    busy: float  # s of passes on the compute stream
    bubble_fraction: float  # idle share of [0, end_of_backward]
    peak_mem: float  # bytes allocated at the worst moment of the schedule walk


@dataclass(frozen=True, slots=True)
class SimResult(_ToDict):
    schedule: str
    duration_time_per_iter: float  # s, event simulation
    closed_form_time_per_iter: float  # s, analysis_cost() (equal with overlap off, up to rounding)
    ranks: list[SimRank]
    files: dict[str, str]  # what was written: trace, memory timelines, snapshot, gantt
