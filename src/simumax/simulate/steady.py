"""A pipeline schedule's steady state, extrapolated: the estimate costs the same at 8 or
8,000 micro-batches.

Every schedule here repeats a period once its warm-up is over: 1F1B and ZB-H1 one
micro-batch (one forward and one backward per rank), interleaved 1F1B one micro-batch
group (``microbatch_group_size_per_vp_stage``, default pp) through every model chunk. With
fixed pass costs the engine is a max-plus system, so past the warm-up each extra period
delays every later pass by the same amount. The estimate runs the schedule at three
micro-batch counts m0, m0 + g, m0 + 2g (same remainder modulo the period g as the real
count m, so warm-up and cool-down are the real ones; m0 at least one warm-up,
max(pp, g)) and takes what it needs — each rank's end and busy time, each chunk's last
weight-gradient pass — as x(m0) + (m - m0) / g * (x(m0 + g) - x(m0)), after checking
that the three runs lie on one line (equal steps within 1e-9 of the iteration) and that no
rank's work per period exceeds the period (a rank still using warm-up idle time to keep up
looks periodic but takes over later: PP4 with a first stage one layer heavier kept a
1.60 ms step up to 10 micro-batches, then 1.81 ms). A per-micro-batch schedule may also
repeat over several micro-batches (cyclicity > 1: async P2P on MoE stages stepped a, b, ..., b
every pp - 1), so for 1F1B and ZB a fourth run 2 pp + 1 micro-batches on must fall on the
same line, else the full run is taken. Where the runs are not on one line (a warm-up longer
than m0, a schedule without a period), m0 doubles; when the short runs would cost as much
as the real count, the full run is taken.
``simulate()`` always runs every micro-batch: it draws the trace.
"""

from __future__ import annotations

import logging
from typing import Callable

from simumax.config.strategy import StrategyConfig
from simumax.schedule import most_warmup_forwards
from simumax.schedule.tasks import RankOrders
from simumax.simulate.engine import PassCosts, PipelineOptions, PipelineRun, run_pipeline

log = logging.getLogger(__name__)

REL_TOL = 1e-9  # runs "on one line": equal steps within this share of the time
POINTS = 3  # runs one period apart; two equal steps before extrapolating
# What a run costs besides its passes (the engine's set-up, the order, the line check), in
# passes' worth: ~15 us against ~0.5 us per pass on CPython 3.11 (the engine and order
# timings in docs/search.md). A speed choice only: both paths give the same result.
RUN_OVERHEAD_PASSES = 30


def period(st: StrategyConfig) -> int | None:
    """Micro-batches per steady-state period of the strategy's schedule (None: not periodic
    in a form extrapolated here)."""
    if st.schedule == "interleaved":
        return st.microbatch_group_size_per_vp_stage or st.pp_size
    if st.schedule in ("1f1b", "zb"):
        return 1
    return None


def first_count(st: StrategyConfig, g: int) -> int:
    """The smallest micro-batch count m0 tried: a 1F1B warm-up's worth (pp; interleaved:
    one full group), with the real count's remainder modulo the period."""
    m = st.micro_batch_num
    rest = m % g
    if st.schedule == "interleaved" and 0 < rest < st.pp_size:  # outside Megatron's rule for the last group
        return m  # (no shorter form: the full run)
    # one warm-up's worth. With unequal stages the pipeline may still be settling there
    # (a 1F1B MoE case on pp 4 looked periodic at pp micro-batches, 0.08 % off): the
    # settled check (_steady_line) refuses such runs and m0 doubles. Session 13 started
    # at two warm-ups, before that check; the random invariants hold exactly from one.
    least = max(st.pp_size, g)
    if st.p2p_blocks_warmup_flush:
        # its sends block in the warm-up and flush: every rank needs a steady state (two
        # forwards past its first backward, of its v·m) for the pattern to hold from m0 on
        least = max(least, -(-(most_warmup_forwards(st) + 2) // st.interleaving_size))
    return rest + g * max(1, -(-(least - rest) // g))


def _vector(run: PipelineRun) -> list[float]:
    out = list(run.end) + list(run.busy) + list(run.sent)
    for k in sorted(run.last_weight_pass):
        out += run.last_weight_pass[k]
    return out


def _from_vector(x: list[float], ranks: int, vstages: list[int]) -> PipelineRun:
    end, busy, sent = x[:ranks], x[ranks:2 * ranks], x[2 * ranks:3 * ranks]
    rest = x[3 * ranks:]
    last_w = {k: (rest[2 * i], rest[2 * i + 1]) for i, k in enumerate(vstages)}
    return PipelineRun([[] for _ in range(ranks)], end, last_w, busy, sent=sent)


def steady_pipeline(
    st: StrategyConfig,
    orders_for: Callable[[int], RankOrders],
    costs: PassCosts,
    opts: PipelineOptions,
    params_ready: dict[int, tuple[float, float]] | None = None,
) -> PipelineRun:
    """The pipeline's end and busy time per rank and each chunk's last weight-gradient
    pass, as run_pipeline(record=False) gives for ``st.micro_batch_num`` micro-batches,
    from three short runs when the schedule is periodic there (else the full run); the
    short runs also give each rank's steady-state idle (``PipelineRun.stall``)."""
    m = st.micro_batch_num
    g = period(st)
    m0 = first_count(st, g) if g else m
    ranks = st.pp_size
    while g:
        plan, check = _plan(st, m0, g)
        if not _shorter(st, plan, check):
            break  # the full run is cheaper
        # the longest first: the shorter orders are cut from it (ProfileCache.orders)
        by_count = {k: run_pipeline(orders_for(k), costs, opts, params_ready, record=False) for k in sorted(plan, reverse=True)}
        runs = [by_count[k] for k in plan]
        line = _steady_line([_vector(r) for r in runs], ranks)
        if line is not None and check is not None:
            # a per-micro-batch schedule may repeat over several micro-batches (async P2P
            # on MoE stages: steps a, b, b, ..., b every pp - 1): three equal steps in a row
            # are not enough; a run 2 pp + 1 micro-batches on must lie on the same line
            far = _vector(run_pipeline(orders_for(check), costs, opts, params_ready, record=False))
            guess = _at(line, (check - m0) / g)
            scale = max(max(abs(v) for v in far), 1e-30)
            if len(guess) != len(far) or any(abs(a - b) > REL_TOL * scale for a, b in zip(guess, far)):
                log.debug("steps repeat over several micro-batches at %d (period %d): full run", m0, g)
                break
        if line is not None:
            run = _from_vector(_at(line, (m - m0) / g), ranks, sorted(runs[0].last_weight_pass))
            run.stall = _idle_per_micro_batch(line[1], ranks, g)
            return run
        log.debug("no steady state at %d micro-batches (period %d); trying %d", m0, g, 2 * m0)
        m0 = m0 + g * max(1, m0 // g)  # double
    return run_pipeline(orders_for(m), costs, opts, params_ready, record=False)


def steady_idle(st: StrategyConfig, orders_for: Callable[[int], RankOrders], costs: PassCosts, opts: PipelineOptions,
                params_ready: dict[int, tuple[float, float]] | None, run: PipelineRun) -> list[float]:
    """Each rank's idle per micro-batch once the schedule repeats (waiting on slower stages
    or model chunks in every period): from the steady-state runs where ``run`` came from
    them, else from one more run a period longer than ``run`` (the full run of the same
    costs); none for a schedule without a period."""
    g = period(st)
    if run.stall or not g:
        return run.stall
    longer = run_pipeline(orders_for(st.micro_batch_num + g), costs, opts, params_ready, record=False)
    return _idle_per_micro_batch([b - a for a, b in zip(_vector(run), _vector(longer))], st.pp_size, g)


def _idle_per_micro_batch(step: list[float], ranks: int, g: int) -> list[float]:
    """Each rank's idle per micro-batch from one period's step of the run vector: its end
    moves by the period, its busy time by its work."""
    return [max(0.0, step[r] - step[ranks + r]) / g for r in range(ranks)]


def _shorter(st: StrategyConfig, plan: list[int], check: int | None) -> bool:
    """Whether the short runs cost less than one run of the real count, each run paying
    its passes and a fixed overhead."""
    per_mb = st.pp_size * st.interleaving_size * (3 if st.schedule == "zb" else 2)  # passes per micro-batch
    runs = len(plan) + (check is not None)
    short = (sum(plan) + (check or 0)) * per_mb + runs * RUN_OVERHEAD_PASSES
    return short < st.micro_batch_num * per_mb + RUN_OVERHEAD_PASSES


def _plan(st: StrategyConfig, m0: int, g: int) -> tuple[list[int], int | None]:
    """The short runs from ``m0`` (one period apart) and, for a per-micro-batch period, the
    far check run."""
    return [m0 + i * g for i in range(POINTS)], (m0 + (2 * st.pp_size + 1) * g if g == 1 else None)


def _steady_line(xs: list[list[float]], ranks: int) -> tuple[list[float], list[float]] | None:
    """(first run, step per period) of runs one period apart, when they lie on one line
    and no rank works more per period than the period; else None."""
    if len({len(x) for x in xs}) != 1:
        return None
    scale = max(max(abs(v) for v in xs[-1]), 1e-30)
    steps = [[b - a for a, b in zip(x0, x1)] for x0, x1 in zip(xs, xs[1:])]
    linear = all(abs(d1 - d0) <= REL_TOL * scale for s0, s1 in zip(steps, steps[1:]) for d0, d1 in zip(s0, s1))
    # in the periodic regime no rank works more per period than the period itself; a rank
    # whose work per period exceeds the ends' step still has warm-up idle time absorbing it
    # and becomes the bottleneck later
    settled = max(steps[-1][ranks:2 * ranks]) <= min(steps[-1][:ranks]) + REL_TOL * scale
    if not (linear and settled):
        return None
    return xs[0], steps[0]


def _at(line: tuple[list[float], list[float]], periods: float) -> list[float]:
    """The line ``periods`` periods past its first run."""
    first, step = line
    return [a + periods * d for a, d in zip(first, step)]


def steady_walk_counts(st: StrategyConfig) -> tuple[int, int] | None:
    """Two micro-batch counts, one period apart, whose schedules contain the real one's
    warm-up, a steady period and its cool-down: the activation walk's peak over the full
    schedule is the peak over these when the two agree (memory/schedule_walk.py; the
    steady part repeats the same levels). None: walk the real schedule."""
    g = period(st)
    if not g:
        return None
    m0 = first_count(st, g)
    plan, check = _plan(st, m0, g)
    # only where the pipeline runs these counts too (their task orders are then made once);
    # where it runs the real count, walking that order is cheaper than making two more
    return (plan[1], plan[2]) if _shorter(st, plan, check) else None
