"""The scale-out fabric's leaf switches: how much of a cross-node collective's NIC rate
survives the leaf uplinks (``SystemConfig.leaf_radix``, ``leaf_oversubscription``,
``rail_optimized``).

A two-level fat tree: each leaf switch gives ``radix · o / (o + 1)`` ports to NICs and
``radix / (o + 1)`` to spines, o the down:up oversubscription (1 = non-blocking). Rail-
optimised (DGX SuperPOD): NIC i of every node plugs into leaf i, so one leaf serves a NIC
of each of S = downlinks nodes (a 64-port NDR leaf at 1:1: 32 nodes, one scalable unit).
Otherwise a leaf is a top-of-rack switch taking every NIC of S = downlinks / nics_per_node
nodes (64 ports, 8 NICs: 4 nodes). All-to-all between different local ranks stays on one
rail through NCCL's PXN (a hop over NVLink to the peer's rail first), so in both layouts
what leaves a leaf is the traffic to nodes outside its S.

In the symmetric regime of training (every GPU runs its group's collective at once), a
leaf's NIC ports carry rate R each and its uplinks carry the share f of that traffic bound
outside the leaf; uplinks hold 1/o of the downlink capacity, so R = B · min(1, 1 / (o f)).
f per pattern, for a group spanning N nodes spaced s nodes apart, m = min(N, S // s) of
them under one leaf:

* ring collectives and NCCL's trees (all-reduce, all-gather, reduce-scatter): NCCL orders
  the ring by node, so it enters and leaves each leaf once: of the m NICs' traffic one
  flow crosses, f = 1/m (0 when the group fits one leaf);
* all-to-all: (N - m) / (N - 1) of each node's cross-node traffic goes to other leaves;
* p2p between pipeline stages s nodes apart: a share min(1, s/S) of a leaf's nodes send to
  the next leaf.

Latency of the extra switch hops is not modelled (sub-microsecond against the NIC and
NCCL step latencies the tier carries).
"""

from __future__ import annotations

from simumax.config.system import SystemConfig


def nodes_per_leaf(system: SystemConfig) -> int | None:
    """Nodes one leaf switch serves (None: no leaf layer given, one non-blocking fabric)."""
    if system.leaf_radix is None:
        return None
    o = system.leaf_oversubscription
    down = max(1, int(system.leaf_radix * o / (o + 1)))
    if system.rail_optimized:
        return down
    return max(1, down // (system.nics_per_node or system.num_per_node))


def uplink_share(op: str, nodes: int, node_stride: int, per_leaf: int) -> float:
    """f: the share of a leaf's traffic for this collective that leaves the leaf."""
    if nodes <= 1:
        return 0.0
    m = max(1, min(nodes, per_leaf // node_stride))
    if op == "p2p":
        return min(1.0, node_stride / per_leaf)
    if op == "all2all":
        return (nodes - m) / (nodes - 1)
    return 0.0 if m >= nodes else 1.0 / m


def leaf_rate(per_leaf: int | None, oversubscription: float, op: str, nodes: int, node_stride: int) -> float:
    """Multiplier (<= 1) on the inter-node bandwidth of one cross-node collective, from the
    system's two leaf figures: ``nodes_per_leaf(system)`` and its oversubscription."""
    if per_leaf is None:
        return 1.0
    f = uplink_share(op, nodes, node_stride, per_leaf)
    o = oversubscription
    return 1.0 if f * o <= 1.0 else 1.0 / (f * o)
