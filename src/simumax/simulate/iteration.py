"""One training iteration on the event engine: the pipeline schedule, then (or, with
the overlap options, during) gradient sync, the optimizer step and the ZeRO-1
parameter all-gather, per pipeline rank. The step's gradient-norm all-reduce spans every
rank: no rank clips and updates before all have their norm (``Estimate.step_ends``).

Overlap model (each option off by default, as in Megatron):
- ``overlap_grad_reduce``: a chunk's buckets (dp/buckets.py) fill over its last
  weight-gradient pass — the head's after the head's backward, the layers' pro rata,
  the embedding's at the end — and reduce on the comm stream in the order they fill.
- ``overlap_param_gather``: the all-gathers run at the start of the (next) iteration
  on the comm stream, bucket by bucket in forward order (the embedding's first); a
  chunk's first forward starts after its first bucket and cannot finish before its last.
- ``defer_embedding_wgrad_compute``: the LM-head weight gradients of every micro-batch
  run after the rank's last pass.
- Communication overlapping compute slows it by ``NetworkModel.compute_usage`` (the
  tier's ``processor_usage``, or what the NCCL kernels' SMs cost, cost/nccl_sms.py) times
  the overlapped time (added to the rank's compute); for cost() the compute under it
  comes from the steady-state run (``steady_compute_spans``).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from simumax.dp.sharding_plan import ShardingPlan
from simumax.schedule import SPLIT_BACKWARD
from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT, RankOrders
from simumax.simulate.engine import Event, PassCosts, PipelineOptions, PipelineRun, run_pipeline
from simumax.simulate.steady import first_count, period, steady_idle as steady_idle_of
from simumax.simulate.ep_overlap import layer_slots

if TYPE_CHECKING:
    from simumax.config.strategy import StrategyConfig
    from simumax.dp.buckets import GradBucket
    from simumax.estimate import Estimate


@dataclass(slots=True)
class IterationRun:
    orders: RankOrders  # empty for the steady-state times (no events)
    events: list[list[Event]]  # per rank, compute and comm
    end_of_backward: list[float]  # per rank: its last pipeline pass ends
    end: list[float]  # per rank: optimizer step (and blocking parameter gathers) done
    busy: list[float]  # per rank: seconds of pipeline passes (the rest until end_of_backward is bubble)
    norm_ready: list[float]  # per rank: ready for the step's gradient-norm all-reduce
    sent: list[float]  # per rank: seconds of blocking P2P sends (within busy)
    # per rank, seconds idle per micro-batch in the schedule's steady state (waiting on slower
    # stages or model chunks), found on demand: it may take one more pipeline run
    steady_idle: Callable[[], list[float]] | None = None

    @property
    def total(self) -> float:
        return max(self.end)

    def task_times(self, rank: int) -> dict[tuple[str, int, int], tuple[float, float]]:
        """(kind, vstage, micro-batch) -> (start, end) of each pass on the rank."""
        return {
            (e.kind, e.vstage, e.mb): (e.start, e.end)
            for e in self.events[rank] if e.stream == "compute" and e.kind in (FORWARD, BACKWARD, WEIGHT)
        }


def lm_head_wgrad(est: "Estimate") -> float:
    """Seconds of the LM head's weight-gradient GEMMs for one micro-batch."""
    t = est.chunk_times[-1]
    return sum(ph["bwd_weight"].total for o, ph in t.op_times if o.name == "lm_head")


def bucket_readiness(est: "Estimate", k: int, head_wgrad: float) -> tuple[list[tuple[float, GradBucket]], list[GradBucket]]:
    """Chunk ``k``'s gradient buckets, each with the share of its last weight-gradient pass
    done when its last gradient is ready, in that order (-1: the LM head's weight
    gradients deferred past the pass, ready at its end; ``head_wgrad``: their seconds per
    micro-batch, ``lm_head_wgrad``, 0 when not deferred); and the buckets in the order the
    forward needs their parameters (the reverse of the fill)."""
    chunk = est.chunks[k]
    buckets = est.grad_buckets(chunk)
    st = est.strategy
    if not (st.overlap_grad_reduce or st.overlap_param_gather):
        # every reduce waits for the pass's end, every gather runs before the next
        # iteration: when each bucket fills is moot
        return [(1.0, b) for b in buckets], buckets
    t = est.chunk_times[k]
    split = st.schedule in SPLIT_BACKWARD
    passes = ("bwd_weight",) if split else ("recompute", "bwd_input", "bwd_weight")
    pre, post = t.ends()
    total = sum(getattr(t, ph).total for ph in passes)
    head = sum(d[ph].total for d in post for ph in passes)
    embedding = sum(d[ph].total for d in pre for ph in passes)
    deferred = k == len(est.chunks) - 1 and st.defer_embedding_wgrad_compute
    if deferred:
        total, head = total - head_wgrad, head - head_wgrad
    hs, ls = (head / total, (total - head - embedding) / total) if total > 0 else (0.0, 1.0)
    dense, expert = est.param_orders(chunk)
    out = []
    groups = 0
    for group, order in (("dp", dense), ("edp", expert)):
        mine = [b for b in buckets if b.group == group]
        if not mine:
            continue
        groups += 1
        out.extend(zip(order.ready_all([b.position for b in mine], hs, ls), mine))
    if groups > 1:  # one group's buckets fill in order already
        out.sort(key=lambda fb: fb[0])
    forward = [b for _, b in reversed(out)]
    if deferred and dense.head > 0:
        # the dense group's first bucket fills from the head: it waits for the deferred pass
        first = next((i for i, (_, b) in enumerate(out) if b.group == "dp"), None)
        if first is not None:
            out.append((-1.0, out.pop(first)[1]))
    return out, forward


def pass_costs(est: "Estimate") -> PassCosts:
    st = est.strategy
    split = st.schedule in SPLIT_BACKWARD
    last = len(est.chunks) - 1
    deferred = lm_head_wgrad(est) if st.defer_embedding_wgrad_compute else 0.0
    c = PassCosts(rank=[ch.index for ch in est.chunks], dur={}, p2p=[t.p2p for t in est.chunk_times])
    for k, t in enumerate(est.chunk_times):
        w = t.bwd_weight.total - (deferred if k == last else 0.0)
        c.dur[(FORWARD, k)] = t.fwd.total
        c.dur[(BACKWARD, k)] = t.recompute.total + t.bwd_input.total + (0.0 if split else w)
        if split:
            c.dur[(WEIGHT, k)] = w
        if st.overlap_moe_expert_parallel_comm:
            c.moe_slots[(FORWARD, k)] = layer_slots(t.op_times, ("fwd",))
            c.moe_slots[(BACKWARD, k)] = layer_slots(t.op_times, ("recompute", "bwd_input", "bwd_weight"))
    return c


class ComputeSpans:
    """A rank's compute intervals (sorted, disjoint) and their running sums, so the
    compute time under one communication interval is two bisections, not a scan."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.starts = [a for a, _ in spans]
        self.ends = [b for _, b in spans]
        self.cum = [0.0]
        for a, b in spans:
            self.cum.append(self.cum[-1] + (b - a))

    def _covered(self, x: float) -> float:
        """Compute seconds before time x."""
        i = bisect_right(self.starts, x)  # spans starting at or before x
        if i == 0:
            return 0.0
        return self.cum[i - 1] + min(x, self.ends[i - 1]) - self.starts[i - 1]

    def overlap(self, lo: float, hi: float) -> float:
        return max(0.0, self._covered(hi) - self._covered(lo)) if hi > lo else 0.0


def simulate_iteration(est: "Estimate", steady: bool = False) -> IterationRun:
    """The iteration per pipeline rank. ``steady``: the pipeline's times from its steady
    state (simulate/steady.py) and no events, for cost(); communication that slows
    compute (a tier's ``processor_usage``) needs the passes' intervals, so then every
    pass is run."""
    st = est.strategy
    pipelined = ShardingPlan.of(st).pipelined  # FSDP2 under torch pipelining: reduced after the last backward
    net = est.network
    orders: RankOrders = []  # the full task order: only when every pass is run
    ranks = st.pp_size
    chunks_of = [[c for c in est.chunks if c.index == r] for r in range(ranks)]
    head_wgrad = lm_head_wgrad(est) if st.defer_embedding_wgrad_compute else 0.0
    # per chunk, its buckets in the order they fill, with when in the pass each is ready
    filled, forward = {}, {}
    for k, c in enumerate(est.chunks):
        filled[c.vstage], forward[c.vstage] = bucket_readiness(est, k, head_wgrad)
    usage = {(g, kind): net.compute_usage(g, kind) for g in ("dp", "edp") for kind in ("gather", "reduce")}
    slowed = any(usage.values())
    comm: list[list[Event]] = [[] for _ in range(ranks)]
    gathered: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]  # parameter gathers' intervals
    comm_free = [0.0] * ranks
    # cost() reads only times: the steady-state run records no events (a 405B job has
    # thousands of DDP buckets), the full run records every one
    record = not steady

    def gather_params(r: int, vstage: int, start: float) -> list[float]:
        """ZeRO-1 parameter all-gathers of one chunk, back to back on the comm stream
        from ``start``; returns when each bucket is gathered."""
        done = []
        for b in forward[vstage]:
            if b.gather:
                if start + b.gather > 0:  # (a gather run in the previous step: not this iteration's)
                    gathered[r].append((max(start, 0.0), start + b.gather))
                    if record:
                        comm[r].append(Event(r, "comm", f"{b.group} all_gather params", max(start, 0.0),
                                             start + b.gather, "param_gather", vstage))
                start += b.gather
                done.append(start)
        return done

    gate: dict[int, tuple[float, float]] = {}
    if st.overlap_param_gather:
        for r in range(ranks):
            for i, c in enumerate(chunks_of[r]):
                start = comm_free[r]
                if i == 0 and st.overlap_param_gather_with_optimizer_step:
                    # Megatron's ChainedOptimizer steps the first chunk first and dispatches its
                    # gathers (start_param_sync) before the other chunks step: they ran during
                    # the previous iteration's step of the rank's other chunks
                    start -= _later_chunks_step(est, r, chunks_of[r])
                done = gather_params(r, c.vstage, start)
                if done:
                    gate[c.vstage] = (done[0], done[-1])
                    comm_free[r] = max(done[-1], 0.0)
    opts = PipelineOptions(
        p2p_overlapped=st.p2p_overlapped, p2p_blocks_warmup_flush=st.p2p_blocks_warmup_flush,
        pair_overlap=st.overlap_moe_expert_parallel_comm,
        ep_usage=net.compute_usage("ep"),
        delay_wgrad=st.delay_wgrad_compute,
    )
    costs = pass_costs(est)
    if not record and slowed and _steady_count(st) >= st.micro_batch_num:
        # communication slows the compute and the steady state would be run at the real count
        # anyway: one full run keeping its compute intervals (no events)
        run = run_pipeline(est.profiles.orders(st), costs, opts, gate, record=False, spans=True)
        spans = run.spans
    elif not record:
        run = est.steady_pipeline(costs, opts, gate)
        spans = steady_compute_spans(est, run, costs, opts, gate) if slowed else None
    else:
        orders = est.profiles.orders(st)
        run = run_pipeline(orders, costs, opts, gate)
        spans = None
    # the same steady state however the times were run; the closure keeps no reference to
    # the estimate (which keeps this run: a cycle only the cyclic collector would free)
    profiles, idle_run = est.profiles, run

    def steady_idle() -> list[float]:
        return steady_idle_of(st, lambda k: profiles.orders(st, k), costs, opts, gate, idle_run)
    deferred = head_wgrad * st.micro_batch_num
    events, end_bwd, end, busy = [], [], [], []
    grads_done: list[float] = []
    all_events: list[list[Event]] = []
    for r in range(ranks):
        evs = run.events[r]
        compute_end = run.end[r]
        if deferred and r == est.chunks[-1].index:
            evs.append(Event(r, "compute", "lm_head wgrad (deferred)", compute_end, compute_end + deferred, "wgrad"))
            compute_end += deferred
        busy.append(run.busy[r] + (compute_end - run.end[r]))
        slow = 0.0
        compute = None
        if slowed:
            if spans is None:  # the recorded run (the deferred LM-head pass among its events)
                busy_at = [(e.start, e.end) for e in evs if e.stream == "compute"]
            else:
                busy_at = spans[r] + ([(run.end[r], compute_end)] if compute_end > run.end[r] else [])
            compute = ComputeSpans(busy_at)
        for lo, hi in gathered[r]:  # gathers at the start
            if compute is not None:
                slow += usage[("dp", "gather")] * compute.overlap(lo, hi)
        last_pass = {c.vstage: run.last_weight_pass[c.vstage] for c in chunks_of[r]}
        for c in sorted(chunks_of[r], key=lambda c: last_pass[c.vstage][1]):
            w_start, w_end = last_pass[c.vstage]
            for frac, b in filled[c.vstage]:
                if not b.reduce:  # ZeRO-2/3: reduced inside every backward
                    continue
                if not st.overlap_grad_reduce or frac < 0 or pipelined:
                    ready = compute_end
                else:
                    ready = w_start + frac * (w_end - w_start)
                s = max(ready, comm_free[r])
                comm_free[r] = s + b.reduce
                if record:
                    red = "reduce_scatter" if st.zero_state >= 1 else "all_reduce"
                    comm[r].append(Event(r, "comm", f"{b.group} {red} grads", s, comm_free[r], "grad_sync", c.vstage))
                if compute is not None:
                    slow += usage[(b.group, "reduce")] * compute.overlap(s, comm_free[r])
        tied = est.embedding_grad_sync[r]
        if tied:  # after every DP reduce of the rank (finalize_model_grads' order)
            s = max(compute_end, comm_free[r])
            comm_free[r] = s + tied
            if record:
                comm[r].append(Event(r, "comm", "pp all_reduce tied embedding grads", s, comm_free[r], "grad_sync"))
        grads_done.append(max(compute_end + slow, comm_free[r]))
        all_events.append(evs)
        end_bwd.append(compute_end)
    # the gradient-norm all-reduce over every rank is a barrier inside the step
    passes = est.optimizer_passes
    norm_ready, _ = est.step_ends(grads_done)
    barrier = max(norm_ready)
    for r in range(ranks):
        before, after = passes[r]
        evs = all_events[r]
        t = barrier + after
        if not st.overlap_param_gather:
            for c in chunks_of[r]:
                t = (gather_params(r, c.vstage, t) or [t])[-1]
        if record:
            evs.append(Event(r, "compute", "optimizer step (to grad norm)", grads_done[r], grads_done[r] + before, "optimizer"))
            evs.append(Event(r, "compute", "optimizer step", barrier, barrier + after, "optimizer"))
            evs = sorted(evs + comm[r], key=lambda e: (e.start, e.stream))
        events.append(evs)
        end.append(t)
    return IterationRun(orders, events, end_bwd, end, busy, norm_ready, run.sent, steady_idle)


def _steady_count(st: "StrategyConfig") -> int:
    """The shortest micro-batch count simulate/steady.py runs the schedule at (the real
    count where it has no period)."""
    g = period(st)
    return first_count(st, g) if g else st.micro_batch_num


def steady_compute_spans(est: "Estimate", run: "PipelineRun", costs: PassCosts, opts: PipelineOptions,
                         gate: dict[int, tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """Each rank's compute intervals for the steady-state times, without running every
    micro-batch: the overlapped parameter gathers fall in the pipeline's first passes and
    the gradient reduces in its last, which a run of the schedule's shortest steady count
    m0 (simulate/steady.py) holds as they are — its first half as is, its second half
    shifted to the real count's end (past the warm-up every pass moves by the same step
    per period); the periods between are taken as busy."""
    st = est.strategy
    short = run_pipeline(est.profiles.orders(st, min(_steady_count(st), st.micro_batch_num)), costs, opts, gate,
                         record=False, spans=True)
    out = []
    for r, busy_at in enumerate(short.spans):
        shift = run.end[r] - short.end[r]
        cut = short.end[r] / 2
        spans: list[tuple[float, float]] = []
        for a, b in busy_at:
            if b <= cut or shift <= 0:
                spans.append((a, b))
            elif a >= cut:
                spans.append((a + shift, b + shift))
            else:
                spans += [(a, cut), (cut + shift, b + shift)]
        if shift > 0:
            spans.append((cut, cut + shift))
        spans.sort()
        merged: list[tuple[float, float]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        out.append(merged)
    return out


def _later_chunks_step(est: "Estimate", rank: int, chunks: list) -> float:
    """The part of a rank's step after the gradient norm that its chunks after the first
    take (the step's passes are proportional to the parameters stepped)."""
    params = sum(c.params for c in chunks)
    return est.optimizer_passes[rank][1] * (params - chunks[0].params) / params if params else 0.0
