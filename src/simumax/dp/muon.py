"""Muon, as megatron-core 0.19 runs it (``--optimizer muon``; ``optimizer/emerging_optimizers.py``
``TensorParallelMuon``, ``layer_wise_optimizer.py`` ``LayerWiseDistributedOptimizer``).

Which parameters: every 2-D weight but the embedding and the output layer
(``is_managed_by_layer_wise_optimizer``: linear weights, the experts' and the router's); the
rest (embeddings, output layer, norms, biases) go to ``muon_scalar_optimizer`` (Adam, or Lion
with one moment). A Muon step per weight: the momentum update of the fp32 gradient (one fp32
buffer, ``momentum_buffer``), its orthogonalisation by ``muon_num_ns_steps`` Newton–Schulz
iterations (quintic: A = X·Xᵀ, B = b·A + c·A·A, X = a·X + B·X on the short side, m ≤ n:
4·m²·n + 2·m³ FLOPs each, in fp32 at the "medium" matmul precision, so on the bf16 tensor
cores), and the update of the fp32 master, cast to the bf16 parameter (bf16 training wraps
it in ``Float16OptimizerWithFloat16Params``). With ``muon_split_qkv`` (the default) the fused
QKV weight is orthogonalised as its q, k and v parts; Megatron's ``--muon-tp-mode blockwise``
(its default, the one modelled) orthogonalises each TP rank's shard on its own.

With the distributed optimizer (``zero_state`` 1: ``--use-distributed-optimizer``, which
makes Muon layer-wise) each data-parallel rank owns whole weights — bin-packed by size, about
1/dp of them (experts over the expert-data-parallel group) — steps only those and all-gathers
the parameters, as ZeRO-1 moves them; without it every rank steps every weight.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph.kernels import Gemm, Kernel, MemBound
from simumax.graph.ops import Op, Stage

FP32 = 4


@dataclass(frozen=True, slots=True)
class Matrix:
    rows: int
    cols: int
    count: int  # this many alike weights per layer (a rank's local experts)
    expert: bool


def _linear_weights(o: Op) -> list[Matrix]:
    """The 2-D weights of a TE linear op on this rank (``weight_shapes``); an expert op's
    shape stands for each of its local experts."""
    return [Matrix(n, k, max(1, o.expert_params // (n * k)), True) if o.expert_params else Matrix(n, k, 1, False)
            for n, k in o.weight_shapes]


def _op_matrices(o: Op, model: ModelConfig, st: StrategyConfig) -> list[Matrix]:
    """The Muon-managed weights of one op on this rank, as Muon orthogonalises them."""
    if o.module == "router":
        return [Matrix(model.expert_num or 1, model.hidden_size, 1, False)]
    out = []
    for m in _linear_weights(o):
        if o.module == "qkv" and not m.expert and st.muon_split_qkv:
            out += [Matrix(r, m.cols, 1, False) for r in _qkv_rows(model, st, m.rows)]
        else:
            out.append(m)
    return out


def _qkv_rows(model: ModelConfig, st: StrategyConfig, n: int) -> list[int]:
    """Megatron's QKV split shapes on this rank (``_get_qkv_split_shapes``: q, with the output
    gate another q, then k and v); the fused weight when they do not add up to it."""
    hd = model.head_size
    q = model.head_num // st.tp_size * hd
    kv = max(model.kv_head_num // st.tp_size, 1) * hd
    rows = [q, q, kv, kv] if model.attention_output_gate else [q, kv, kv]
    return rows if sum(rows) == n else [n]


def stage_matrices(model: ModelConfig, st: StrategyConfig, stage: Stage) -> list[tuple[Matrix, int]]:
    """(weight, how many) of every Muon-managed weight the rank holds."""
    out: list[tuple[Matrix, int]] = []
    for ops, times in stage.groups():
        for o in ops:
            out += [(m, m.count * times) for m in _op_matrices(o, model, st)]
    return out


def muon_params(stage: Stage) -> tuple[int, int]:
    """(dense, expert) elements of the rank's Muon-managed weights: the TE linears' and the
    experts' weights (``weight_shapes``) and the router's."""
    dense = expert = 0
    for ops, times in stage.groups():
        for o in ops:
            if o.module == "router":  # its [E, h] weight is all the op's parameters
                dense += o.params * times
                continue
            for m in _linear_weights(o):
                if m.expert:
                    expert += m.rows * m.cols * m.count * times
                else:
                    dense += m.rows * m.cols * times
    return dense, expert


def ns_kernels(m: Matrix, steps: int) -> list[Kernel]:
    """One weight's Newton–Schulz iterations (on its short side) and the normalisation before."""
    a, b = sorted((m.rows, m.cols))
    one = [Gemm(a, b, a, "TN", out_dtype="fp32"), Gemm(a, a, a, "TN", out_dtype="fp32"), Gemm(a, a, b, "TN", out_dtype="fp32")]
    return [MemBound("muon.normalise", 3.0 * FP32 * a * b), *one * steps]


def ns_flops(m: Matrix, steps: int) -> float:
    """FLOPs of one weight's orthogonalisation: steps x (4·m²·n + 2·m³), m the short side."""
    a, b = sorted((m.rows, m.cols))
    return steps * (4.0 * a * a * b + 2.0 * a ** 3)


def step_seconds(model: ModelConfig, st: StrategyConfig, stage: Stage, cost: Callable[[Kernel], float]) -> float:
    """The Muon part of one rank's step: per weight it steps, the momentum update (read the
    fp32 gradient and the buffer, write the buffer), the orthogonalisation, the master update
    (read master and update, write master) and its cast to the parameter. With the
    distributed optimizer the weights go to the dp ranks (experts: edp) as Megatron packs them,
    largest first onto the least-filled rank by size (``_compute_per_buffer_param_layout``'s
    LPT, here over the rank's whole model chunk rather than bucket by bucket), and the rank
    whose weights take longest sets the time: the Newton-Schulz work grows with a weight's
    short side, which the packing by size does not see."""
    total = 0.0
    for expert in (False, True):
        mats = [(m, n) for m, n in stage_matrices(model, st, stage) if m.expert == expert]
        if not mats:
            continue
        per = [(m.rows * m.cols, sum(map(cost, ns_kernels(m, st.muon_num_ns_steps)))
                + cost(MemBound("muon.momentum_update", m.rows * m.cols * 3.0 * FP32))
                + cost(MemBound("muon.update_master", m.rows * m.cols * (3.0 * FP32 + FP32 + st.dtype_bytes))), n)
               for m, n in mats]
        if st.zero_state < 1:
            total += sum(t * n for _, t, n in per)
            continue
        total += _busiest_owner(per, st.edp_size if expert else st.dp_shard_size)
    return total


def _busiest_owner(weights: list[tuple[int, float, int]], owners: int) -> float:
    """Seconds of the busiest of ``owners`` ranks when (size, seconds, how many) weights are
    packed largest first onto the rank holding the fewest elements."""
    items = sorted(((size, t) for size, t, n in weights for _ in range(n)), reverse=True)
    if owners >= len(items):
        return max(t for _, t in items)
    heap = [(0, i) for i in range(owners)]  # (elements held, rank)
    seconds = [0.0] * owners
    for size, t in items:
        held, rank = heapq.heappop(heap)
        seconds[rank] += t
        heapq.heappush(heap, (held + size, rank))
    return max(seconds)
