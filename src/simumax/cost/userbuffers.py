"""TP communication overlap as TransformerEngine's userbuffers run it (``tp_comm_overlap``;
``transformer_engine/pytorch/module/base.py`` ``initialize_ub`` and its default method per
GEMM, the layout NeMo's ``tp_comm_overlap_cfg`` files use):

* **ring exchange** — an all-gather feeding a GEMM (column-parallel forward, row-parallel
  data gradient): the GEMM runs in tp chunks of M/tp rows, chunk i once the ring's i-th P2P
  step has brought its rows (copy engines, no SMs taken). Each chunk is a smaller GEMM, so it
  runs at that shape's efficiency.
* **pipeline** — a GEMM feeding a reduce-scatter (row-parallel forward): the GEMM runs in 4
  splits of M/4 rows on the SMs the communication kernel leaves it (TE's default 16, with
  ``set_sm_margin``), each split's reduce-scatter once that split is done; the last one is exposed.
* **bulk** — the column-parallel backward's input re-gather and gradient reduce-scatter run
  beside its GEMMs, which TE plans for the SMs its communication kernels leave (default 16,
  ``set_sm_margin`` on for every method but ring exchange since TE 2.0, ``get_default_config``;
  ``CommOverlapBase::_math_sms``): max(G · SMs / (SMs - 16), C).

The chunk (split) GEMMs of the first two go round-robin onto TE's compute streams, at most
three (``_NUM_MAX_UB_STREAMS`` in ``pytorch/cpp_extensions/gemm.py``,
``NVTE_COMM_OVERLAP_MAX_STREAMS`` in ``comm_gemm_overlap.h``; ``min(3, splits)`` streams),
so chunks whose rows are there run side by side and fill the SMs one small chunk leaves
idle: j chunks running together cost one GEMM of j chunks' rows.

Told the SM count to plan for, cuBLAS has no tail of tiles waiting for the communication's
SMs, so these GEMMs pay SMs / (SMs - 16) and not the larger slowdown of a GEMM that meets an
SM-holding kernel unannounced (``accelerator.sm_contention``, docs/calibration.md).

Other kernels of the phase (casts, amax reductions) run before and after as usual.
"""

from __future__ import annotations

import math
from typing import Callable

from simumax.graph.kernels import Collective, Gemm, Kernel

PIPELINE_SPLITS = 4  # TE default num_splits of the pipelined reduce-scatter overlap
UB_STREAMS = 3  # TE's compute streams for the chunk GEMMs (_NUM_MAX_UB_STREAMS)
COMM_SMS = 16  # TE default num_sm of the pipeline and bulk methods' kernels (set_sm_margin: the GEMM gets the rest)


def margin_factor(sm_count: int | None) -> float:
    """A GEMM planned for the SMs the communication kernel leaves: its time over the whole device's."""
    return sm_count / (sm_count - COMM_SMS) if sm_count and sm_count > COMM_SMS else 1.0


def _tp(k: Kernel, op: str) -> bool:
    return isinstance(k, Collective) and k.group == "tp" and k.op == op


def overlap_method(kernels: tuple[Kernel, ...]) -> str | None:
    """Which userbuffers method covers a phase: ring, pipeline, bulk, or None (no TP
    all-gather / reduce-scatter beside a GEMM)."""
    gemm_at = [i for i, k in enumerate(kernels) if isinstance(k, Gemm)]
    if len(gemm_at) != 1:
        return "bulk" if gemm_at and any(_tp(k, "all_gather") or _tp(k, "reduce_scatter") for k in kernels) else None
    g = gemm_at[0]
    ag_before = any(_tp(k, "all_gather") for k in kernels[:g])
    rs_after = any(_tp(k, "reduce_scatter") for k in kernels[g + 1:])
    if ag_before and rs_after:
        return "bulk"
    if ag_before:
        return "ring"
    if rs_after:
        return "pipeline"
    return None


def chunked_gemm_time(g: Gemm, chunks: int, time_of: Callable[[Kernel], float], together: int = 1) -> float:
    """``together`` chunks of ``g`` (M / chunks rows each) running side by side: one GEMM of
    their rows (the shape's own efficiency)."""
    return time_of(g._replace(m=max(1, math.ceil(g.m / chunks)) * together))


def ring_time(g: Gemm, ag: float, tp: int, time_of: Callable[[Kernel], float]) -> tuple[float, float]:
    """(seconds of GEMM and transfers together, of which the GEMMs wait for rows). Chunk 0
    is local, chunk i arrives after i transfer steps and runs on stream i mod streams once
    the chunk before it there is done; chunks running together share the SMs as one GEMM of
    their rows does (each finishes its own part in that GEMM's time)."""
    step = ag / max(1, tp - 1)
    done, idle = shared_streams([i * step for i in range(tp)], min(UB_STREAMS, tp),
                                lambda j: chunked_gemm_time(g, tp, time_of, j))
    return max(done), idle


def shared_streams(ready: list[float], streams: int, together: Callable[[int], float]) -> tuple[list[float], float]:
    """(when each chunk ends, idle) of equal chunks, chunk i ready at ``ready[i]`` and issued
    round-robin on ``streams`` streams (it starts once ready and once chunk i - streams is
    done), where j chunks running at once each finish their work in ``together(j)`` seconds:
    every running chunk progresses at 1 / together(j) of its work per second. ``idle``: the
    time no chunk runs before the last ends (waiting for rows)."""
    n = len(ready)
    left = [1.0] * n  # work left, as a share of the chunk
    done = [math.inf] * n
    t = idle = 0.0
    started = 0  # chunks started, in order: chunk i cannot start before chunk i - 1 (issue order)
    running: list[int] = []
    while started < n or running:
        if started < n:
            prev = done[started - streams] if started >= streams else 0.0
            start_at = max(ready[started], prev)
        else:
            start_at = math.inf
        if not running:
            if start_at > t:
                idle += start_at - t
            t = max(t, start_at)
            running.append(started)
            started += 1
            continue
        per = together(len(running))  # seconds for a whole chunk at this sharing
        finish_at = t + min(left[i] for i in running) * per
        if start_at < finish_at:
            for i in running:
                left[i] -= (start_at - t) / per
            t = start_at
            running.append(started)
            started += 1
        else:
            for i in running:
                left[i] -= (finish_at - t) / per
            t = finish_at
            for i in [i for i in running if left[i] <= 1e-12]:
                done[i] = t
                running.remove(i)
    return done, idle


def pipeline_time(g: Gemm, rs: float, sm_count: int | None, time_of: Callable[[Kernel], float]) -> tuple[float, float]:
    """(seconds of GEMM and reduce-scatter together, of which exposed reduce-scatter). The
    splits need nothing from each other: all there at once, they share the streams
    (``shared_streams``: three together, then the fourth), each split's part of the
    reduce-scatter (one stream) after it is done."""
    part = rs / PIPELINE_SPLITS
    margin = margin_factor(sm_count)
    done, _ = shared_streams([0.0] * PIPELINE_SPLITS, min(UB_STREAMS, PIPELINE_SPLITS),
                             lambda j: chunked_gemm_time(g, PIPELINE_SPLITS, time_of, j) * margin)
    comm_end = 0.0
    for end in sorted(done):
        comm_end = max(comm_end, end) + part
    busy = max(done)
    total = max(busy, comm_end)
    return total, total - busy
