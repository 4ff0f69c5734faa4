"""Where the critical rank's iteration went: parts that add up to its end exactly."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simumax.simulate.ep_overlap import EP_GROUPS

if TYPE_CHECKING:
    from simumax.estimate import Estimate
    from simumax.simulate.iteration import IterationRun

# a difference this small relative to the sums compared is rounding (the engine and these
# parts add the same passes in other orders), not time
ROUNDING = 1e-12

CP_LEVELS = {"cp_a2a": "cp", "cp_p2p": "cp"}  # network groups that report as the CP part of the breakdown


def critical_rank_breakdown(est: "Estimate", crit: int, per_stage: list[tuple[float, float]], end_bwd: float, end: float,
                            wait: float, optimizer: float, run: "IterationRun | None",
                            sent: list[float] | None = None, stall: float | None = None, drain: float = 0.0) -> dict[str, float]:
    """Where the critical rank's iteration goes, in parts that add up to its end exactly.

    Until its last pass ends: compute (fwd, bwd, recompute) and the communication exposed
    inside passes (per group) and blocking P2P sends, as the rank ran them (with the
    event simulator, what EP pairing hid comes off ``ep_comm``, and waiting for ZeRO
    parameter gathers inside the first forward counts as ``dp_comm``); the rest of that
    span is idle: ``stage_imbalance`` (waiting on a slower stage, up to the gap between
    the busiest stage and this one) and ``bubble`` (fill and drain). After it: gradient
    reduce and parameter gathers not hidden (``dp_comm``), the step (``optimizer``) and
    the wait at its all-rank gradient-norm barrier: as long as the rank the barrier waits for
    was still running passes (``drain``: how much later its passes ended), the pipeline's
    drain, counted in ``bubble``; the rest — that rank's longer gradient reduce or pre-norm
    step — ``optimizer_sync``. ``sent``: per rank,
    the blocking sends of a pipeline whose P2P overlaps but for its warm-up and flush, when
    ``run`` (which carries them otherwise) is None. ``stall``: the rank's idle seconds per
    micro-batch in an interleaved schedule's steady state — waiting on slower model chunks
    (its own or other stages') in every period, which more micro-batches do not amortise:
    ``stage_imbalance`` is then at least that wait over all micro-batches and ``bubble`` the
    fill and drain left (the gap between rank totals misses chunks that differ on equal ranks)."""
    st = est.strategy
    m = st.micro_batch_num
    ct = est.stage_times[crit]
    parts = {
        "fwd": (ct.fwd.total - sum(ct.fwd.comm.values())) * m,
        "bwd": (ct.bwd.total - sum(ct.bwd.comm.values())) * m,
        "recompute": (ct.recompute.total - sum(ct.recompute.comm.values())) * m,
    }
    comm: dict[str, float] = {}
    for ph in (ct.fwd, ct.bwd, ct.recompute):
        for g, x in ph.comm.items():
            g = CP_LEVELS.get(g, g)  # a2a+p2p's two CP levels are the CP part
            comm[g] = comm.get(g, 0.0) + x * m
    # blocking sends: the rank's passes with their sends less the passes (none within
    # rounding: a one-stage pipeline printed pp_p2p = 4e-16)
    sends = sum(per_stage[crit]) - ct.total
    if st.p2p_overlapped:  # overlapped but for the warm-up and flush sends
        blocked = run.sent if run is not None else sent
        p2p = blocked[crit] if blocked else 0.0
    else:
        p2p = sends * m if sends > ROUNDING * ct.total else 0.0
    nominal = sum(parts.values()) + sum(comm.values()) + p2p
    gate_wait = 0.0
    busy = nominal
    if run is not None:
        busy = run.busy[crit]
        # a difference within rounding is none (a dense model printed ep_comm = -9e-16)
        tol = ROUNDING * nominal
        if busy < nominal - tol:  # EP all-to-all hidden under the paired micro-batch's compute
            # the hidden dispatch / combine carry the expert-TP collectives too
            # (simulate/ep_overlap.EP_GROUPS): each group gives up its share
            shares = {g: comm[g] for g in EP_GROUPS if comm.get(g)} or {"ep": 1.0}
            total = sum(shares.values())
            for g, x in shares.items():
                comm[g] = comm.get(g, 0.0) - (nominal - busy) * x / total
        elif busy > nominal + tol:  # the first forwards waited for their parameters' all-gather
            gate_wait = busy - nominal
    idle = max(0.0, end_bwd - busy)
    busy_max = m * max(f + b for f, b in per_stage)
    imbalance = min(idle, max(0.0, busy_max - m * sum(per_stage[crit])))
    if stall is not None:
        imbalance = min(idle, max(imbalance, stall * m))
    # exposed inside passes on the data-parallel groups (ZeRO-2/3's per-layer collectives)
    # and after the last pass (gradient reduce, parameter gathers) are one part
    in_pass_dp = sum(comm.pop(g, 0.0) for g in ("dp", "edp", "dp_shard"))
    drained = min(wait, max(0.0, drain))  # waiting on another stage's last passes
    return {
        **parts,
        **{f"{g}_comm": x for g, x in sorted(comm.items())},
        "pp_p2p": p2p,
        "bubble": idle - imbalance + drained,
        "stage_imbalance": imbalance,
        "dp_comm": max(0.0, end - end_bwd - optimizer - wait) + gate_wait + in_pass_dp,
        "optimizer": optimizer,
        "optimizer_sync": wait - drained,
    }
