"""Walk one micro-batch's forward then backward over a stage's ops, tracking live bytes.

Tensors are tracked by name, so a tensor several ops keep counts once. Recompute
groups keep only their inputs between forward and backward; in backward the group's
tensors come back (re-run forward) just before its last op's backward and are released
op by op like any saved tensor. Offloaded tensors (graph/offload.py) leave at their
layer's offload op in forward and come back in backward at the offload op of the layer
after theirs (prefetched one layer ahead; at their own for the chunk's last layer).
FSDP2's units add their gathered parameters where they differ from the model states'
forward-end figure (``_fsdp2_states``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simumax.graph.ops import Op

# Groups checkpointed "without output" (Megatron CheckpointWithoutOutput): their output
# is discarded too and recomputed, even where a later op saved it.
WITHOUT_OUTPUT = ("attn_norm", "mlp_norm", "mla_q_norm", "mla_kv_norm", "moe_act", "mla_up")


@dataclass(frozen=True, slots=True)
class WalkResult:
    stored: float  # bytes kept per micro-batch between its forward and backward
    fwd_peak: float  # max live bytes of this micro-batch during its forward
    bwd_peak: float  # max live bytes of this micro-batch during its backward
    fwd_peak_op: str  # name of the op at the forward peak ("" in a chunk's walk: see fwd_peak_at)
    bwd_peak_op: str
    fwd_peak_at: int = -1  # position of that op in the ops walked (a chunk's: memory/chunk_walk.op_name_at)
    bwd_peak_at: int = -1


def walk(ops: list[Op]) -> WalkResult:
    # one pass over the ops for what the forward and backward walks look up: recompute
    # groups, saved names, each tensor's first op (its backward releases it) and last saver
    groups: dict[str, list[int]] = {}
    first_use: dict[str, int] = {}
    last_user: dict[str, int] = {}
    offload_at: list[int] = []
    unit_ends: list[int] = []  # FSDP2 units' sharding ops
    for i, o in enumerate(ops):
        for name, _ in o.saved:
            last_user[name] = i
            if name not in first_use:
                first_use[name] = i
        if o.recompute_group:
            groups.setdefault(o.recompute_group, []).append(i)
            for name, _ in o.input:
                if name not in first_use:
                    first_use[name] = i
        if o.offloads:
            offload_at.append(i)
        if o.unit_gathered:
            unit_ends.append(i)
    # an output no op saves is freed as soon as the re-run forward consumes it, so only
    # saved tensors come back for backward (all of them are still dropped in forward)
    saved_names = last_user.keys()
    dropped: dict[str, dict[str, float]] = {}
    kept_names: set[str] = set()
    discarded: set[str] = set()  # outputs of groups checkpointed without output
    for gid, idx in groups.items():
        # a checkpoint keeps what enters the group from outside (not what members produce)
        produced: set[str] = set()
        for i in idx:
            m = ops[i]
            if m.output is not None:
                produced.add(m.output[0])
            for t in m.also_outputs:  # RoPE writes k beside q
                produced.add(t[0])
        keep: set[str] = set()
        tensors: dict[str, float] = {}
        for i in idx:
            m = ops[i]
            for name, _ in m.input:
                if name not in produced:
                    keep.add(name)
            for name, nbytes in m.saved:
                tensors[name] = nbytes
            if m.output is not None:
                tensors[m.output[0]] = m.output[1]
            for name, nbytes in m.also_outputs:
                tensors[name] = nbytes
        last_out = ops[idx[-1]].output
        if last_out is not None and not gid.endswith(WITHOUT_OUTPUT):
            keep.add(last_out[0])
        elif last_out is not None:  # all of the checkpointed function's outputs (MLA's q, k and v)
            discarded.add(last_out[0])
            discarded.update(t[0] for t in ops[idx[-1]].also_outputs)
        kept_names |= keep
        dropped[gid] = {n: b for n, b in tensors.items() if n not in keep}
    # a discarded output stays discarded where another checkpoint starts from it (Megatron's
    # norm recompute before a recomputed MLP: CheckpointWithoutOutput frees the storage the
    # MLP's checkpoint holds, and brings it back before either backward)
    kept_names -= discarded
    all_dropped = {n for t in dropped.values() for n in t}

    release: dict[int, list[str]] = {}
    for name, i in first_use.items():
        release.setdefault(i, []).append(name)

    reload_at: dict[int, list[tuple[str, float]]] = {}
    for k, i in enumerate(offload_at):  # in backward, the layer after brings this one's back
        at = offload_at[k + 1] if k + 1 < len(offload_at) else i
        reload_at.setdefault(at, []).extend(ops[i].offloads)

    # forward
    copy_at, delta_at = _fsdp2_states(ops, unit_ends) if unit_ends else ({}, {})
    live: dict[str, float] = {}
    live_total = 0.0
    fwd_peak, fwd_op, fwd_at = 0.0, "", -1
    for at, o in enumerate(ops):
        if copy_at and at in copy_at:  # an FSDP2 unit's all-gather copy-out, before its first op
            unit_end, add = copy_at[at]
            if live_total + add > fwd_peak:
                fwd_peak, fwd_op, fwd_at = live_total + add, ops[unit_end].name, unit_end
        extra = 0.0
        for kept in (o.saved, o.input) if o.recompute_group else (o.saved,):
            for name, nbytes in kept:
                if all_dropped and name in all_dropped and name not in kept_names:
                    extra += nbytes  # exists while the checkpointed forward runs, then freed
                elif name not in live:
                    live[name] = nbytes
                    live_total += nbytes
        here = live_total + o.fwd_transient + extra
        if here > fwd_peak:
            fwd_peak, fwd_op, fwd_at = here, o.name, at
        for name, _ in o.offloads:  # copied to the host while the layer ran: freed
            live_total -= live.pop(name, 0.0)
    stored = live_total

    # backward: a group's tensors come back before the first backward that needs them
    last_of_group: dict[int, list[str]] = {}
    for gid, idx in groups.items():
        at = max([idx[-1]] + [last_user.get(n, -1) for n in dropped[gid]])
        last_of_group.setdefault(at, []).append(gid)
    delta = 0.0
    bwd_peak, bwd_op, bwd_at = 0.0, "", -1
    for i in range(len(ops) - 1, -1, -1):
        o = ops[i]
        if delta_at:
            delta = delta_at.get(i, delta)
        if reload_at:
            for name, nbytes in reload_at.get(i, ()):
                if name not in live:
                    live[name] = nbytes
                    live_total += nbytes
        if last_of_group:
            for gid in last_of_group.get(i, ()):
                for name, nbytes in dropped[gid].items():
                    if name in saved_names and name not in live:
                        live[name] = nbytes
                        live_total += nbytes
        here = live_total + o.bwd_transient + delta
        if here > bwd_peak:
            bwd_peak, bwd_op, bwd_at = here, o.name, i
        for name in release.get(i, ()):
            live_total -= live.pop(name, 0.0)
    return WalkResult(stored, fwd_peak, bwd_peak, fwd_op, bwd_op, fwd_at, bwd_at)


def _fsdp2_states(ops: list[Op], ends: list[int]) -> tuple[dict[int, tuple[int, float]], dict[int, float]]:
    """FSDP2's gathered parameters as its units run, against what the model states hold
    (``fsdp2_states``: every unit kept gathered from its forward, plus the last unit's
    all-gather output), by the position of each unit's sharding op (``ends``: its last op;
    the unit's ops precede it).

    Forward, {first op of a unit: (its sharding op, bytes to add)} at the unit's copy-out:
    the units before it that are kept, its all-gather output and the parameters copied out of
    it, and the previous unit's all-gather output, which ``wait_for_unshard`` frees only
    when it returns (``prev_all_gather_state`` holds it through the copy-out).

    Backward, {position: bytes to add from there on}: the root's post-forward has freed the
    last all-gather output (``FSDPState._post_forward``); the loss runs before the output
    layer's pre-backward (outside its module), the root having prefetched it; a unit
    resharded after forward is gathered again for its backward and its predecessor
    prefetched (``FSDPParamGroup.pre_backward``, ``_backward_prefetch``); every unit reshards
    after its backward (``post_backward``), so one kept from its forward is freed once its
    backward is done (torch ``distributed/fsdp/_fully_shard``)."""
    g = [ops[e].unit_gathered for e in ends]
    kept = [0.0 if ops[e].unit_regathered else ops[e].unit_gathered for e in ends]
    copy_at = {}
    kept_from = sum(kept)  # kept units from this one on (not gathered yet)
    for n, e in enumerate(ends):
        copy_at[ends[n - 1] + 1 if n else 0] = (e, 2 * g[n] + (g[n - 1] if n else 0.0) - kept_from - g[-1])
        kept_from -= kept[n]
    delta_at = {}
    freed = g[-1]  # the last all-gather's output
    # the loss runs outside the output layer's unit, before its pre-backward (the root has
    # prefetched it by then)
    last = len(ends) - 1
    delta_at[ends[last]] = g[last] - kept[last] - freed
    for n in range(last, -1, -1):
        start = ends[n]
        if n == last:
            start = next((i for i in range(start - 1, ends[n - 1] if n else -1, -1) if ops[i].module != "loss"), start)
        regathered = 0.0 if kept[n] else g[n]
        before = g[n - 1] - kept[n - 1] if n else 0.0
        delta_at[start] = regathered + before - freed
        freed += kept[n]
    return copy_at, delta_at
