"""Timed collectives as points, and the cost model's line through them (pure Python, no
torch): what ``simumax calibrate-comm`` measures under torchrun and what ``simumax import
nccl-tests`` reads from nccl-tests' output, fitted alike (calibrate/system_writer.py
``merge_collectives`` writes the fits into a tier)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simumax.calibrate.fit import AlphaBeta, fit_alpha_beta
from simumax.calibrate.system_writer import merge_collectives
from simumax.config.system import SystemConfig
from simumax.cost.fabric import leaf_rate, nodes_per_leaf
from simumax.cost.network import DEFAULT_SPECS, intra_tier, node_steps, ring_bytes, tier_time

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all2all", "p2p")
# what the model runs over a group's k ranks inside each node beside its NICs' part across
# nodes (cost/network.py ``NetworkModel._across_nodes``): before / after it, or (all-to-all)
# at the same time
LOCAL_PARTS = {"all_reduce": ("reduce_scatter", "all_gather"), "reduce_scatter": ("reduce_scatter",),
               "all_gather": ("all_gather",), "all2all": ("all2all",), "p2p": ()}


@dataclass(frozen=True, slots=True)
class CommPoint:
    op: str
    group_size: int
    nbytes: int  # the cost model's logical buffer (kernels.Collective.bytes; nccl-tests' "size")
    seconds: float
    nodes: int = 1  # nodes the group spans (its ranks spread evenly over them)
    # the share of the tier's bandwidth the leaf switches leave this collective (cost/fabric.py
    # leaf_rate): the model divides its bytes by it, so the fit does too
    rate: float = 1.0


def _fit(op: str, pts: list[CommPoint]) -> AlphaBeta:
    """The cost model's line through the points: seconds against ring bytes (at the
    point's leaf rate)."""
    spec = DEFAULT_SPECS[op]
    return fit_alpha_beta([ring_bytes(p.nbytes, p.group_size, spec.scale, spec.offset) / p.rate for p in pts],
                          [p.seconds for p in pts])


def fit_points(points: list[CommPoint]) -> dict[str, AlphaBeta]:
    """One α-β line per op over all group sizes (the config has one entry per op and tier)."""
    return {op: _fit(op, pts) for op in OPS if (pts := [p for p in points if p.op == op])}


def fit_points_by_size(points: list[CommPoint]) -> dict[str, dict[int, AlphaBeta]]:
    """One α-β line per op and group size."""
    sizes: dict[str, dict[int, list[CommPoint]]] = {}
    for p in points:
        sizes.setdefault(p.op, {}).setdefault(p.group_size, []).append(p)
    return {op: {n: _fit(op, by_n[n]) for n in sorted(by_n)} for op, by_n in sizes.items()}


def points_report(points: list[CommPoint]) -> dict:
    """The points and per-size fits as the calibration reports write them."""
    return {
        "points": [{"op": p.op, "group_size": p.group_size, "bytes": p.nbytes, "seconds": p.seconds} for p in points],
        "fits_by_group_size": {op: {str(n): {"seconds_per_byte": f.seconds_per_byte, "latency": f.latency,
                                             "max_rel_residual": f.max_rel_residual} for n, f in by.items()}
                               for op, by in fit_points_by_size(points).items()},
    }


def intra_tier_name(system: dict[str, Any], ranks: int) -> str:
    """The tier the cost model puts a group of ``ranks`` consecutive ranks inside one node on
    (cost/network.py ``intra_tier``); a system without one gets the usual name."""
    nets = system["networks"]
    tiers = [k for k, v in nets.items() if isinstance(v, dict)]
    return intra_tier(tiers, bool(nets.get("intra_with_pcie")), ranks) or "high_intra_node"


def merge_points(system: dict[str, Any], points: list[CommPoint], usage: float | None = None,
                 tier: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The system with the tiers the points measure fitted, and what went where.

    Points inside one node fit the node's tier with the flat ring formula, as the cost model
    costs such groups. Points across nodes fit ``inter_node`` through the model's own split
    of them (cost/network.py ``NetworkModel._across_nodes``, k ranks per node on N nodes):
    an all-reduce is a reduce-scatter over the k local ranks, an all-reduce of 1/k of the
    bytes over the N nodes and an all-gather over the k local ranks (reduce-scatter and
    all-gather the first / last two parts), so the inter-node line is fitted to the time
    less the local parts (costed on the node's tier, fitted first) against the ring bytes
    of b/k over N, with the model's N-node latency steps. A p2p across nodes is the tier's
    p2p. An all-to-all across nodes is an all-to-all of the buffer over the N nodes (its
    (N - 1)/N cross-node share on the tier's all-to-all line) beside an all-to-all of the k
    local ranks' part of it on the node's tier, whichever is longer: its points fit the
    tier's all-to-all line where the NICs' part is the longer. Where the system states leaf
    switches, each cross-node point's bytes count at the leaf rate the model applies to that
    collective (cost/fabric.py, its N nodes taken as consecutive). ``tier`` puts every point
    on that tier with the flat formula instead (as calibrate-comm --tier)."""
    skipped: list[str] = []
    notes: list[str] = []
    if tier is not None:
        out = merge_collectives(system, tier, fit_points(points), fit_points_by_size(points), usage)
        return out, {"tiers": {tier: len(points)}, "not_fitted": skipped, "notes": notes}
    inside = [p for p in points if p.nodes <= 1]
    across = [p for p in points if p.nodes > 1]
    out, where = system, {}
    if inside:
        name = intra_tier_name(system, max(p.group_size for p in inside))
        out = merge_collectives(out, name, fit_points(inside), fit_points_by_size(inside), usage)
        where[name] = len(inside)
    if across:
        cfg = SystemConfig.init_from_dict(out)
        per_leaf, oversubscription = nodes_per_leaf(cfg), cfg.leaf_oversubscription
        measured_inside = {p.op for p in inside}
        unmeasured: set[str] = set()
        adjusted: list[CommPoint] = []
        for p in across:
            k = 1 if p.op == "p2p" else max(1, p.group_size // p.nodes)
            local = 0.0
            if k > 1:
                node = cfg.networks.tiers[intra_tier_name(out, k)]
                # an all-to-all's local share: an all-to-all of the k local ranks' part of the buffer
                local_bytes = p.nbytes * k / p.group_size if p.op == "all2all" else p.nbytes
                local = sum(tier_time(node, part, local_bytes, k) for part in LOCAL_PARTS[p.op])
                unmeasured |= {f"{part} (the node-local part of {p.op} across nodes)" for part in LOCAL_PARTS[p.op]
                               if part not in measured_inside}
            rest = p.seconds - local
            if rest <= 0.05 * p.seconds:
                skipped.append(f"{p.op} over {p.nodes} nodes ({p.nbytes} B): the node's tier alone takes "
                               f"{local * 1e6:.1f} of its {p.seconds * 1e6:.1f} us, nothing left for the NICs")
                continue
            if p.op == "p2p":  # the pair's send through the NICs
                group, nbytes, seconds = 2, p.nbytes, p.seconds
            elif p.op == "all2all":  # in parallel with the local share: the whole time, the buffer over N nodes
                group, nbytes, seconds = p.nodes, p.nbytes, p.seconds
            else:  # after the local parts: b/k bytes over N "ranks" (nodes), as the model costs it
                group, nbytes, seconds = p.nodes, max(1, round(p.nbytes / k)), rest
            adjusted.append(CommPoint(p.op, group, nbytes, seconds, rate=leaf_rate(per_leaf, oversubscription, p.op, group, 1)))
        if adjusted:
            out = merge_collectives(out, "inter_node", fit_points(adjusted), fit_points_by_size(adjusted), usage,
                                    steps_of=node_steps)
            where["inter_node"] = len(adjusted)
        notes += [f"the node's {what} is the base's, not measured on one node here: time it there too for an "
                  "inter_node fit of this cluster alone" for what in sorted(unmeasured)]
    return out, {"tiers": where, "not_fitted": skipped, "notes": notes}


def report_notes(report: dict[str, Any]) -> list[str]:
    """The lines a fit's report (``merge_points``' second value, or a report holding it) has
    to say: the points not fitted, then the notes."""
    return [f"not fitted: {n}" for n in report["not_fitted"]] + report["notes"]
