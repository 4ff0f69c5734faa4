"""One event engine: per rank a compute stream and a communication stream.

A pass starts when its rank's compute stream is free and its inputs have arrived:
the previous virtual stage's forward (or the next one's backward) of the same
micro-batch, plus the P2P transfer when that stage lives on another rank. Blocking
P2P (Megatron's default) keeps the sender's compute stream busy for the transfer;
with ``overlap_p2p_comm`` the transfer runs on the communication stream and only
delays the receiver. DP/TP/CP/EP peers of a rank run the same timeline, so a
collective over those groups is a barrier among identical ranks and costs its own
time; only the pipeline ranks of one replica are simulated.

Pass costs come from the same per-op costs as the closed form (cost/stage_time), so
with every overlap off the two agree (tests hold them within 0.5 %).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT, RankOrders, Task
from simumax.simulate.ep_overlap import MoeSlots, hidden_all_to_all


@dataclass(frozen=True, slots=True)
class Event:
    rank: int
    stream: str  # "compute" or "comm"
    name: str  # e.g. "F3 mb5" or "dp reduce_scatter"
    start: float
    end: float
    kind: str = ""  # F, B, W, p2p, grad_sync, optimizer, param_gather, wgrad
    vstage: int = -1
    mb: int = -1


@dataclass(slots=True)
class PassCosts:
    """Per virtual stage: seconds of each pass on the compute stream (exposed in-pass
    communication included), the MoE sub-module times EP pairing overlaps, and the P2P
    send to the next stage."""

    rank: list[int]  # rank of each virtual stage
    dur: dict[tuple[str, int], float]  # (kind, vstage) -> seconds
    # (kind, vstage) -> per MoE layer, in forward order, the sub-module times Megatron's
    # paired 1F1B schedule overlaps (simulate/ep_overlap.py)
    moe_slots: dict[tuple[str, int], list[MoeSlots]] = field(default_factory=dict)
    p2p: list[float] = field(default_factory=list)  # vstage k -> k+1 (same bytes backward)


@dataclass(frozen=True, slots=True)
class PipelineOptions:
    p2p_overlapped: bool = False
    pair_overlap: bool = False  # overlap_moe_expert_parallel_comm
    ep_usage: float = 0.0  # compute slowdown while EP communicates
    delay_wgrad: bool = False


@dataclass(slots=True)
class PipelineRun:
    events: list[list[Event]]  # per rank, compute and p2p events in start order
    end: list[float]  # per rank, end of its last pass
    last_weight_pass: dict[int, Event]  # vstage -> the last pass producing its weight gradients


class DeadlockError(RuntimeError):
    pass


def _hidden(c: PassCosts, f: Task, b: Task, delay_wgrad: bool) -> float:
    """EP all-to-all hidden when a forward and a backward run paired (ep_overlap.hidden)."""
    return hidden_all_to_all(c.moe_slots.get((FORWARD, f.vstage), []), c.moe_slots.get((BACKWARD, b.vstage), []), delay_wgrad)


def run_pipeline(
    orders: RankOrders,
    costs: PassCosts,
    opts: PipelineOptions,
    params_ready: dict[int, tuple[float, float]] | None = None,
    record: bool = True,
) -> PipelineRun:
    """Execute every rank's task list. ``params_ready[vstage] = (first, all)``: the
    stage's first forward starts once its first parameter bucket is gathered and
    cannot end before the last one is (parameters still being gathered). With
    ``record`` False only the end times are kept (the estimate's fast path)."""
    if not record and not opts.pair_overlap and not params_ready:
        return PipelineRun([[] for _ in orders], _pass_ends(orders, costs, opts.p2p_overlapped), {})
    n_stage = len(costs.rank)
    last = n_stage - 1
    ranks = len(orders)
    ready: dict[tuple[str, int, int], float] = {}  # output of (kind, vstage, mb) usable by its consumer
    free = [0.0] * ranks
    pos = [0] * ranks
    events: list[list[Event]] = [[] for _ in range(ranks)]
    last_w: dict[int, Event] = {}
    gate = params_ready or {}
    split = any(t.kind == WEIGHT for o in orders for t in o)

    def dep(t: Task) -> float | None:
        if t.kind == FORWARD:
            got = 0.0 if t.vstage == 0 else ready.get((FORWARD, t.vstage - 1, t.mb))
            if got is not None and t.mb == 0 and t.vstage in gate:
                got = max(got, gate[t.vstage][0])
            return got
        if t.kind == BACKWARD:
            src = (FORWARD, last, t.mb) if t.vstage == last else (BACKWARD, t.vstage + 1, t.mb)
            return ready.get(src)
        return ready.get((BACKWARD, t.vstage, t.mb))

    def send(t: Task) -> tuple[float, int]:
        """(seconds, destination rank) of the P2P this pass ends with, if any."""
        if t.kind == FORWARD and t.vstage < last:
            dst = costs.rank[t.vstage + 1]
            return (costs.p2p[t.vstage], dst) if dst != costs.rank[t.vstage] else (0.0, dst)
        if t.kind == BACKWARD and t.vstage > 0:
            dst = costs.rank[t.vstage - 1]
            return (costs.p2p[t.vstage - 1], dst) if dst != costs.rank[t.vstage] else (0.0, dst)
        return 0.0, -1

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(ranks):
            order = orders[r]
            while pos[r] < len(order):
                t = order[pos[r]]
                group = [t]
                nxt = order[pos[r] + 1] if pos[r] + 1 < len(order) else None
                if opts.pair_overlap and t.paired and nxt is not None and nxt.mb != t.mb:
                    group.append(nxt)
                deps = [dep(x) for x in group]
                if any(d is None for d in deps):
                    break
                start = max([free[r]] + deps)  # type: ignore[arg-type]
                durs = [costs.dur[(x.kind, x.vstage)] for x in group]
                work = sum(durs)
                if len(group) == 2:
                    work -= (1.0 - opts.ep_usage) * _hidden(costs, group[0], group[1], opts.delay_wgrad)
                scale = work / sum(durs) if sum(durs) > 0 else 1.0
                t0 = start
                for x, d in zip(group, durs):
                    t1 = t0 + d * scale
                    if x.kind == FORWARD and x.mb == 0 and x.vstage in gate:
                        t1 = max(t1, gate[x.vstage][1])
                    if record:
                        ev = Event(r, "compute", f"{x.kind}{x.vstage} mb{x.mb}", t0, t1, x.kind, x.vstage, x.mb)
                        events[r].append(ev)
                        if x.kind == WEIGHT or (x.kind == BACKWARD and not split):
                            last_w[x.vstage] = ev
                    t0 = t1
                end = t0
                for x in group:  # sends after the pair's compute
                    secs, dst = send(x)
                    if dst < 0:
                        ready[(x.kind, x.vstage, x.mb)] = end
                        continue
                    if secs and not opts.p2p_overlapped:
                        if record:
                            events[r].append(Event(r, "compute", f"send {x.kind}{x.vstage} mb{x.mb}", end, end + secs, "p2p", x.vstage, x.mb))
                        end += secs
                        ready[(x.kind, x.vstage, x.mb)] = end
                    else:
                        if secs and record:
                            events[r].append(Event(r, "comm", f"send {x.kind}{x.vstage} mb{x.mb}", end, end + secs, "p2p", x.vstage, x.mb))
                        ready[(x.kind, x.vstage, x.mb)] = end + secs
                free[r] = end
                pos[r] += len(group)
                remaining -= len(group)
                progressed = True
        if not progressed:
            stuck = {r: order[pos[r]] for r, order in enumerate(orders) if pos[r] < len(order)}
            raise DeadlockError(f"schedule deadlocks: waiting tasks {stuck}")
    return PipelineRun(events, free, last_w)


def _pass_ends(orders: RankOrders, costs: PassCosts, p2p_overlapped: bool) -> list[float]:
    """run_pipeline's timing without events, pairing or parameter gates (the estimate's
    hot path in a search): each rank's end of its last pass. Same rules; the tests hold
    the two equal."""
    last = len(costs.rank) - 1
    n_mb = 1 + max((t.mb for o in orders for t in o), default=0)
    # per (kind, vstage): compute-stream time (with a blocking send) and extra arrival delay
    busy: dict[tuple[str, int], float] = {}
    delay: dict[tuple[str, int], float] = {}
    for (kind, k), d in costs.dur.items():
        secs = 0.0
        if kind == FORWARD and k < last and costs.rank[k + 1] != costs.rank[k]:
            secs = costs.p2p[k]
        elif kind == BACKWARD and k > 0 and costs.rank[k - 1] != costs.rank[k]:
            secs = costs.p2p[k - 1]
        busy[(kind, k)] = d if p2p_overlapped else d + secs
        delay[(kind, k)] = secs if p2p_overlapped else 0.0
    ready = {kind: [[-1.0] * n_mb for _ in costs.rank] for kind in (FORWARD, BACKWARD, WEIGHT)}
    free = [0.0] * len(orders)
    pos = [0] * len(orders)
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r, order in enumerate(orders):
            p, now = pos[r], free[r]
            while p < len(order):
                t = order[p]
                k, mb = t.vstage, t.mb
                if t.kind == FORWARD:
                    got = ready[FORWARD][k - 1][mb] if k else 0.0
                elif t.kind == BACKWARD:
                    got = ready[FORWARD][last][mb] if k == last else ready[BACKWARD][k + 1][mb]
                else:
                    got = ready[BACKWARD][k][mb]
                if got < 0.0:
                    break
                now = max(now, got) + busy[(t.kind, k)]
                ready[t.kind][k][mb] = now + delay[(t.kind, k)]
                p += 1
            if p != pos[r]:
                remaining -= p - pos[r]
                pos[r], free[r] = p, now
                progressed = True
        if not progressed:
            stuck = {r: order[pos[r]] for r, order in enumerate(orders) if pos[r] < len(order)}
            raise DeadlockError(f"schedule deadlocks: waiting tasks {stuck}")
    return free
