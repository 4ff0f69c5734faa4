"""Collective time per network tier (α-β with SimuMax's per-op fields) and group placement.

Ranks are ordered tp-cp-dp-pp (tp fastest) for dense parameters and etp-ep-edp-pp for
expert parameters, as Megatron-Core builds its groups. A group whose ranks lie inside one
node uses an intra-node tier (on PCIe systems the ``intra_node_pcie_<n>x`` tier for the
span of the switch tree it crosses); otherwise ``inter_node``.

time = bytes * scale * (n + offset) / n / (bw * eff) + steps * latency_us + fixed latency

The ring model (Thakur, Rabenseifner & Gropp 2005): (n-1)/n of the buffer crosses each
link, twice for all-reduce, in steps = scale * (n + offset) hops (2(n-1) for all-reduce,
n-1 for all-gather / reduce-scatter / all-to-all, 1 for p2p), each paying the per-step
``latency_us``; ``fixed_latency_us`` (by group size if given) is paid once per call, and so
is the tier's ``bandwidth.latency_us`` for an op without its own ``latency_us``. NCCL's
own tuning model has this form (a base latency plus a per-step hardware latency), and the
SimuMax configs' fitted fields read this way: on the B200 config the all-to-all constants
by group size (51, 19, 0 µs for 2, 4, 8 ranks) make the per-call latency 58 / 41 / 51 µs
with per-step latency, 58 / 27 / 7 µs without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from simumax.config.strategy import StrategyConfig
from simumax.config.system import CollectiveSpec, NetworkTier, SystemConfig
from simumax.cost.fabric import leaf_rate, nodes_per_leaf
from simumax.cost.moe_fanout import ep_compute_usage, expected_units_hit
from simumax.cost.nccl_sms import DP_GROUPS, domain, dp_collective_sms
from simumax.errors import ConfigError
from simumax.graph.kernels import Collective

DEFAULT_SPECS = {
    "all_reduce": CollectiveSpec(scale=2, offset=-1),
    "all_gather": CollectiveSpec(scale=1, offset=-1),
    "reduce_scatter": CollectiveSpec(scale=1, offset=-1),
    "all2all": CollectiveSpec(scale=1, offset=-1),
    "p2p": CollectiveSpec(scale=1, offset=0),
}


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    size: int
    stride: int
    tier: str
    intra_node: bool
    # a group of blocks across nodes (Megatron's tp-cp-ep-pp-dp order with CP: the DP x CP
    # group is blocks of CP ranks at stride tp, tp*cp*pp apart): its members per node and
    # the node distance between consecutive members; None: derived from the even stride
    per_node: int | None = None
    node_stride: int | None = None


def ring_bytes(nbytes: float, n: int, scale: float, offset: float) -> float:
    """Bytes one rank moves: scale * (n + offset) / n of the buffer (the bandwidth term)."""
    return nbytes * scale * (n + offset) / n


def ring_steps(op: str, n: int, scale: float, offset: float) -> int:
    """Latency steps of a ring collective of n ranks: scale * (n + offset) (p2p: one)."""
    if op == "p2p":
        return 1
    return max(1, round(scale * (n + offset)))


def node_steps(op: str, nodes: int) -> int:
    """Latency steps across nodes: a tree for all-reduce, the ring otherwise."""
    if op == "all_reduce":
        return 2 * math.ceil(math.log2(nodes))
    return 1 if op == "p2p" else nodes - 1


def _next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def tier_time(tier: NetworkTier, op: str, nbytes: float, n: int, dp_group: bool = False, steps: int | None = None,
              rate: float = 1.0) -> float:
    """One collective of n ranks on one tier: SimuMax's α-β formula with its per-op fields;
    ``dp_group`` lets the op's ``dp_fixed_bw`` apply; ``steps`` latency steps (default the
    ring's, see the module docstring); ``rate`` the share of the tier's bandwidth the leaf
    uplinks leave it (cost/fabric.py)."""
    spec = tier.op.get(op) or DEFAULT_SPECS[op]
    unit = tier.bytes_per_gb
    bw = tier.bandwidth.gbps * unit * rate
    eff = spec.efficient_factor if spec.efficient_factor is not None else tier.bandwidth.efficient_factor
    fixed_bw = spec.dp_fixed_bw.get(str(n)) if dp_group else None
    if fixed_bw:
        bw, eff = fixed_bw * unit, 1.0
    fixed = spec.fixed_latency_us_by_comm_num.get(str(n), spec.fixed_latency_us)
    if spec.latency_us is None:  # the tier's latency is a per-call default
        per_step, fixed = 0.0, fixed + tier.bandwidth.latency_us
    else:
        per_step = spec.latency_us
    if steps is None:
        steps = ring_steps(op, n, spec.scale, spec.offset)
    return ring_bytes(nbytes, n, spec.scale, spec.offset) / (bw * eff) + (steps * per_step + fixed) * 1e-6


def intra_tier(tiers: Iterable[str], pcie: bool, span: int) -> str | None:
    """The tier of a group inside one node reaching ``span`` consecutive ranks: on a PCIe
    system the narrowest ``intra_node_pcie_<w>x`` switch span holding it, else the node's
    fabric (high, low, plain intra-node, or any tier named intra); None without one."""
    names = list(tiers)
    if pcie:
        width = _next_pow2(span)
        for w in sorted(int(k.split("_")[-1][:-1]) for k in names if k.startswith("intra_node_pcie_")):
            if w >= width:
                return f"intra_node_pcie_{w}x"
    for name in ("high_intra_node", "low_intra_node", "intra_node"):
        if name in names:
            return name
    intra = sorted(k for k in names if "intra" in k)
    return intra[-1] if intra else None


class NetworkModel:
    def __init__(self, system: SystemConfig, st: StrategyConfig) -> None:
        # the system's figures, not the system: a model kept in the system's own caches
        # (profiles.ProfileCache) must not hold the system, or dropping it takes the cyclic GC
        self.scaleup_size, self.host_link_gbps = system.scaleup_size, system.host_link_gbps
        self._leaf = (nodes_per_leaf(system), system.leaf_oversubscription)
        self.nets = system.networks
        tp, cp, dp, pp = st.tp_size, st.cp_size, st.dp_size, st.pp_size
        ep, etp = st.ep_size, st.etp_size
        layout = {
            "tp": (tp, 1),
            "cp": (cp, tp),
            # a2a+p2p: the all-to-all inside consecutive CP ranks, the ring across those groups
            "cp_a2a": (st.cp_a2a_size, tp),
            "cp_p2p": (st.cp_p2p_size, tp * st.cp_a2a_size),
            "dp": (dp * cp, tp),  # dense gradients reduce over DP x CP (same weights)
            # HSDP: shards inside one replica (consecutive DP ranks), the replicas across them
            "dp_shard": (st.dp_shard_size, tp),
            "dp_rep": (st.fsdp_replicate_size, tp * st.dp_shard_size),
            "pp": (2 if pp > 1 else 1, tp * cp * dp),  # p2p between neighbouring stages
            "etp": (etp, 1),
            "ep": (ep, etp),
            "edp": (st.edp_size, ep * etp),
        }
        blocks: dict[str, tuple[int, int]] = {}  # group -> (blocks, their stride): members at stride in each block
        if st.rank_order == "tp-cp-ep-pp-dp" and pp > 1:  # --use-tp-pp-dp-mapping (with CP: HSDP is refused)
            layout.update({
                "pp": (2, tp * cp), "dp": (cp, tp), "dp_shard": (cp, tp),
                "dp_rep": (st.fsdp_replicate_size, tp * pp * st.dp_shard_size), "edp": (st.edp_size, ep * etp * pp),
            })
            # the dense DP x CP group: the CP ranks of each DP index (stride tp), DP indices tp*cp*pp apart
            blocks = {"dp": (dp, tp * cp * pp), "dp_shard": (st.dp_shard_size // cp, tp * cp * pp)}
        overrides = {"tp": st.tp_net, "cp": st.cp_net, "cp_a2a": st.cp_net, "cp_p2p": st.cp_net, "dp": st.dp_net, "pp": st.pp_net, "ep": st.ep_net, "etp": st.etp_net,
                     "edp": st.edp_net or st.dp_net, "dp_shard": st.dp_net, "dp_rep": st.dp_net}
        self.groups = {g: self._place(g, n, stride, overrides.get(g), blocks.get(g)) for g, (n, stride) in layout.items()}
        self._cache: dict[Collective, float] = {}
        self._acc = system.accelerator
        self._ep_usage = ep_compute_usage(st, system.accelerator, self._tier_usage(self.tier("ep")))
        self._nccl = (st.nccl_ub, st.use_sharp, system.accelerator.nccl_max_ctas)
        self._usage: dict[tuple[str, str], float] = {}

    def _place(self, group: str, n: int, stride: int, override: str | None,
               block: tuple[int, int] | None = None) -> GroupPlacement:
        """Where a group lies: n ranks at ``stride``, or ``block`` = (count, block_stride)
        such runs block_stride apart (rank = i * stride + j * block_stride). Inside a node
        (its tier) when all of it fits as an evenly strided group of that reach would; else
        across nodes, blocks with a block's members per node where a node holds at most one
        block (or part of one), whole blocks per node otherwise."""
        count, block_stride = block if block is not None else (1, 0)
        if n == 1 and block is not None:  # blocks of one rank: an evenly strided group
            n, stride, count = count, block_stride, 1
        per_node = self.scaleup_size
        span = block_stride * (count - 1) + stride * (n - 1) + 1
        reach = block_stride * count if count > 1 else stride * n
        intra = span <= per_node and (per_node % reach == 0 or reach <= per_node)
        place = self._placement(group, n * count, stride, span, intra, override)
        if count == 1 or place.intra_node:
            return place
        in_block = max(1, min(n, per_node // stride)) if stride < per_node else 1
        if in_block < n or block_stride >= per_node or per_node % block_stride:
            k = in_block
            node_stride = max(1, block_stride // per_node) if in_block == n else max(1, stride // per_node)
        else:
            k, node_stride = n * min(count, per_node // block_stride), 1
        return GroupPlacement(place.size, stride, place.tier, False, k, node_stride)

    def _placement(self, group: str, n: int, stride: int, span: int, intra: bool, override: str | None) -> GroupPlacement:
        per_node = self.scaleup_size
        tiers = self.nets.tiers
        # a named tier picks among the tiers of the group's kind (inside a node or across
        # nodes); which kind is the cluster shape's, as SimuMax derives its *_net tiers, so a
        # SimuMax file naming high_intra_node runs on a PCIe system and pp_net inter_node on
        # one node stays on the node's fabric
        if override and override in tiers and (override == "inter_node") != intra:
            return GroupPlacement(n, stride, override, intra)
        if intra:
            name = intra_tier(tiers, self.nets.intra_with_pcie, span)
            if name is not None:
                return GroupPlacement(n, stride, name, True)
        if "inter_node" in tiers:
            return GroupPlacement(n, stride, "inter_node", False)
        raise ConfigError("networks", f"no tier for the {group} group (size {n}); add 'inter_node'")

    def tier(self, group: str) -> NetworkTier:
        return self.nets.tiers[self.groups[group].tier]

    def compute_usage(self, group: str, kind: str = "reduce") -> float:
        """The share of the compute that the group's communication takes while it overlaps
        that compute: its tier's (``_tier_usage``), for EP under the flex dispatcher what
        the SMs its kernels hold cost (``moe_fanout.ep_compute_usage``), for a data-parallel
        group without a tier figure (or under ``nccl_ub``) what its NCCL kernels' SMs cost
        (cost/nccl_sms.py; ``kind`` 'gather' or 'reduce')."""
        if group == "ep":
            return self._ep_usage
        key = (group, kind if group in DP_GROUPS else "")
        usage = self._usage.get(key)
        if usage is None:
            tier = self.tier(group)
            sms = self.nccl_sms(group, kind) if group in DP_GROUPS else None
            usage = self._usage[key] = self._acc.slowdown_beside(sms) if sms is not None else self._tier_usage(tier)
        return usage

    def nccl_sms(self, group: str, kind: str = "reduce") -> int | None:
        """SMs a data-parallel group's collective holds by cost/nccl_sms.py (0: none known);
        None where the tier's own figure applies (a measured processor_usage or a stated
        comm_sms, both for NCCL's conventional kernels)."""
        tier = self.tier(group)
        nccl_ub, sharp, max_ctas = self._nccl
        place = self.groups[group]
        one_per_node = place.per_node == 1 if place.per_node is not None else place.stride >= self.scaleup_size
        fabric = domain(place.size, self.scaleup_size if one_per_node else 1, place.intra_node, self.scaleup_size,
                        self.nets.intra_with_pcie)
        sms = dp_collective_sms(fabric, kind, nccl_ub, sharp, max_ctas)
        if (tier.processor_usage > 0 or tier.comm_sms) and not (nccl_ub and sms):
            return None
        return sms

    def _tier_usage(self, tier: NetworkTier) -> float:
        """A tier's ``processor_usage`` (measured by calibrate-comm), else what its collectives'
        ``comm_sms`` cost the GEMMs beside them on this accelerator, else 0."""
        if tier.processor_usage > 0 or not tier.comm_sms:
            return tier.processor_usage
        return self._acc.slowdown_beside(tier.comm_sms)

    def measured(self, group: str) -> bool:
        """Whether a collective of the group runs on numbers that were measured (the
        uncertainty band's attribution): its tier's provenance; activation offload copies
        run on the system's own host-link figure (``time``), counted as given."""
        return group == "offload" or self.tier(group).measured

    def time(self, c: Collective) -> float:
        cached = self._cache.get(c)
        if cached is not None:
            return cached
        if c.group == "offload":  # activation offload copies: the GPU's host link (graph/offload.py)
            t = c.bytes / (self.host_link_gbps * 1e9)
            self._cache[c] = t
            return t
        place = self.groups[c.group]
        n = place.size
        if n <= 1 or c.bytes <= 0:
            t = 0.0
        elif c.fanout is not None:
            t = self._deduplicated_all2all(c, place)
        elif place.intra_node or place.tier != "inter_node":
            t = self._flat(place.tier, c.op, c.bytes, n, c.group)
        else:
            t = self._across_nodes(c, place)
        self._cache[c] = t
        return t

    def _flat(self, tier_name: str, op: str, nbytes: float, n: int, group: str = "", steps: int | None = None,
              rate: float = 1.0) -> float:
        return tier_time(self.nets.tiers[tier_name], op, nbytes, n, group in ("dp", "edp"), steps, rate)

    def _intra_tier(self, k: int, stride: int) -> str | None:
        """The tier a group of k ranks at this stride inside one node would use."""
        try:
            place = self._place("local", k, stride, None)
        except ConfigError:
            return None
        return place.tier if place.intra_node else None

    def _deduplicated_all2all(self, c: Collective, place: GroupPlacement) -> float:
        """A token dispatch that sends each token once per destination (DeepEP's normal
        kernels, Megatron's flex dispatcher: ``Buffer.dispatch`` / ``combine``): through the
        NICs once per remote node it reaches (to the same local rank there), then over
        NVLink once per destination rank — where the all-to-all sends one copy per routed
        expert. The expected nodes and ranks a token reaches follow its routing
        (cost/moe_fanout.py); the two transfers overlap, as the all-to-all's do."""
        experts, topk, groups, group_topk = c.fanout
        n = place.size
        per_copy = c.bytes / topk
        ranks = expected_units_hit(n, experts, topk, groups, group_topk)
        _, nodes, node_stride, local = self._node_split(place)
        if place.intra_node or nodes == 1:
            return self._flat(place.tier, "all2all", per_copy * ranks, n, c.group)
        reached = expected_units_hit(nodes, experts, topk, groups, group_topk)
        rate = leaf_rate(*self._leaf, "all2all", nodes, node_stride)
        # a reached node is the sender's own one time in `nodes` (symmetry); so is a rank
        remote = self._flat("inter_node", "p2p", per_copy * reached * (nodes - 1) / nodes, 2, steps=nodes - 1, rate=rate)
        forwarded = self._flat(local, "p2p", per_copy * ranks * (n - 1) / n, 2) if local else 0.0
        return max(remote, forwarded)

    def _node_split(self, place: GroupPlacement) -> tuple[int, int, int, str | None]:
        """(members per node k, nodes, node stride, the tier k members use inside a node or
        None) of a group across nodes."""
        n, stride, per_node = place.size, place.stride, self.scaleup_size
        if place.per_node is not None:
            k, node_stride = place.per_node, place.node_stride or 1
        else:
            k = max(1, min(n, per_node // stride)) if stride < per_node else 1
            node_stride = 1 if stride < per_node else stride // per_node
        return k, max(1, n // k), node_stride, self._intra_tier(k, stride) if k > 1 else None

    def _across_nodes(self, c: Collective, place: GroupPlacement) -> float:
        """A group spanning nodes (k members per node on N nodes).

        Hierarchical as NCCL and MPICH run it (Thakur, Rabenseifner & Gropp, "Optimization
        of Collective Communication Operations in MPICH", IJHPCA 2005; NCCL's rings/trees
        over NVLink inside a node and the NICs across): all-reduce = reduce-scatter over the
        k local ranks + all-reduce over the N nodes on 1/k of the data + all-gather over the k
        local ranks; reduce-scatter / all-gather the first / last two parts; all-to-all
        sends (n - k)/n of its buffer through the NIC and (k - 1)/n over the node fabric at
        the same time. The inter-node part is the ring bandwidth term
        2(N - 1)/N · bytes / (NIC gbps · eff) (all-reduce; (N - 1)/N for the others) plus the
        fixed latency plus the per-step latency times 2·ceil(log2 N) for all-reduce
        (NCCL's tree wins on latency at scale), N - 1 for the ring collectives and
        all-to-all, 1 for p2p. The tier's gbps is per GPU: every GPU of a node runs its own
        group's collective at the same time (groups of one kind are symmetric), so each
        uses its share of the node's NICs."""
        n = place.size
        k, nodes, node_stride, local = self._node_split(place)
        op, b = c.op, c.bytes

        def across(op_: str, nbytes: float) -> float:
            if nodes <= 1:
                return 0.0
            rate = leaf_rate(*self._leaf, op_, nodes, node_stride)
            return self._flat("inter_node", op_, nbytes, nodes, c.group, node_steps(op_, nodes), rate)

        if local is None or op == "p2p":
            rate = leaf_rate(*self._leaf, op, n, node_stride)
            return self._flat("inter_node", op, b, n, c.group, node_steps(op, n), rate)
        if op == "all_reduce":
            return self._flat(local, "reduce_scatter", b, k) + across("all_reduce", b / k) + self._flat(local, "all_gather", b, k)
        if op == "reduce_scatter":
            return self._flat(local, "reduce_scatter", b, k) + across("reduce_scatter", b / k)
        if op == "all_gather":
            return across("all_gather", b / k) + self._flat(local, "all_gather", b, k)
        # all2all, each share on its tier's all-to-all line (many peers at once), in parallel:
        # (n - k)/n = (N - 1)/N of the buffer through the NICs, an all-to-all over the N nodes
        # (as a group of one member per node), and (k - 1)/n over the node fabric, an
        # all-to-all of the k local ranks' part (bk/n) of it
        return max(across("all2all", b), self._flat(local, "all2all", b * k / n, k))
