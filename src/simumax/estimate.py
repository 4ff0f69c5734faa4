"""One estimate: configs -> IR -> costs -> schedule/memory -> typed results.

This is the whole pipeline in one readable place; PerfLLM, the CLI, validation and the
search all call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from simumax.config.checks import check_compatible
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.cost.efficiency import ComputeModel
from simumax.cost.network import NetworkModel
from simumax.cost.stage_time import Coster, StageTime, stage_time
from simumax.graph.kernels import Collective, MemBound
from simumax.graph.model_graph import build_stages
from simumax.graph.ops import Stage
from simumax.graph.params import ParamCount, count_params
from simumax.memory.activation_walk import walk
from simumax.memory.model_states import model_states, optimizer_bytes_per_param, shard_params
from simumax.report.results import CostResult, MemResult, StageCost, StageMemory
from simumax.schedule.one_f_one_b import in_flight, pipeline_time

MEGATRON_MIN_BUCKET = 40_000_000  # elements (Megatron DDP default bucket)


@dataclass
class Estimate:
    model: ModelConfig
    strategy: StrategyConfig
    system: SystemConfig

    def __post_init__(self) -> None:
        check_compatible(self.model, self.strategy, self.system)

    @cached_property
    def stages(self) -> list[Stage]:
        return build_stages(self.model, self.strategy)

    @cached_property
    def compute_model(self) -> ComputeModel:
        return ComputeModel(self.system)

    @cached_property
    def network(self) -> NetworkModel:
        return NetworkModel(self.system, self.strategy)

    @cached_property
    def coster(self) -> Coster:
        return Coster(self.compute_model, self.network)

    @cached_property
    def stage_times(self) -> list[StageTime]:
        out = []
        for s in self.stages:
            p2p = self.network.time(Collective("p2p", s.p2p_bytes, "pp")) if s.p2p_bytes else 0.0
            out.append(stage_time(self.coster, s, p2p))
        return out

    # ---- data-parallel gradient sync and optimizer ------------------------------------
    def _grad_sync_time(self, params: int, group: str) -> float:
        """Bucketed gradient reduce (RS for ZeRO-1, AR for ZeRO-0) + ZeRO-1 param all-gather
        of ``params`` over one data-parallel group."""
        st = self.strategy
        size = self.network.groups[group].size
        if size <= 1 or params <= 0:
            return 0.0
        bucket = st.ddp_bucket_size or max(MEGATRON_MIN_BUCKET, 1_000_000 * size)
        n_full, rest = divmod(params, bucket)
        t = 0.0
        for elems in [bucket] * n_full + ([rest] if rest else []):
            if st.zero_state >= 1:
                t += self.network.time(Collective("reduce_scatter", elems * st.main_grad_bytes, group))
                t += self.network.time(Collective("all_gather", elems * st.dtype_bytes, group))
            else:
                t += self.network.time(Collective("all_reduce", elems * st.main_grad_bytes, group))
        return t

    def dp_comm_time(self, stage: Stage) -> float:
        """Dense gradients sync over DP x CP (CP ranks hold the same weights); expert
        gradients over the expert-data-parallel group."""
        dense = stage.params - stage.expert_params
        return self._grad_sync_time(dense, "dp") + self._grad_sync_time(stage.expert_params, "edp")

    def optimizer_time(self, stage: Stage) -> float:
        """Megatron's optimizer step over this rank's shard, pass by pass (bytes/param):
        main grad -> fp32 optimizer grad (g + 4), nan/inf check (g), grad norm (4),
        clip scale (8), Adam (read grad, master, m, v; write master, m, v: 4 + 2*12),
        master -> bf16 param (4 + 2); and zeroing the full main-grad buffer (g)."""
        st = self.strategy
        shard = shard_params(st, stage)
        g = st.main_grad_bytes
        states = optimizer_bytes_per_param(st)
        kernels = [
            MemBound("optimizer.copy_grads", shard * (g + 4)),
            MemBound("optimizer.check_finite", shard * g),
            MemBound("optimizer.grad_norm", shard * 4),
            MemBound("optimizer.clip", shard * 8),
            MemBound("optimizer.adam", shard * (4 + 2 * states)),
            MemBound("optimizer.copy_params", shard * (4 + st.dtype_bytes)),
            MemBound("optimizer.zero_grad", stage.params * g),
        ]
        return sum(self.compute_model.membound(k) for k in kernels)

    # ---- results ---------------------------------------------------------------------
    def model_flops_per_iter(self) -> float:
        st = self.strategy
        per_mb = sum(t.fwd.flops + t.bwd.flops for t in self.stage_times)  # one rank of each stage
        return per_mb * st.micro_batch_num * st.world_size / st.pp_size

    @cached_property
    def params(self) -> ParamCount:
        return count_params(self.model, self.strategy, self.stages)

    def flops_6nd_with_attn(self) -> float:
        """SimuMax's convention: 6 x active params x tokens + non-causal attention."""
        m, st = self.model, self.strategy
        n_params = self.params.active
        tokens = st.global_batch_size * st.seq_len
        attn_per_token = 6 * m.layer_num * st.seq_len * m.head_num * 2 * m.head_size
        return tokens * (6 * n_params + attn_per_token)

    def peak_flops(self) -> float:
        ops = self.system.accelerator.op
        name = "fp8_matmul" if self.strategy.fp8 and "fp8_matmul" in ops else "matmul"
        return (ops.get(name) or ops["default"]).tflops * 1e12

    def cost(self) -> CostResult:
        st = self.strategy
        times = self.stage_times
        v = st.interleaving_size
        last = len(times) - 1
        # blocking P2P: a stage sends its activation forward and its input gradient back
        p2p_fwd = [t.p2p if r < last else 0.0 for r, t in enumerate(times)]
        p2p_bwd = [t.p2p if r > 0 else 0.0 for r, t in enumerate(times)]
        per_stage = [
            (t.fwd.total + p2p_fwd[r], t.bwd.total + t.recompute.total + p2p_bwd[r]) for r, t in enumerate(times)
        ]
        pipe = pipeline_time(per_stage, st.micro_batch_num, v)
        stage_costs = []
        ends = []
        for r, (s, t) in enumerate(zip(self.stages, times)):
            dp_t = self.dp_comm_time(s)
            opt_t = self.optimizer_time(s)
            ends.append(pipe.end_per_rank[r] + dp_t + opt_t)
            comm: dict[str, float] = {}
            for ph in (t.fwd, t.bwd, t.recompute):
                for g, x in ph.comm.items():
                    comm[g] = comm.get(g, 0.0) + x
            stage_costs.append(
                StageCost(
                    stage=r, layers=len(s.layers), fwd=t.fwd.total, bwd=t.bwd.total, recompute=t.recompute.total,
                    p2p=t.p2p, comm_exposed=comm, dp_comm=dp_t, optimizer=opt_t, end_of_backward=pipe.end_per_rank[r],
                )
            )
        total = max(ends)
        crit = max(range(len(ends)), key=lambda r: ends[r])
        m = st.micro_batch_num
        ct = times[crit]
        sc = stage_costs[crit]
        comm_mb = sc.comm_exposed
        breakdown = {
            "fwd": (ct.fwd.total - sum(ct.fwd.comm.values())) * m,
            "bwd": (ct.bwd.total - sum(ct.bwd.comm.values())) * m,
            "recompute": (ct.recompute.total - sum(ct.recompute.comm.values())) * m,
            **{f"{g}_comm": x * m for g, x in sorted(comm_mb.items())},
            "pp_p2p": (p2p_fwd[crit] + p2p_bwd[crit]) * m,
            # fill/drain of the pipeline, and per-micro-batch waiting on a slower stage
            "bubble": max(0.0, pipe.end_per_rank[crit] - pipe.busy_max),
            "stage_imbalance": max(0.0, m * (max(f + b for f, b in per_stage) - per_stage[crit][0] - per_stage[crit][1])),
            "dp_comm": sc.dp_comm,
            "optimizer": sc.optimizer,
        }
        flops = self.model_flops_per_iter()
        world = st.world_size
        tokens = st.global_batch_size * st.seq_len
        peak = self.peak_flops()
        return CostResult(
            duration_time_per_iter=total,
            mfu=flops / (total * world * peak),
            mfu_6nd_with_attn=self.flops_6nd_with_attn() / (total * world * peak),
            tflops_per_gpu=flops / (total * world) / 1e12,
            throughput_per_accelerator=tokens / total / world,
            flops_per_iter=flops,
            tokens_per_iter=tokens,
            breakdown=breakdown,
            stages=stage_costs,
            efficiency_lookups=self.compute_model.log.to_dict(),
        )

    def memory(self) -> MemResult:
        st = self.strategy
        v = st.interleaving_size
        out = []
        for s in self.stages:
            states = model_states(st, s)
            w = walk(s.ops)
            n = in_flight(st.pp_size, s.index, st.micro_batch_num, v) / v
            others = max(n - 1.0, 0.0) * w.stored
            fwd_peak, bwd_peak = others + w.fwd_peak, others + w.bwd_peak
            phase, op, act_peak = ("bwd", w.bwd_peak_op, bwd_peak) if bwd_peak >= fwd_peak else ("fwd", w.fwd_peak_op, fwd_peak)
            peak = states.total + act_peak
            out.append(
                StageMemory(
                    stage=s.index, layers=len(s.layers), params=s.params, weights=states.weights, grads=states.grads,
                    optimizer=states.optimizer, te_buffers=states.te_buffers, model_mem=states.total,
                    fwd_activation_cache_per_micro_batch=w.stored, in_flight_micro_batches=n,
                    activation_mem=act_peak, peak_mem=peak, peak_mem_with_reserved=peak / st.mem_factor,
                    peak_path={"phase": phase, "op": op, "in_flight": f"{n:g}"},
                )
            )
        top = max(out, key=lambda x: x.peak_mem)
        cap = float(self.system.mem_bytes)
        return MemResult(
            stages=out, peak_mem=top.peak_mem, peak_mem_with_reserved=top.peak_mem_with_reserved,
            peak_stage=top.stage, capacity=cap, fits=top.peak_mem_with_reserved <= cap and math.isfinite(top.peak_mem),
        )
