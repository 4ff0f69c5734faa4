"""The op: the single description every estimate, memory walk and simulation reads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from simumax.graph.kernels import Collective, Kernel

Tensor = tuple[str, float]  # (unique name within a micro-batch, bytes)


class Op(NamedTuple):
    """One operator of one micro-batch on one pipeline rank (immutable; a named tuple
    because graph building makes thousands and a tuple is the cheapest immutable record
    Python builds).

    Phases: ``fwd``, ``bwd_input`` (activation gradients), ``bwd_weight`` (weight
    gradients). ``saved`` are the tensors kept from forward to backward, by name, so a
    tensor two ops keep (a linear's input that is also attention's output) counts once.
    ``recompute_group`` names the checkpointed group the op belongs to (set by
    graph.recompute): its forward kernels run again in backward, and the tensors it saves
    or outputs are not kept between forward and backward, except the group's inputs.
    """

    name: str
    module: str  # recompute/grouping tag: attn_norm, qkv, rope, core_attn, attn_proj, ...
    layer: int  # global layer index; -1 for embedding, head and loss
    fwd: tuple[Kernel, ...] = ()
    bwd_input: tuple[Kernel, ...] = ()
    bwd_weight: tuple[Kernel, ...] = ()
    saved: tuple[Tensor, ...] = ()
    input: tuple[Tensor, ...] = ()  # what a checkpoint of a group starting here keeps
    output: Tensor | None = None
    also_outputs: tuple[Tensor, ...] = ()  # further new tensors (RoPE writes q and k)
    fwd_transient: float = 0.0  # bytes alive only while its forward runs
    bwd_transient: float = 0.0  # bytes alive only while its backward runs
    params: int = 0  # parameters this rank holds for the op
    expert_params: int = 0  # of which expert (sharded over EP/ETP, reduced over EDP)
    # of ``params``, those several TP ranks hold identical copies of: norms, router, MLA
    # down-projections (all TP ranks), KV heads when tp > kv_head_num (tp / kv ranks each);
    # the model's count takes each copy once
    tp_replicated_params: int = 0
    tp_copies: int = 0  # ranks holding each replicated parameter (0: every TP rank)
    weight_shapes: tuple[tuple[int, int], ...] = ()  # TE linear weights on this rank
    recompute_group: str | None = None
    offloads: tuple[Tensor, ...] = ()  # activation offload op (graph/offload.py): the layer's tensors moved to host
    # the mechanism this op's sizes rest on where the configs do not fix them ("" where they
    # do): "moe_routing", a dropless MoE's tokens per expert taken as uniformly random
    # routing's x moe_load_imbalance. Its measured kernels count as unmeasured in the
    # uncertainty band (simumax/uncertainty.py)
    approximate: str = ""
    # FSDP2's sharding op of a unit (graph/sharding.py): the bf16 bytes the unit gathers, and
    # whether it is gathered again for its backward (resharded after forward) or kept gathered
    # from its forward; the activation walk follows them through the backward
    unit_gathered: float = 0.0
    unit_regathered: bool = False

    def kernels(self, phase: str) -> tuple[Kernel, ...]:
        if phase == "recompute":
            return self.fwd if self.recompute_group else ()
        return getattr(self, phase)

    def phase_kernels(self) -> tuple[tuple[Kernel, ...], ...]:
        """``kernels(phase)`` for each of PHASES, in that order."""
        return self.fwd, self.bwd_input, self.bwd_weight, self.fwd if self.recompute_group else ()

    @property
    def saved_bytes(self) -> float:
        return sum(b for _, b in self.saved)

    def with_(self, **kw: Any) -> "Op":
        """A copy with some fields replaced (``_replace``, in half its time: graph building
        and the recompute / offload / sharding passes copy every op at least once)."""
        v = list(self)
        for name, value in kw.items():
            i = _FIELD_INDEX.get(name)
            if i is None:
                raise ValueError(f"Op has no field {name!r}")
            v[i] = value
        return _new_tuple(Op, v)


_FIELD_INDEX = {name: i for i, name in enumerate(Op._fields)}
_new_tuple = tuple.__new__

PHASES = ("fwd", "bwd_input", "bwd_weight", "recompute")


class StagePart(NamedTuple):
    """A stretch of a stage's ops in forward order: ``ops`` as they are (``layers`` empty:
    the embedding, the head and loss), or a run of ``layers`` of one kind, whose ops are
    ``ops`` (those of one layer of the kind, named for it: ``ops[0].layer``, not
    necessarily in the run) under each layer's own names, ``expand(layer)``."""

    ops: list[Op]
    layers: tuple[int, ...] = ()
    expand: Callable[[int], list[Op]] | None = None
    kind: Any = None  # what makes the run's layers cost alike (model_graph.OpSource.cost_kind)

    @property
    def times(self) -> int:
        """How often ``ops`` occur in the stage (under other names)."""
        return len(self.layers) or 1

    def expanded(self) -> list[Op]:
        """Every op of the part: each layer's of a run under its own names."""
        if self.layers and self.expand is not None:
            return [o for layer in self.layers for o in self.expand(layer)]
        return self.ops


@dataclass(slots=True)
class Stage:
    """Everything one pipeline rank (or one model chunk of it: ``vstage``) runs for one
    micro-batch, in forward order: ``parts``, a model chunk's being its own ops before
    its layers (the embedding), its runs of layers of one kind, and its ops after them
    (MTP, head, loss); a rank's are its chunks' in chunk order."""

    index: int  # pipeline rank
    layers: list[int] = field(default_factory=list)
    p2p_bytes: float = 0.0  # activation sent to the next virtual stage per micro-batch
    vstage: int = 0  # virtual stage (model chunk position in forward order)
    chunk: int = 0  # chunk index on its rank
    parts: list[StagePart] = field(default_factory=list)
    # what was read when (by the number of parts: a rank's stage gets its chunks' parts after it is made)
    _ops: tuple[int, list[Op]] | None = field(default=None, repr=False, compare=False)
    # (parts, params, expert params) when last summed (a search reads them many times)
    _sums: tuple[int, int, int] | None = field(default=None, repr=False, compare=False)
    _groups: list[tuple[list[Op], int]] | None = field(default=None, repr=False, compare=False)

    @property
    def ops(self) -> list[Op]:
        """Every op, each layer's under its own names: made on first use (traces, op
        tables); an estimate reads ``groups()``, a layer of each kind with its count."""
        if self._ops is None or self._ops[0] != len(self.parts):
            self._ops = (len(self.parts), [o for p in self.parts for o in p.expanded()])
        return self._ops[1]

    def sections(self) -> tuple[list[Op], list[StagePart], list[Op]]:
        """A model chunk's (ops before its layers, runs of layers of one kind, ops after
        them), as model_graph.build_virtual_stages makes its parts."""
        parts = self.parts
        return parts[0].ops, parts[1:-1], parts[-1].ops

    def groups(self) -> list[tuple[list[Op], int]]:
        """(ops, times) per part: the layers of one kind are the same ops under other names."""
        if self._groups is None or len(self._groups) != len(self.parts):
            self._groups = [(p.ops, p.times) for p in self.parts]
        return self._groups

    def _param_sums(self) -> tuple[int, int, int]:
        s = self._sums
        if s is None or s[0] != len(self.parts):
            params = sum(sum(o.params for o in ops) * n for ops, n in self.groups())
            experts = sum(sum(o.expert_params for o in ops) * n for ops, n in self.groups())
            s = self._sums = (len(self.parts), params, experts)
        return s

    @property
    def params(self) -> int:
        return self._param_sums()[1]

    @property
    def expert_params(self) -> int:
        return self._param_sums()[2]

    def kernels(self) -> Iterator[Kernel]:
        """Every kernel of one micro-batch, op by op, phase by phase."""
        return (k for o in self.ops for ph in PHASES for k in o.kernels(ph))

    def collectives(self) -> list[Collective]:
        return [k for k in self.kernels() if isinstance(k, Collective)]
