"""Time collectives with torch.distributed under torchrun and fit α-β per op.

Run on every rank (``torchrun --nproc-per-node N --no-python simumax calibrate-comm ...``):
NCCL on GPUs, gloo on CPU. For each group size n (consecutive ranks, all groups of that
size running at once, as TP groups do in training) and message size, every rank times its
group's collective (median of repeats); the slowest rank's time counts. The fit is the
cost model's own formula (cost/network.py): bytes * scale * (n + offset) / n over the
tier bandwidth times efficiency, plus latency.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from simumax.calibrate.comm_points import OPS, CommPoint, fit_points, fit_points_by_size
from simumax.calibrate.contention import ContentionPoint
from simumax.calibrate.contention import measure as measure_beside_gemms
from simumax.calibrate.fit import AlphaBeta
from simumax.calibrate.timing import synchronize


@dataclass
class CommCalibration:
    backend: str
    world_size: int
    per_node: int  # ranks per node (torchrun's LOCAL_WORLD_SIZE): the world's when on one node
    points: list[CommPoint]
    contention: list[ContentionPoint] = field(default_factory=list)  # calibrate/contention.py

    def fits(self) -> dict[str, AlphaBeta]:
        return fit_points(self.points)

    def fits_by_size(self) -> dict[str, dict[int, AlphaBeta]]:
        return fit_points_by_size(self.points)


def _op_fn(op: str, nbytes: int, n: int, group, group_ranks: list[int], device: torch.device):
    """A callable running one collective of ``nbytes`` logical bytes on ``group``."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    esize = torch.empty((), dtype=dtype).element_size()
    count = max(n, nbytes // esize // n * n)  # divisible by the group size
    if op == "all_reduce":
        x = torch.randn(count, dtype=dtype, device=device)
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        x = torch.randn(count // n, dtype=dtype, device=device)
        y = torch.empty(count, dtype=dtype, device=device)
        return lambda: dist.all_gather_into_tensor(y, x, group=group)
    if op == "reduce_scatter":
        x = torch.randn(count, dtype=dtype, device=device)
        y = torch.empty(count // n, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(y, x, group=group)
    if op == "all2all":
        x = torch.randn(count, dtype=dtype, device=device)
        y = torch.empty_like(x)
        return lambda: dist.all_to_all_single(y, x, group=group)
    # p2p: first rank of each pair sends to the second
    x = torch.randn(count, dtype=dtype, device=device)
    rank = dist.get_rank()
    first, second = group_ranks[0], group_ranks[1]

    def p2p():
        if rank == first:
            dist.send(x, second)
        elif rank == second:
            dist.recv(x, first)

    return p2p


def _time(fn, device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        dist.barrier()
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


CONTENTION_OPS = ("reduce_scatter", "all_gather", "all2all")  # what runs beside compute in training


def run_collectives(
    sizes: list[int], group_sizes: list[int] | None = None, ops: tuple[str, ...] = OPS,
    warmup: int = 3, repeats: int = 10, contention: bool = False,
) -> CommCalibration:
    """Call on every rank after ``init_process_group``; every rank returns the same result.
    ``contention``: also how much the largest group's reduce-scatter, all-gather and
    all-to-all (at the largest size) slow GEMMs beside them (calibrate/contention.py)."""
    world = dist.get_world_size()
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    groups = [n for n in (group_sizes or [world]) if 2 <= n <= world and world % n == 0]
    made: dict[int, tuple[object, list[int]]] = {}

    def my_group(n: int) -> tuple[object, list[int]]:
        """This rank's group of size n and its ranks (consecutive); every rank creates every
        group of that size, once."""
        if n not in made:
            blocks = [list(range(s, s + n)) for s in range(0, world, n)]
            handles = [dist.new_group(b) for b in blocks]
            made[n] = handles[rank // n], blocks[rank // n]
        return made[n]

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    points: list[CommPoint] = []
    for n in groups:
        group, members = my_group(n)
        for op in ops:
            if op == "p2p" and n != 2:
                continue
            for nbytes in sizes:
                fn = _op_fn(op, nbytes, n, group, members, device)
                # consecutive ranks: a group larger than a node spans n / local nodes
                points.append(CommPoint(op, n, nbytes, _world_max(_time(fn, device, warmup, repeats), device),
                                        nodes=max(1, n // local) if n > local else 1))
    beside: list[ContentionPoint] = []
    if contention and groups:
        n = max(groups)
        group, members = my_group(n)
        for op in (o for o in CONTENTION_OPS if o in ops):
            fn = _op_fn(op, max(sizes), n, group, members, device)
            beside.append(measure_beside_gemms(op, n, max(sizes), fn, lambda x: _world_max(x, device), device))
    return CommCalibration(dist.get_backend(), world, local, points, beside)


def _world_max(x: float, device: torch.device) -> float:
    """The largest ``x`` over every rank (an all-reduce: it also lines the ranks up)."""
    t = torch.tensor([x], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
