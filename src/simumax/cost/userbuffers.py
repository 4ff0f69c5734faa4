"""TP communication overlap as TransformerEngine's userbuffers run it (``tp_comm_overlap``;
``transformer_engine/pytorch/module/base.py`` ``initialize_ub`` and its default method per
GEMM, the layout NeMo's ``tp_comm_overlap_cfg`` files use):

* **ring exchange** — an all-gather feeding a GEMM (column-parallel forward, row-parallel
  data gradient): the GEMM runs in tp chunks of M/tp rows, each while the next chunk arrives
  by P2P on the copy engines (no SMs taken): (tp - 1) · max(chunk GEMM, one step's transfer)
  + one chunk GEMM. Each chunk is a smaller GEMM, so it runs at that shape's efficiency.
* **pipeline** — a GEMM feeding a reduce-scatter (row-parallel forward): the GEMM runs in 4
  splits of M/4 rows on the SMs the communication kernel leaves it (TE's default 16, with
  ``set_sm_margin``), each split's reduce-scatter under the next split; the last one is exposed.
* **bulk** — the column-parallel backward's input re-gather and gradient reduce-scatter run
  beside its GEMMs, which TE plans for the SMs its communication kernels leave (default 16,
  ``set_sm_margin`` on for every method but ring exchange since TE 2.0, ``get_default_config``;
  ``CommOverlapBase::_math_sms``): max(G · SMs / (SMs - 16), C).

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


def chunked_gemm_time(g: Gemm, chunks: int, time_of: Callable[[Kernel], float]) -> float:
    """One chunk of ``g`` with M / chunks rows (the shape's own efficiency)."""
    return time_of(g._replace(m=max(1, math.ceil(g.m / chunks))))


def ring_time(g: Gemm, ag: float, tp: int, time_of: Callable[[Kernel], float]) -> tuple[float, float]:
    """(seconds of GEMM and transfers together, of which exposed transfer)."""
    chunk = chunked_gemm_time(g, tp, time_of)
    step = ag / max(1, tp - 1)
    total = (tp - 1) * max(chunk, step) + chunk
    return total, (tp - 1) * max(0.0, step - chunk)


def pipeline_time(g: Gemm, rs: float, sm_count: int | None, time_of: Callable[[Kernel], float]) -> tuple[float, float]:
    """(seconds of GEMM and reduce-scatter together, of which exposed reduce-scatter)."""
    chunk = chunked_gemm_time(g, PIPELINE_SPLITS, time_of) * margin_factor(sm_count)
    part = rs / PIPELINE_SPLITS
    total = chunk + (PIPELINE_SPLITS - 1) * max(chunk, part) + part
    return total, (PIPELINE_SPLITS - 1) * max(0.0, part - chunk) + part
