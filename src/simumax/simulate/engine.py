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
    # with p2p_overlapped: a rank's forwards before its first backward (warm-up) and its
    # backwards after its last forward (flush) still send blocking (Megatron's interleaved
    # schedule without --overlap-p2p-communication-warmup-flush)
    p2p_blocks_warmup_flush: bool = False
    pair_overlap: bool = False  # overlap_moe_expert_parallel_comm
    ep_usage: float = 0.0  # compute slowdown while EP communicates
    delay_wgrad: bool = False


@dataclass(slots=True)
class PipelineRun:
    events: list[list[Event]]  # per rank, compute and p2p events in start order (empty unless recorded)
    end: list[float]  # per rank, end of its last pass
    last_weight_pass: dict[int, tuple[float, float]]  # vstage -> (start, end) of its last weight-gradient pass
    busy: list[float] = field(default_factory=list)  # per rank, seconds its compute stream ran (blocking sends too)
    # per rank, when its compute stream ran (passes and blocking sends; ``spans`` runs only)
    spans: list[list[tuple[float, float]]] = field(default_factory=list)
    # per rank, seconds of blocking sends (in busy) when P2P overlaps but for the warm-up and
    # flush (0 when every send overlaps; not counted when every send blocks)
    sent: list[float] = field(default_factory=list)
    # per rank, seconds idle per micro-batch once the schedule repeats (runs extrapolated from
    # their steady state only: simulate/steady.py): waiting on slower stages or model chunks
    stall: list[float] = field(default_factory=list)


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
    spans: bool = False,
) -> PipelineRun:
    """Execute every rank's task list (the one copy of the dependency rules).

    A forward needs the previous virtual stage's forward of its micro-batch, a backward
    the next stage's backward (the last stage: its own forward), a split weight pass its
    own backward; each waits for its rank's compute stream. ``params_ready[vstage] =
    (first, all)``: the stage's first forward starts once its first parameter bucket is
    gathered and cannot end before the last one is. With ``record`` False no events are
    built (the estimate's path); end times, busy time and the last weight passes are the
    same. ``spans``: keep each rank's compute intervals, no events (what the compute
    beside overlapped collectives needs)."""
    n_stage = len(costs.rank)
    last = n_stage - 1
    ranks = len(orders)
    n_mb = 1 + max((t.mb for t in orders[0]), default=0)  # every rank runs every micro-batch
    rank_of = costs.rank
    dur = costs.dur
    blocking = not opts.p2p_overlapped
    # per rank, the positions whose sends overlap: [overlap_from, overlap_to)
    overlap_from, overlap_to = [0] * ranks, [len(o) for o in orders]
    if opts.p2p_overlapped and opts.p2p_blocks_warmup_flush:
        for r, order in enumerate(orders):
            kinds = [task.kind for task in order]
            first_b = kinds.index(BACKWARD) if BACKWARD in kinds else len(kinds)
            last_f = len(kinds) - 1 - kinds[::-1].index(FORWARD) if FORWARD in kinds else -1
            if last_f > first_b:  # a steady state: from its first forward (the one before the first
                # backward) to its last forward; the warm-up forwards and flush backwards block
                overlap_from[r], overlap_to[r] = first_b - 1, last_f + 1
            else:  # all in warm-up
                overlap_from[r] = overlap_to[r] = 0
    # seconds of the P2P each pass ends with (0 when the neighbour stage is on the same rank)
    send_f = [costs.p2p[k] if k < last and rank_of[k + 1] != rank_of[k] else 0.0 for k in range(n_stage)]
    send_b = [costs.p2p[k - 1] if k > 0 and rank_of[k - 1] != rank_of[k] else 0.0 for k in range(n_stage)]
    sends = {FORWARD: send_f, BACKWARD: send_b, WEIGHT: [0.0] * n_stage}  # weight passes send nothing
    ready = {kind: [[-1.0] * n_mb for _ in range(n_stage)] for kind in (FORWARD, BACKWARD, WEIGHT)}
    ready_f, ready_b = ready[FORWARD], ready[BACKWARD]
    gate = params_ready or {}
    split = any(t.kind == WEIGHT for t in orders[0])  # the schedule splits every rank's backward or none
    free = [0.0] * ranks
    busy = [0.0] * ranks
    sent = [0.0] * ranks
    pos = [0] * ranks
    events: list[list[Event]] = [[] for _ in range(ranks)]
    busy_at: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]
    last_w: dict[int, tuple[float, float]] = {}
    pairing = opts.pair_overlap
    dur_of = {kind: [dur.get((kind, k), 0.0) for k in range(n_stage)] for kind in (FORWARD, BACKWARD, WEIGHT)}

    # the dependency rules as a table: the ready times a pass waits on, by (kind, stage) —
    # a forward the previous stage's forward (none on the first), a backward the next
    # stage's backward (the last stage: its own forward), a weight pass its own backward
    started = [0.0] * n_mb
    waits_on = {
        FORWARD: [ready_f[k - 1] if k else started for k in range(n_stage)],
        BACKWARD: [ready_f[last] if k == last else ready_b[k + 1] for k in range(n_stage)],
        WEIGHT: [ready_b[k] for k in range(n_stage)],
    }

    # per (kind, stage), what the fast path reads of a pass: the ready times it waits on,
    # its seconds, the send it ends with, its own ready times, whether it is a weight pass
    recs = {
        kind: [(waits_on[kind][k], dur_of[kind][k], sends[kind][k], ready[kind][k], kind == WEIGHT or (kind == BACKWARD and not split))
               for k in range(n_stage)]
        for kind in (FORWARD, BACKWARD, WEIGHT)
    }

    def dep(kind: str, k: int, mb: int) -> float:
        """When the pass may start (< 0: not yet); a stage's first forward also waits for
        its first parameter bucket."""
        got = waits_on[kind][k][mb]
        if mb == 0 and kind == FORWARD and k in gate and got >= 0.0:
            got = max(got, gate[k][0])
        return got

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(ranks):
            order = orders[r]
            p, now, used = pos[r], free[r], busy[r]
            n = len(order)
            while p < n:
                t = order[p]
                kind, k, mb, pairable = t  # dep() inlined: this loop runs for every pass
                wait, d, secs, own, weight_pass = recs[kind][k]
                got = wait[mb]
                if got < 0.0:
                    break
                gated = mb == 0 and gate and kind == FORWARD and k in gate
                if gated:
                    got = max(got, gate[k][0])
                paired = pairing and pairable and p + 1 < n and order[p + 1].mb != mb
                if not record and not paired:
                    # one task, nothing to record: the fast path
                    start = now if now > got else got
                    end = start + d
                    if gated:
                        end = max(end, gate[k][1])
                    if weight_pass:
                        last_w[k] = (start, end)
                    if secs and (blocking or not overlap_from[r] <= p < overlap_to[r]):
                        end += secs
                        own[mb] = end
                    else:
                        own[mb] = end + secs
                    used += end - start
                    if spans:
                        busy_at[r].append((start, end))
                    now = end
                    p += 1
                    continue
                group: tuple[Task, ...] = (t, order[p + 1]) if paired else (t,)
                if len(group) == 2:
                    got2 = dep(group[1].kind, group[1].vstage, group[1].mb)
                    if got2 < 0.0:
                        break
                    got = max(got, got2)
                start = now if now > got else got
                durs = [dur[(x.kind, x.vstage)] for x in group]
                scale = 1.0
                if len(group) == 2:
                    work = durs[0] + durs[1]
                    work -= (1.0 - opts.ep_usage) * _hidden(costs, group[0], group[1], opts.delay_wgrad)
                    scale = work / (durs[0] + durs[1]) if durs[0] + durs[1] > 0 else 1.0
                t0 = start
                for x, d in zip(group, durs):
                    t1 = t0 + d * scale
                    if x.kind == FORWARD and x.mb == 0 and x.vstage in gate:
                        t1 = max(t1, gate[x.vstage][1])
                    if record:
                        events[r].append(Event(r, "compute", f"{x.kind}{x.vstage} mb{x.mb}", t0, t1, x.kind, x.vstage, x.mb))
                    if x.kind == WEIGHT or (x.kind == BACKWARD and not split):
                        last_w[x.vstage] = (t0, t1)
                    t0 = t1
                used += t0 - start
                end = t0
                for i, x in enumerate(group):  # sends after the (pair's) compute
                    secs = sends[x.kind][x.vstage]
                    if secs and (blocking or not overlap_from[r] <= p + i < overlap_to[r]):
                        if record:
                            events[r].append(Event(r, "compute", f"send {x.kind}{x.vstage} mb{x.mb}", end, end + secs, "p2p", x.vstage, x.mb))
                        end += secs
                        used += secs
                        ready[x.kind][x.vstage][x.mb] = end
                    else:
                        if secs and record:
                            events[r].append(Event(r, "comm", f"send {x.kind}{x.vstage} mb{x.mb}", end, end + secs, "p2p", x.vstage, x.mb))
                        ready[x.kind][x.vstage][x.mb] = end + secs
                if spans:
                    busy_at[r].append((start, end))
                now = end
                p += len(group)
            if p != pos[r]:
                remaining -= p - pos[r]
                pos[r], free[r], busy[r] = p, now, used
                progressed = True
        if not progressed:
            stuck = {r: order[pos[r]] for r, order in enumerate(orders) if pos[r] < len(order)}
            raise DeadlockError(f"schedule deadlocks: waiting tasks {stuck}")
    if not blocking and opts.p2p_blocks_warmup_flush:  # the warm-up and flush sends, which blocked
        for r, order in enumerate(orders):
            sent[r] = sum(sends[x.kind][x.vstage] for x in order[:overlap_from[r]] + order[overlap_to[r]:])
    return PipelineRun(events, free, last_w, busy, busy_at if spans else [], sent)
