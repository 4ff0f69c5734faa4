"""One estimate: configs -> IR -> costs -> schedule/memory -> typed results.

This is the whole pipeline in one readable place; PerfLLM, the CLI, validation and the
search all call it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from simumax.config.checks import check_compatible
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.cost.breakdown import critical_rank_breakdown
from simumax.cost.efficiency import ComputeModel
from simumax.cost.network import NetworkModel
from simumax.cost.power import stage_rates, throttled
from simumax.cost.sources import KernelSources
from simumax.cost.stage_time import PhaseTime, StageTime
from simumax.dp.buckets import GradBucket, ParamOrder
from simumax.dp.iteration_step import DataParallelStep
from simumax.graph.kernels import HOST_SYNC, Attention, Collective, MemBound
from simumax.graph.model_graph import build_virtual_stages, merge_chunks
from simumax.graph.ops import Stage
from simumax.graph.params import ParamCount, count_params_of
from simumax.graph import fp8
from simumax.memory.activation_walk import WalkResult
from simumax.memory.result import memory_result
from simumax.report.megatron_flops import megatron_logged_flops
from simumax.report.results import CostResult, MemResult, StageCost
from simumax.memory.schedule_walk import RankActivations, walk_schedule
from simumax.profiles import LayerProfiles, ProfileCache
from simumax.schedule import SPLIT_BACKWARD
from simumax.schedule.one_f_one_b import pipeline_time
from simumax.simulate.engine import PassCosts, PipelineOptions, PipelineRun
from simumax.simulate.iteration import IterationRun, pass_costs, simulate_iteration
from simumax.simulate.steady import steady_idle, steady_pipeline, steady_walk_counts
from simumax.uncertainty import TIME_BAND, band_share


def p2p_host_wait(st: StrategyConfig, system: SystemConfig) -> float:
    """The host wait each blocking pipeline send adds. Megatron's batched P2P
    (``batch_p2p_comm`` = not ``overlap_p2p_comm``) synchronises the device after every
    exchange (pipeline_parallel/p2p_communication.py, ``batch_p2p_sync``, there since 2020):
    the host waits, then issues the next pass (``host_sync_us``). 1F1B exchanges after each
    pass that sends; the interleaved steady state once per forward-backward pair
    (``send_forward_backward_recv_forward_backward``): half a wait per send. Not counted: the
    interleaved warm-up's and flush's exchange after every pass, and the receive-only calls
    of warm-up and cool-down. Overlapped P2P does not batch, and torchtitan's and DeepSpeed's
    pipelines (``fsdp_impl``) do not synchronise so."""
    if st.p2p_overlapped or st.fsdp_impl != "megatron_fsdp":
        return 0.0
    return system.host_sync_us * 1e-6 * (0.5 if st.schedule == "interleaved" else 1.0)


@dataclass
class Estimate(DataParallelStep):
    model: ModelConfig
    strategy: StrategyConfig
    system: SystemConfig
    # layer profiles shared with other estimates of this model and system (the search's);
    # None: the one kept with the system config (ProfileCache.of). Results are the same.
    profiles: ProfileCache | None = field(default=None, repr=False, compare=False)
    # per chunk (vstage): its (dense, expert) parameter orders and its buckets
    _bucket_cache: dict[int, tuple[tuple[ParamOrder, ParamOrder], list[GradBucket]]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for cfg in (self.model, self.strategy, self.system):
            cfg.check()  # a cross-field rule an in-place edit left broken
        check_compatible(self.model, self.strategy, self.system)
        if self.profiles is None:
            self.profiles = ProfileCache.of(self.model, self.system)
        elif self.profiles.model is not self.model or self.profiles.system is not self.system:
            raise ValueError("ProfileCache belongs to another model or system")

    @cached_property
    def layer_profiles(self) -> LayerProfiles:
        return self.profiles.family(self.strategy, self.network)

    @cached_property
    def chunks(self) -> list[Stage]:
        """One Stage per virtual stage (model chunk), in forward order."""
        return build_virtual_stages(self.model, self.strategy, self.layer_profiles.source)

    @cached_property
    def stages(self) -> list[Stage]:
        """One Stage per pipeline rank (all its chunks)."""
        return merge_chunks(self.chunks, self.strategy.pp_size)

    @cached_property
    def compute_model(self) -> ComputeModel:
        return self.profiles.compute

    @cached_property
    def network(self) -> NetworkModel:
        return NetworkModel(self.system, self.strategy)

    @cached_property
    def kernel_sources(self) -> KernelSources:
        """This estimate's kernel seconds (one micro-batch through every chunk) by family
        and source: measured, fitted or default (``CostResult.efficiency_lookups``)."""
        out = KernelSources()
        for c in self.chunks:
            out.add(self.layer_profiles.chunk_sources(self.strategy, c))
        return out

    @cached_property
    def chunk_times(self) -> list[StageTime]:
        """Per virtual stage, one micro-batch; ``p2p`` is its send to the next virtual
        stage (0 when that one is on the same rank, as at DualPipeV's turn). With a power
        curve, each chunk's tensor-core time runs at the clock its own mix allows
        (cost/power.py)."""
        out = []
        for k, c in enumerate(self.chunks):
            crosses = k + 1 < len(self.chunks) and self.chunks[k + 1].index != c.index
            p2p = self.network.time(Collective("p2p", c.p2p_bytes, "pp")) if crosses and c.p2p_bytes else 0.0
            if p2p:
                p2p += p2p_host_wait(self.strategy, self.system)
            out.append(self.layer_profiles.chunk_time(self.strategy, c, p2p))
        curve = self.system.accelerator.power_curve
        return [throttled(t, curve) for t in out] if curve else out

    @cached_property
    def stage_times(self) -> list[StageTime]:
        """Per pipeline rank: its chunks' times added."""
        out = [StageTime(PhaseTime(), PhaseTime(), PhaseTime(), PhaseTime(), 0.0) for _ in self.stages]
        for c, t in zip(self.chunks, self.chunk_times):
            out[c.index].add(t)
        return out

    def rank_pass_times(self) -> list[tuple[float, float]]:
        """(F_r, B_r) per rank for one micro-batch through all its chunks, each pass
        with the blocking send it ends with (forward to the next stage, gradient back)."""
        out = [[0.0, 0.0] for _ in self.stages]
        times = self.chunk_times
        for k, (c, t) in enumerate(zip(self.chunks, times)):
            out[c.index][0] += t.fwd.total + t.p2p
            out[c.index][1] += t.bwd_input.total + t.bwd_weight.total + t.recompute.total + (times[k - 1].p2p if k else 0.0)
        return [(f, b) for f, b in out]

    # ---- results ---------------------------------------------------------------------
    def model_flops_per_iter(self) -> float:
        st = self.strategy
        per_mb = sum(t.fwd.flops + t.bwd.flops for t in self.stage_times)  # one rank of each stage
        return per_mb * st.micro_batch_num * st.world_size / st.pp_size

    @cached_property
    def params(self) -> ParamCount:
        """The model's parameter count: the same for every layout of one layer family, so
        counted once per family (the ops carry the shards; the sum over stages does not
        depend on how the layers are split)."""
        fam = self.layer_profiles
        if fam.param_count is None:
            groups = (g for c in self.chunks for g in c.groups())
            fam.param_count = count_params_of(self.model, self.strategy, groups)
        return fam.param_count

    def flops_6nd_with_attn(self) -> float:
        """SimuMax's convention: 6 x active params x tokens + non-causal attention over the
        q·k and value head dims (MLA: nope + rope dims, and its value dim), the input
        embedding's parameters (a lookup, no GEMM) not counted (a hybrid stack or Gated DeltaNet
        layers: the softmax attention layers' attention only); with tied embeddings the
        shared weight stays, for the LM head's GEMM. The SimuMax files' measured
        ``tflops_per_gpu`` are in this convention (tests/test_compat_files.py)."""
        m, st = self.model, self.strategy
        vocab = m.padded_vocab(st.tp_size) if m.untie_embeddings_and_output_weights else 0
        lookup = (vocab + m.position_rows(st.seq_len)) * m.hidden_size
        n_params = self.params.active - lookup
        tokens = st.global_batch_size * st.seq_len
        # (an MLA model states all three dims: ModelConfig's check)
        dims = m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim if m.attention_type == "mla" else 2 * m.head_size
        attn_layers = m.softmax_attention_layers
        attn_per_token = 6 * attn_layers * st.seq_len * m.head_num * dims
        return tokens * (6 * n_params + attn_per_token)

    def host_issue_seconds(self, stage: Stage) -> float:
        """Host seconds to issue one micro-batch of a rank's passes: its kernel launches
        (forward, backward, recomputed forward; a memory-bound chain counts its launches,
        a host wait none) x ``system.host_op_us``. The time does not include it (the GPU is
        taken as never waiting for the host); ``perf`` says when it nears the GPU time."""
        varlen = bool(self.strategy.document_groups)  # one THD kernel runs a step's packed documents
        launches = 0
        for ops, n in stage.groups():
            per = 0
            for o in ops:
                for phase in o.phase_kernels():
                    prev = None
                    for k in phase:
                        if isinstance(k, MemBound):
                            per += k.launches if k.family != HOST_SYNC else 0
                        elif not (varlen and isinstance(k, Attention) and isinstance(prev, Attention)):
                            per += 1
                        prev = k
            launches += n * per
        return launches * self.system.host_op_us * 1e-6

    def peak_flops(self) -> float:
        ops = self.system.accelerator.op
        lp = f"{fp8.recipe(self.strategy.lp_recipe).family}_matmul" if self.strategy.low_precision else ""
        name = lp if lp in ops else "matmul"
        return (ops.get(name) or ops["default"]).tflops * 1e12

    @property
    def needs_simulation(self) -> bool:
        """Overlap across passes (gradient reduce, parameter gather, EP all-to-all between
        micro-batches, deferred embedding wgrad) or DualPipeV's paired passes: cost() takes
        the whole iteration from the event simulator. Otherwise cost() walks the schedule's
        task order once for exact pass times (the same engine without events; blocking or
        async P2P), then adds the gradient sync and the optimizer step."""
        st = self.strategy
        overlap = (
            st.overlap_grad_reduce or st.overlap_param_gather or st.overlap_moe_expert_parallel_comm
            or st.defer_embedding_wgrad_compute
        )
        return overlap or st.schedule == "dualpipev"

    def pipeline_run(self, with_steady_idle: bool = False) -> PipelineRun:
        """Each rank's last pass end (and blocking-send seconds) with no overlap needing the
        simulator: the task order on the event engine without recording events.
        ``with_steady_idle``: with each rank's idle per micro-batch in the steady state
        (``PipelineRun.stall``; one more run where the full run was taken)."""
        st = self.strategy
        costs = pass_costs(self)
        opts = PipelineOptions(p2p_overlapped=st.p2p_overlapped, p2p_blocks_warmup_flush=st.p2p_blocks_warmup_flush)
        run = self.steady_pipeline(costs, opts)
        if with_steady_idle:
            run.stall = steady_idle(st, lambda m: self.profiles.orders(st, m), costs, opts, None, run)
        return run

    def steady_pipeline(self, costs: PassCosts, opts: PipelineOptions,
                        params_ready: dict[int, tuple[float, float]] | None = None) -> PipelineRun:
        """The schedule's end / busy times from its steady state (simulate/steady.py)."""
        st = self.strategy
        return steady_pipeline(st, lambda m: self.profiles.orders(st, m), costs, opts, params_ready)

    @cached_property
    def iteration(self) -> IterationRun:
        """The iteration on the event engine with every pass recorded (simulate(): the
        trace, the memory timelines)."""
        return simulate_iteration(self)

    @cached_property
    def iteration_times(self) -> IterationRun:
        """The iteration's times for cost(): the same engine, its pipeline part from the
        schedule's steady state (equal to ``iteration``'s times; no events)."""
        if "iteration" in self.__dict__:
            return self.iteration
        return simulate_iteration(self, steady=True)

    def simulate(self) -> IterationRun:
        return self.iteration

    def closed_form_ends(self) -> tuple[list[float], list[float]]:
        """(end of the last backward, end of the iteration) per rank from the 1F1B /
        interleaved closed form: sum_r (F_r + B_r) + (m - 1) max_r (F_r + B_r), fill / v
        with interleaving (Narayanan et al. 2021). Exact for equal stages or a bottleneck
        last stage; with a heavier first stage the real schedule is a little faster. For
        reports and tests; cost() uses pipeline_run()."""
        st = self.strategy
        pipe = pipeline_time(self.rank_pass_times(), st.micro_batch_num, st.interleaving_size)
        end_bwd = list(pipe.end_per_rank)
        return end_bwd, self.step_ends_after(end_bwd)[1]

    def cost(self, band: bool = True) -> CostResult:
        """The iteration's time, MFU, throughput and breakdown; ``band``: with the 80 % bands
        and the kernel-source attribution they come from (uncertainty.py), and the split of
        an interleaved schedule's idle into steady-state waits (``stage_imbalance``) and
        fill / drain (``bubble``), which a search, ranking by the point estimate only, skips
        (its breakdown counts idle past the gap between rank totals as ``bubble``)."""
        st = self.strategy
        per_stage = self.rank_pass_times()
        dp_t = [self.dp_comm_time(s) for s in self.stages]
        opt_t = [self.optimizer_time(s) for s in self.stages]
        run = None
        sent: list[float] = []
        # an interleaved schedule's steady-state idle splits the breakdown's idle (one more
        # pipeline run where the full run was taken; a search, reading no breakdown, skips it)
        split_idle = band and st.interleaving_size > 1
        stall: list[float] = []
        if not self.needs_simulation:
            pipe = self.pipeline_run(with_steady_idle=split_idle)
            end_bwd, sent = pipe.end, pipe.sent
            ready, ends = self.step_ends_after(end_bwd)
            if split_idle:
                stall = pipe.stall
        else:
            run = self.iteration_times
            end_bwd, ends, ready = run.end_of_backward, run.end, run.norm_ready
            if split_idle and run.steady_idle is not None:
                stall = run.steady_idle()
        times = self.stage_times
        rates = stage_rates(self.chunk_times, [c.index for c in self.chunks], len(self.stages), self.system.accelerator.power_curve)
        stage_costs = []
        for r, (s, t) in enumerate(zip(self.stages, times)):
            comm: dict[str, float] = {}
            for ph in (t.fwd, t.bwd, t.recompute):
                for g, x in ph.comm.items():
                    comm[g] = comm.get(g, 0.0) + x
            stage_costs.append(
                StageCost(
                    stage=r, layers=len(s.layers), fwd=t.fwd.total, bwd=t.bwd.total, recompute=t.recompute.total,
                    p2p=t.p2p, comm_exposed=comm, dp_comm=dp_t[r], optimizer=opt_t[r], end_of_backward=end_bwd[r],
                    tensor_core_rate=rates[r], host_issue=self.host_issue_seconds(s),
                )
            )
        total = max(ends)
        crit = max(range(len(ends)), key=lambda r: ends[r])
        setter = max(range(len(ready)), key=lambda r: ready[r])  # the rank the norm barrier waits for
        breakdown = critical_rank_breakdown(self, crit, per_stage, end_bwd[crit], ends[crit], ready[setter] - ready[crit], opt_t[crit], run,
                                            sent, stall[crit] if stall else None, drain=end_bwd[setter] - end_bwd[crit])
        flops = self.model_flops_per_iter()
        world = st.world_size
        tokens = st.global_batch_size * st.seq_len
        peak = self.peak_flops()
        mfu = flops / (total * world * peak)
        tput = tokens / total / world
        bands: dict[str, Any] = {}
        if band:
            u = band_share(self)
            lo, hi = TIME_BAND.interval(total, u)
            bands = dict(
                efficiency_lookups=self.kernel_sources.to_dict(), duration_time_interval=(lo, hi),
                mfu_interval=(mfu * total / hi, mfu * total / lo), throughput_interval=(tput * total / hi, tput * total / lo),
                unmeasured_share=u,
            )
        return CostResult(
            duration_time_per_iter=total,
            mfu=mfu,
            mfu_6nd_with_attn=self.flops_6nd_with_attn() / (total * world * peak),
            tflops_per_gpu=flops / (total * world) / 1e12,
            tflops_per_gpu_megatron=megatron_logged_flops(self.model, st) / (total * world) / 1e12,
            throughput_per_accelerator=tput,
            flops_per_iter=flops,
            tokens_per_iter=tokens,
            breakdown=breakdown,
            stages=stage_costs,
            **bands,
        )

    @cached_property
    def chunk_walks(self) -> dict[int, WalkResult]:
        """One micro-batch's activation walk per virtual stage."""
        return {c.vstage: self.layer_profiles.chunk_walk(self.strategy, c) for c in self.chunks}

    @cached_property
    def w_keep(self) -> dict[int, float]:
        """Per virtual stage, bytes a split backward keeps from B to W: saved inputs and
        output gradients of the ops with weight gradients (at most what the chunk stores).
        Empty when the schedule does not split the backward."""
        if self.strategy.schedule not in SPLIT_BACKWARD:
            return {}
        out = {}
        for c in self.chunks:
            need = sum(n * sum(o.saved_bytes + (o.output[1] if o.output else 0.0) for o in ops if o.bwd_weight) for ops, n in c.groups())
            out[c.vstage] = min(need, self.chunk_walks[c.vstage].stored)
        return out

    def activation_walks(self, times: IterationRun | None = None) -> list[RankActivations]:
        """Each rank's activation walk along the schedule; with ``times`` (a simulated
        iteration) also its timeline. Without, a long schedule is walked over its
        steady-state form when that gives the same peaks (simulate/steady.py)."""
        if times is None:
            counts = steady_walk_counts(self.strategy)
            if counts is not None:
                a, b = (self.profiles.schedule_walks(self.strategy, m, self.chunk_walks, self.w_keep) for m in counts)
                if a == b:  # every field of every rank's walk (no timeline without times)
                    return b
            return self.profiles.schedule_walks(self.strategy, self.strategy.micro_batch_num, self.chunk_walks, self.w_keep)
        return [walk_schedule(o, self.chunk_walks, self.w_keep, times.task_times(r)) for r, o in enumerate(times.orders)]

    def memory(self) -> MemResult:
        """Peak memory per pipeline stage: model states plus the worst moment of the
        activation walk along the schedule (memory/result.py)."""
        return memory_result(self)
