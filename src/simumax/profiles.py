"""Per-layer profiles: ops, per-op times and activation walks, shared across estimates.

Strategies that differ only in their pipeline layout (pp, vp, uneven stages, schedule),
data parallelism, ZeRO stage or micro-batch count run the same layers: the same ops and
the same per-op times (TP / CP / EP / ETP groups are the innermost rank dimensions, so the
layout does not move them to another network tier), and chunks of the same shape have the
same activation walk. A ``ProfileCache`` keeps these per *family* of strategies (and the
schedules' task orders by layout), so a search costs each layer kind once instead of once
per layer per candidate. Families that differ only in which ops they checkpoint share
their plain layer ops too (CHECKPOINT_FIELDS).

Every estimate goes through a cache (``ProfileCache.of`` the configs when none is given),
so there is one code path: a shared cache changes speed, never results.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simumax.config.base import snapshot
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.cost.efficiency import ComputeModel
from simumax.cost.network import NetworkModel
from simumax.cost import sources
from simumax.cost.sources import KernelSources
from simumax.cost.stage_time import Coster, PhaseTime, StageTime
from simumax.dp.sharding_plan import ShardingPlan
from simumax.graph import fp8
from simumax.graph.model_graph import CostKind, OpSource, PlainLayers
from simumax.graph.ops import PHASES, Op, Stage, StagePart
from simumax.graph.relabel import Relabeler
from simumax.graph.params import ParamCount
from simumax.graph.offload import MODULE as OFFLOAD
from simumax.graph.sharding import MODULE as SHARDING
from simumax.graph.shared_experts import SHARED_EXPERT_MODULES
from simumax.memory.activation_walk import WalkResult
from simumax.memory.chunk_walk import shaped_walk
from simumax.memory.schedule_walk import RankActivations, walk_schedule
from simumax.schedule import cut_orders, order_key, rank_orders
from simumax.schedule.tasks import RankOrders

# Strategy fields that change the layout, not the layers (the ops or their costs).
LAYOUT_FIELDS = frozenset(
    {
        "world_size", "pp_size", "interleaving_size", "microbatch_group_size_per_vp_stage",
        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage", "micro_batch_num",
        "zero_state", "recompute_layer_num", "recompute_method", "pp_schedule", "dp_net", "pp_net", "overlap_grad_reduce",
        "overlap_param_gather", "overlap_param_gather_with_optimizer_step", "overlap_p2p_comm", "pp_comm_async",
        "overlap_p2p_comm_warmup_flush", "ddp_bucket_size",
        "defer_embedding_wgrad_compute", "mem_factor", "account_for_embedding_in_pipeline_split",
        "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout",
        "optimizer_cpu_offload", "optimizer_offload_fraction",  # the step and model states, not the layers
        "optimizer", "muon_num_ns_steps", "muon_split_qkv", "muon_scalar_optimizer",
    }
)
LAYER_GROUPS = ("tp", "cp", "cp_a2a", "cp_p2p", "ep", "etp")  # the only groups layer ops communicate on
SHARDING_GROUPS = ("dp", "edp", "dp_shard")  # and, under ZeRO-2/3, these (graph/sharding.py)
# Strategy fields that only choose the passes over a layer's own ops: which are checkpointed
# (graph.recompute), what is offloaded (graph.offload); families differing in these share
# their plain layer ops.
CHECKPOINT_FIELDS = frozenset(
    {
        "enable_recompute", "recompute_granularity", "attn_recompute", "mla_rms_recompute", "mlp_recompute",
        "mlp_rms_recompute", "megatron_recompute", "megatron_recompute_modules",
        "fine_grained_activation_offloading", "offload_modules", "cpu_offloading", "cpu_offloading_num_layers",
    }
)


def family_key(st: StrategyConfig, network: NetworkModel) -> tuple[Any, ...]:
    # the fields as they are (atoms, and lists of atoms: repr tells 1, 1.0 and True apart)
    fields = tuple(sorted((k, repr(v)) for k, v in st.__dict__.items() if k not in LAYOUT_FIELDS))
    groups = LAYER_GROUPS
    if st.zero_state >= 2:  # ZeRO-2/3 layers carry data-parallel collectives (graph/sharding.py)
        # the plan's part the layer ops depend on (FSDP2 under pipelining depends on pp_size)
        fields += (("sharding", repr(ShardingPlan.of(st).key)),)
        groups = (*LAYER_GROUPS, *SHARDING_GROUPS)
    elif st.low_precision and fp8.recipe(st.lp_recipe).history_amax:
        groups = (*LAYER_GROUPS, "dp")  # each chunk's fp8 amax all-reduce runs on DP (graph/model_graph.py)
    return fields + tuple((g, network.groups[g]) for g in groups)


_PASS_ONLY = CHECKPOINT_FIELDS | {"sharding", *SHARDING_GROUPS}  # family key items _plain_ops_key drops


def _plain_ops_key(family: tuple[Any, ...]) -> tuple[Any, ...]:
    """The family key without what only the passes read (the ZeRO-2/3 sharding too)."""
    return tuple([item for item in family if item[0] not in _PASS_ONLY])


def _by_ops(cache: dict[tuple[Any, ...], tuple[list[Op], Any]], shape: tuple[Any, ...], ops: list[Op],
            make: Callable[[], Any]) -> Any:
    """``make()``, cached by ``shape`` and the identity of ``ops``: the ops are kept with the
    result, so a freed op's id reused by a new op (a chunk's own amax reduction, the MTP
    block's) cannot hit."""
    key = (shape, tuple(map(id, ops)))
    hit = cache.get(key)
    if hit is None or any(a is not b for a, b in zip(hit[0], ops)):
        hit = cache[key] = (ops, make())
    return hit[1]


@dataclass
class LayerProfiles:
    """One family: its op source, per-layer-kind times and walks by chunk shape."""

    model: ModelConfig
    source: OpSource  # built from the first strategy of the family seen
    coster: Coster
    param_count: ParamCount | None = None  # Estimate.params: layout-independent within a family
    _layer_times: dict[CostKind, StageTime] = field(default_factory=dict)
    _op_times: dict[int, tuple[Op, dict[str, PhaseTime]]] = field(default_factory=dict)
    # chunk_walk, chunk_sources: keyed by the chunk's ops before and after its layers (_by_ops)
    _walks: dict[tuple[Any, ...], tuple[list[Op], WalkResult]] = field(default_factory=dict)
    _relabelers: dict[CostKind, Relabeler] = field(default_factory=dict)
    _layer_sources: dict[CostKind, KernelSources] = field(default_factory=dict)
    _edge_sources: dict[tuple[Any, ...], tuple[list[Op], KernelSources]] = field(default_factory=dict)

    def op_time(self, o: Op) -> dict[str, PhaseTime]:
        # keyed by identity; the op is kept with its time, so a freed op's id, reused by a
        # new op (a chunk's own amax reduction, the MTP block's), cannot return its time
        hit = self._op_times.get(id(o))
        if hit is None or hit[0] is not o:
            hit = self._op_times[id(o)] = (o, self.coster.op(o))
        return hit[1]

    def _ops_time(self, ops: list[Op]) -> StageTime:
        out = StageTime(PhaseTime(), PhaseTime(), PhaseTime(), PhaseTime(), 0.0)
        phases = []
        for o in ops:
            ph = self.op_time(o)
            phases.append(ph)
            for name in PHASES:
                getattr(out, name).add(ph[name])
        out.add_op_times(list(ops), phases)
        self._hide_prefetched(out, ops, phases)
        return out

    def _hide_prefetched(self, out: StageTime, ops: list[Op], phases: list[dict[str, PhaseTime]]) -> None:
        """Side-stream transfers hide under the compute of the ops they came with, in
        each phase; the rest is exposed. ZeRO-2/3 collectives (graph/sharding.py) run on
        the data-parallel stream, prefetched, and slow that compute by the tier's
        processor_usage; activation offload copies (graph/offload.py) run on the copy
        engines and take no SMs. The two streams run side by side."""
        shard_group = ShardingPlan.of(self.source.st).group  # HSDP: one replica's shard group
        for module, usage in ((SHARDING, self.coster.network.compute_usage(shard_group)), (OFFLOAD, 0.0)):
            side = [ph for o, ph in zip(ops, phases) if o.module == module]
            if side:
                self._hide(out, side, usage)
        if self.source.st.moe_shared_expert_overlap:
            shared = [ph for o, ph in zip(ops, phases) if o.module in SHARED_EXPERT_MODULES]
            if shared:
                self._hide_shared_experts(out, shared, self.coster.network.compute_usage("ep"))

    @staticmethod
    def _hide_shared_experts(out: StageTime, shared: list[dict[str, PhaseTime]], usage: float) -> None:
        """--moe-shared-expert-overlap (megatron-core token_dispatcher.py, shared_experts.py):
        the shared experts run on their own stream, FC1 (with its SP gather) launched after
        the dispatch all-to-all, FC2 (with its reduce-scatter) after the combine's; autograd
        runs their backward on that stream too, beside the all-to-alls' backward. Per pass,
        the layer's EP all-to-all time hides min(shared experts' time, all-to-all time); the
        shared weight gradients are left exposed (a schedule may defer them)."""
        for name in ("fwd", "recompute", "bwd_input"):
            tot = getattr(out, name)
            side = sum(ph[name].total for ph in shared)
            hidden = min(side, tot.comm.get("ep", 0.0))
            if hidden <= 0:
                continue
            tot.comm["ep"] -= hidden
            tot.total -= hidden * (1.0 - usage)
            tot.compute += hidden * usage

    @staticmethod
    def _hide(out: StageTime, side: list[dict[str, PhaseTime]], usage: float) -> None:
        for name in PHASES:
            tot = getattr(out, name)
            by_group: dict[str, float] = {}
            for ph in side:
                for g, x in ph[name].comm.items():
                    by_group[g] = by_group.get(g, 0.0) + x
            comm = sum(by_group.values())
            hidden = min(comm, tot.compute + tot.membound)
            if hidden <= 0:
                continue
            for g, x in by_group.items():
                tot.comm[g] -= x if hidden == comm else hidden * x / comm  # exact zero when all hides
            tot.total -= hidden * (1.0 - usage)
            tot.compute += hidden * usage

    def layer_time(self, layer: int, recomputed: bool) -> StageTime:
        """One layer, one micro-batch; layers of one kind (dense / MoE) cost the same."""
        key = self.source.cost_kind(layer, recomputed)
        t = self._layer_times.get(key)
        if t is None:
            t = self._layer_times[key] = self._ops_time(self.source.layer(layer, recomputed))
        return t

    def chunk_time(self, st: StrategyConfig, chunk: Stage, p2p: float) -> StageTime:
        pre, runs, post = chunk.sections()
        out = self._ops_time(pre)
        for run in runs:
            t = self.layer_time(run.layers[0], run.kind[0])
            out.add(t, len(run.layers), op_times=False)
            # the kind's costs under each layer's own ops (names and layer index in traces
            # and op tables), made when they are read
            out.add_op_times(run.expanded, t.phases() * len(run.layers))
        out.add(self._ops_time(post))
        out.p2p = p2p
        return out

    def chunk_sources(self, st: StrategyConfig, chunk: Stage) -> KernelSources:
        """Kernel seconds of one micro-batch through a chunk by family and source (layers
        of one kind summed once)."""
        pre, runs, post = chunk.sections()
        out = KernelSources()
        for run in runs:
            src = self._layer_sources.get(run.kind)
            if src is None:
                src = self._layer_sources[run.kind] = sources.of_ops(run.ops, self.coster.compute, self.coster.network)
            out.add(src, len(run.layers))
        edge = pre + post
        out.add(_by_ops(self._edge_sources, (), edge, lambda: sources.of_ops(edge, self.coster.compute, self.coster.network)))
        return out

    def chunk_walk(self, st: StrategyConfig, chunk: Stage) -> WalkResult:
        """The walk depends on the chunk's shape only (tensor names differ by layer), and
        past a few layers of a kind grows by the same bytes per layer
        (memory/chunk_walk.py). The peak ops are given by position in the chunk
        (``fwd_peak_at``, ``bwd_peak_at``; memory/chunk_walk.op_name_at names them), not by
        name: chunks of one shape share the result."""
        pre, runs, post = chunk.sections()
        group = st.recompute_group_layers  # layers per checkpoint (a layout field: not in the family)
        shape = (tuple((r.kind, len(r.layers)) for r in runs), len(pre), group)
        return _by_ops(self._walks, shape, pre + post, lambda: shaped_walk(chunk, self._relabeler, group == 1))

    def _relabeler(self, run: StagePart) -> Relabeler:
        """The run's kind's ops, renamable to any layer index (one per kind)."""
        r = self._relabelers.get(run.kind)
        if r is None:
            r = self._relabelers[run.kind] = Relabeler(run.ops, run.ops[0].layer)
        return r


def _gone() -> None:
    """The weak reference of a cache whose system was gone when it was pickled."""
    return None


class ProfileCache:
    """Layer profiles of one model on one system, by strategy family."""

    def __init__(self, model: ModelConfig, system: SystemConfig, system_snapshot: Any = None) -> None:
        # the system weakly: the cache lives in the system's own caches (``of``), and a strong
        # reference back would leave every estimate's graph to the cyclic GC once dropped
        self.model, self._system = model, weakref.ref(system)
        self.compute = ComputeModel(system, system_snapshot)
        self._families: dict[tuple[Any, ...], LayerProfiles] = {}
        self._schedule_walks: dict[tuple[Any, ...], list[RankActivations]] = {}
        self.grad_buckets: dict[tuple[Any, ...], list[Any]] = {}  # dp/buckets.py, by bucket_key
        self._plain_layers: dict[tuple[Any, ...], PlainLayers] = {}
        self._orders: dict[tuple[Any, ...], RankOrders] = {}
        # per schedule shape (schedule.order_shape): its longest order made, which shorter
        # orders are cut from (schedule.cut_orders)
        self._longest_order: dict[tuple[Any, ...], tuple[int, RankOrders]] = {}

    @property
    def system(self) -> SystemConfig | None:
        """The system config the profiles were made for (None once it is gone)."""
        return self._system()

    # a weak reference does not pickle: the state carries the system itself (pickle's memo
    # keeps it the object the estimate holds), and the reference is remade on load
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_system": self._system()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        system = state.pop("_system")
        self.__dict__.update(state)
        self._system = weakref.ref(system) if system is not None else _gone

    @classmethod
    def of(cls, model: ModelConfig, system: SystemConfig, snapshots: tuple[Any, Any] | None = None) -> "ProfileCache":
        """The cache of estimates made without one: kept with the system config for the
        last model object estimated with it, while neither config's contents change. A
        script that makes a PerfLLM per strategy with the same config objects then shares
        layer profiles, schedule orders and walks, as a search does (one slot: a loop over
        fresh model objects replaces it instead of keeping them all). ``snapshots``: the
        two configs' ``snapshot`` when the caller has them (PerfLLM's change check)."""
        model_snap, system_snap = snapshots or (snapshot(model), snapshot(system))
        contents = (id(model), model_snap, system_snap)  # the slot holds the model: its id stays its own
        return system.derived("profiles", contents, lambda: cls(model, system, system_snap))

    def orders(self, st: StrategyConfig, micro_batch_num: int | None = None) -> RankOrders:
        """The schedule's per-rank task order (shared: callers must not modify it), for
        the strategy's micro-batch count or another (the steady-state extrapolation's)."""
        if micro_batch_num is not None and micro_batch_num != st.micro_batch_num:
            st = st.model_copy(update={"micro_batch_num": micro_batch_num})
        key = order_key(st)
        o = self._orders.get(key)
        if o is None:
            shape, m = key
            longest = self._longest_order.get(shape)
            if longest is not None and longest[0] > m:
                o = cut_orders(st, longest[1])
            if o is None:
                o = rank_orders(st)
            self._orders[key] = o
            if longest is None or longest[0] < m:
                self._longest_order[shape] = (m, o)
        return o

    def schedule_walks(self, st: StrategyConfig, micro_batch_num: int, walks: dict[int, WalkResult],
                       w_keep: dict[int, float]) -> list[RankActivations]:
        """Each rank's activation walk along the schedule (shared: callers must not modify
        it). It reads only the order and each chunk's stored / peak bytes, so strategies
        that differ elsewhere (ZeRO, optimizer offload, DP) reuse it."""
        if micro_batch_num != st.micro_batch_num:
            st = st.model_copy(update={"micro_batch_num": micro_batch_num})
        key = (order_key(st), tuple(sorted((v, w.stored, w.fwd_peak, w.bwd_peak) for v, w in walks.items())),
               tuple(sorted(w_keep.items())))
        hit = self._schedule_walks.get(key)
        if hit is None:
            hit = self._schedule_walks[key] = [walk_schedule(o, walks, w_keep) for o in self.orders(st)]
        return hit

    def family(self, st: StrategyConfig, network: NetworkModel) -> LayerProfiles:
        key = family_key(st, network)
        fam = self._families.get(key)
        if fam is None:
            coster = Coster(self.compute, network, tp_comm_overlap=st.tp_comm_overlap)
            plain = self._plain_layers.setdefault(_plain_ops_key(key), PlainLayers())
            fam = self._families[key] = LayerProfiles(self.model, OpSource(self.model, st, plain), coster)
        return fam

    def __len__(self) -> int:
        return len(self._families)
