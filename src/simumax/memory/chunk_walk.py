"""A model chunk's activation walk (memory/activation_walk.py) from a shorter chunk.

Past its first layers, every further layer of one kind adds the same bytes D to what a
micro-batch keeps, and the walk's peaks are maxima over ops whose live bytes grow by D per
layer before them: each peak is max(E, K + c·D) in the run's layer count c, so once one
more layer raises it by exactly D it rises by D with every layer after (no op's live bytes
grow faster). A chunk with runs of >= MIN_RUN layers of one kind is walked with BASE layers
per such run, then one more in each run (and in all of them at once, which rules out two
ops tied at the base with different growth), the tensor names following the shortened
layer indices; when every step is exactly D (> 0) the chunk's walk is the base walk plus
D per missing layer, its peak ops the same positions counted from the run's end. Otherwise
(and for the MTP block, whose layers are named past the model's) the whole chunk is
walked. A 32-layer chunk costs four layers' walk instead of 32, and no layer's ops under
its own names need making (tests/test_chunk_walk.py holds it equal to the full walk).
"""

from __future__ import annotations

from typing import Callable

from simumax.graph.ops import Op, Stage, StagePart
from simumax.graph.relabel import Relabeler
from simumax.memory.activation_walk import WalkResult, walk

MIN_RUN = 4  # runs at least this long are shortened
BASE = 2  # layers a shortened run keeps in the base walk
REL_TOL = 1e-12  # steps "exactly D": within this share of the peak


def shaped_walk(chunk: Stage, relabeler: Callable[[StagePart], Relabeler], extrapolate: bool = True) -> WalkResult:
    """The chunk's walk, its peak ops by position in the chunk's op order (names left
    empty: ``op_name_at``); ``relabeler(run)`` renames the run's ops to another layer index.
    ``extrapolate`` False walks every layer (checkpoints spanning several layers, whose
    group names a renamed layer would not carry)."""
    pre, runs, post = chunk.sections()
    counts = [len(r.layers) for r in runs]
    long = [i for i, c in enumerate(counts) if c >= MIN_RUN]
    if extrapolate and long and not any(o.layer >= 0 for o in post):
        got = _extrapolated(chunk, pre, runs, post, counts, long, relabeler)
        if got is not None:
            return got
    w = walk(chunk.ops)
    return WalkResult(w.stored, w.fwd_peak, w.bwd_peak, "", "", w.fwd_peak_at, w.bwd_peak_at)


def _extrapolated(chunk: Stage, pre: list[Op], runs: list[StagePart], post: list[Op], counts: list[int], long: list[int],
                  relabeler: Callable[[StagePart], Relabeler]) -> WalkResult | None:
    # the ops after the layers read the last layer's output: renamed to the shortened last
    post_names = Relabeler(post, chunk.layers[-1]) if post else None

    def walk_at(cs: list[int]) -> WalkResult:
        ops, idx = list(pre), chunk.layers[0]
        for run, c in zip(runs, cs):
            for _ in range(c):
                # a layer of the run keeps its own ops (made once per family); others renamed
                ops.extend(run.expand(idx) if run.expand and run.layers[0] <= idx <= run.layers[-1] else relabeler(run).to(idx))
                idx += 1
        if post_names is not None:
            ops.extend(post_names.to(idx - 1))
        return walk(ops)

    def real_position(p: int, cs: list[int]) -> int:
        """An op's position in the shortened chunk -> in the real one (layers of a run
        counted from its end)."""
        if p < len(pre):
            return p
        short = real = len(pre)
        for run, c, n_real in zip(runs, cs, counts):
            n = len(run.ops)
            if p < short + c * n:
                off = p - short
                from_end = c - 1 - off // n
                return real + (n_real - 1 - from_end) * n + off % n
            short += c * n
            real += n_real * n
        return real + p - short

    base = [BASE if i in long else c for i, c in enumerate(counts)]
    w0 = walk_at(base)
    tol = REL_TOL * max(w0.fwd_peak, w0.bwd_peak, 1.0)
    deltas = {}
    last: tuple[WalkResult, list[int]] = (w0, base)
    for i in long:
        cs = list(base)
        cs[i] += 1
        w = walk_at(cs)
        d = w.stored - w0.stored
        if d <= tol or abs(w.fwd_peak - w0.fwd_peak - d) > tol or abs(w.bwd_peak - w0.bwd_peak - d) > tol:
            return None
        deltas[i] = d
        last = (w, cs)
    if len(long) > 1:  # all runs one layer longer at once: the same ops must peak
        cs = [c + 1 if i in deltas else c for i, c in enumerate(base)]
        w, total = walk_at(cs), sum(deltas.values())
        if any(abs(a - b - total) > tol for a, b in ((w.stored, w0.stored), (w.fwd_peak, w0.fwd_peak), (w.bwd_peak, w0.bwd_peak))):
            return None
        last = (w, cs)
    w1, cs1 = last
    fi, bi = real_position(w1.fwd_peak_at, cs1), real_position(w1.bwd_peak_at, cs1)
    if (fi, bi) != (real_position(w0.fwd_peak_at, base), real_position(w0.bwd_peak_at, base)):
        return None  # the peak op moved between the short walks: not settled
    extra = sum((counts[i] - base[i]) * d for i, d in deltas.items())
    return WalkResult(w0.stored + extra, w0.fwd_peak + extra, w0.bwd_peak + extra, "", "", fi, bi)


def _locate(chunk: Stage, position: int) -> tuple[int, int, int] | None:
    """Where the chunk's op at ``position`` is: (part index, layer of its run counted from the
    run's first, op index in the part's ``ops``); None past the chunk."""
    for i, p in enumerate(chunk.parts):
        span = len(p.ops) * p.times
        if position < span:
            layer, at = divmod(position, len(p.ops))  # (a run's layers have the same ops)
            return i, layer, at
        position -= span
    return None


def op_name_at(chunk: Stage, position: int) -> str:
    """The name of the chunk's op at ``position`` ("" for -1), without making the others."""
    if position < 0:
        return ""
    where = _locate(chunk, position)
    if where is None:
        raise IndexError("op position past the chunk")
    i, layer, at = where
    p = chunk.parts[i]
    if p.layers and p.expand is not None:
        return p.expand(p.layers[layer])[at].name
    return p.ops[at].name


def params_after(chunk: Stage, position: int) -> int:
    """Parameters of the chunk's ops after ``position`` in forward order: the weight
    gradients a backward has made when it reaches the op there (-1: none reached)."""
    where = _locate(chunk, position) if position >= 0 else None
    if where is None:
        return 0
    i, layer, at = where
    p = chunk.parts[i]
    before = sum(sum(o.params for o in q.ops) * q.times for q in chunk.parts[:i])
    return chunk.params - before - layer * sum(o.params for o in p.ops) - sum(o.params for o in p.ops[:at + 1])
