"""Muon, as megatron-core 0.19 runs it (``--optimizer muon``; ``optimizer/emerging_optimizers.py``
``TensorParallelMuon``, ``layer_wise_optimizer.py`` ``LayerWiseDistributedOptimizer``).

Which parameters: every 2-D weight but the embedding and the output layer
(``is_managed_by_layer_wise_optimizer``: linear weights, the experts' and the router's); the
rest (embeddings, output layer, norms, biases) go to ``muon_scalar_optimizer`` (Adam, or Lion
with one moment). A Muon step per weight
(emerging_optimizers' ``OrthogonalizedOptimizer.step`` with Megatron's defaults: Nesterov,
decoupled weight decay, spectral scale): the weight decay of the fp32 master, the momentum
``lerp_`` into one fp32 buffer (``momentum_buffer``), the Nesterov ``lerp``, the
orthogonalisation by ``muon_num_ns_steps`` Newton–Schulz iterations (Frobenius normalise,
then quintic A = X·Xᵀ, B = b·A + c·A·A, X = a·X + B·X on the short side, m ≤ n: 4·m²·n + 2·m³
FLOPs each), the scale (two multiplications), the master update and its cast to the bf16
parameter (bf16 training wraps it in ``Float16OptimizerWithFloat16Params``). The iterations
run on fp32 tensors at ``fp32_matmul_prec="medium"``, which PyTorch's cuBLAS path runs as TF32
(measured on the lent H100: the same time at "medium" and "high", 2.1x a bf16 iteration's);
each ``addmm`` first copies its fp32 input into the output and then accumulates into it.
The optimizer loops over weights in Python, about 31 PyTorch ops each, so a small weight's
step is the host's time (``system.host_op_us`` per op), a large one's the GPU's; the queue
between them lets one hide the other over a rank's weights.
With ``muon_split_qkv`` (the default) the fused
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
from simumax.graph.kernels import TF32_PREFIX, Gemm, Kernel, MemBound
from simumax.graph.ops import Op, Stage

FP32 = 4
TF32_MATMUL = TF32_PREFIX + "matmul"
# PyTorch ops of one weight's step from Python besides its iterations (weight decay, two
# lerps, normalise: norm / clamp / expand / divide, two scale products, update, cast) and per
# iteration (a transposed view, the product, two addmm): what the host issues
HOST_OPS_PER_STEP, HOST_OPS_PER_ITERATION = 11, 4


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
    """One weight's Newton–Schulz iterations on its short side (TF32 GEMMs; each ``addmm``
    copies its fp32 input into its output, then accumulates) and the normalisation before
    (norm, then divide: read twice, write once)."""
    a, b = sorted((m.rows, m.cols))
    one = [Gemm(a, b, a, "TN", out_dtype="fp32", family=TF32_MATMUL),
           MemBound("muon.addmm_copy", 2.0 * FP32 * a * a),
           Gemm(a, a, a, "NN", accumulate=True, out_dtype="fp32", family=TF32_MATMUL),
           MemBound("muon.addmm_copy", 2.0 * FP32 * a * b),
           Gemm(a, a, b, "NN", accumulate=True, out_dtype="fp32", family=TF32_MATMUL)]
    return [MemBound("muon.normalise", 3.0 * FP32 * a * b, launches=2), *one * steps]


def elementwise_kernels(m: Matrix, param_bytes: int) -> list[Kernel]:
    """The rest of one weight's step (fp32 master, gradient, momentum, update): weight decay,
    the momentum and Nesterov ``lerp``, the two scale products, the master update, its cast."""
    e = float(m.rows * m.cols)
    return [MemBound("muon.weight_decay", 2.0 * FP32 * e), MemBound("muon.momentum", 3.0 * FP32 * e),
            MemBound("muon.nesterov", 3.0 * FP32 * e), MemBound("muon.scale", 4.0 * FP32 * e, launches=2),
            MemBound("muon.update_master", 3.0 * FP32 * e), MemBound("muon.cast", (FP32 + param_bytes) * e)]


def step_kernels(m: Matrix, st: StrategyConfig) -> list[Kernel]:
    """Every kernel of one weight's step: its iterations and the element-wise rest."""
    return [*ns_kernels(m, st.muon_num_ns_steps), *elementwise_kernels(m, st.dtype_bytes)]


def host_seconds(steps: int, host_op_us: float) -> float:
    """The host's time to issue one weight's step."""
    return (HOST_OPS_PER_STEP + HOST_OPS_PER_ITERATION * steps) * host_op_us * 1e-6


def ns_flops(m: Matrix, steps: int) -> float:
    """FLOPs of one weight's orthogonalisation: steps x (4·m²·n + 2·m³), m the short side."""
    a, b = sorted((m.rows, m.cols))
    return steps * (4.0 * a * a * b + 2.0 * a ** 3)


def step_seconds(model: ModelConfig, st: StrategyConfig, stage: Stage, cost: Callable[[Kernel], float],
                 host_op_us: float) -> float:
    """The Muon part of one rank's step: per weight it steps, its kernels (``ns_kernels``,
    ``elementwise_kernels``) on the GPU and ``host_seconds`` on the host; over the rank's
    weights the longer of the two sums. With the distributed optimizer the weights go to the
    dp ranks (experts: edp) as Megatron packs them, largest first onto the least-filled rank
    by size (``_compute_per_buffer_param_layout``'s LPT, here over the rank's whole model
    chunk rather than bucket by bucket), and the busiest rank sets the time: the
    Newton-Schulz work grows with a weight's short side, which the packing by size does not
    see."""
    host = host_seconds(st.muon_num_ns_steps, host_op_us)
    held = stage_matrices(model, st, stage)
    total = 0.0
    for expert in (False, True):
        mats = [(m, n) for m, n in held if m.expert == expert]
        if not mats:
            continue
        per = [(m.rows * m.cols, sum(map(cost, step_kernels(m, st))), n) for m, n in mats]
        owners = 1 if st.zero_state < 1 else (st.edp_size if expert else st.dp_shard_size)
        total += _busiest_owner(per, owners, host)
    return total


def _busiest_owner(weights: list[tuple[int, float, int]], owners: int, host: float = 0.0) -> float:
    """Seconds of the busiest of ``owners`` ranks when (size, GPU seconds, how many) weights
    are packed largest first onto the rank holding the fewest elements; a rank takes the
    longer of its weights' GPU seconds and the host's ``host`` seconds per weight."""
    if owners == 1:
        return max(sum(t * n for _, t, n in weights), sum(n for *_, n in weights) * host)
    items = sorted(((size, t) for size, t, n in weights for _ in range(n)), reverse=True)
    if owners >= len(items):
        return max(max(t, host) for _, t in items)
    heap = [(0, i) for i in range(owners)]  # (elements held, rank)
    seconds = [0.0] * owners
    counts = [0] * owners
    for size, t in items:
        held, rank = heapq.heappop(heap)
        seconds[rank] += t
        counts[rank] += 1
        heapq.heappush(heap, (held + size, rank))
    return max(max(t, n * host) for t, n in zip(seconds, counts))
