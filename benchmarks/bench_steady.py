"""Estimate cost against the micro-batch count (issue 26): Llama 3.1 405B, TP4 PP16 VP4 on
the GB200 preset, with Megatron's four overlap options on and off, at 24 to 3,072
micro-batches. Each figure is the median of 7 runs of Estimate(...).cost() + memory(),
cold (a fresh estimate: graph built, schedules made) and warm (a search's shared
ProfileCache). Target: <= 20 ms per estimate at 384 micro-batches, and flat in the count.

    python benchmarks/bench_steady.py [--full]   # --full: also time the full simulation

Machine: print platform and CPU count so a regression can be read against the machine.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.estimate import Estimate
from simumax.profiles import ProfileCache
from simumax.simulate.iteration import simulate_iteration

BASE = {"seq_len": 8192, "micro_batch_size": 1, "world_size": 4 * 16 * 8, "tp_size": 4, "pp_size": 16,
        "interleaving_size": 4, "enable_sequence_parallel": True, "zero_state": 1, "use_flash_sdp": True}
OVERLAPS = {"overlap_grad_reduce": True, "overlap_param_gather": True, "tp_comm_overlap": True, "overlap_p2p_comm": True}
COUNTS = (32, 96, 384, 3072)


def _median_ms(fn, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(full: bool) -> None:
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    model, system = load_model("llama3-405b_padding_128"), load_system("gb200-nvl72")
    head = f"{'overlaps':8s} {'micro-batches':>13s} {'cold ms':>8s} {'warm ms':>8s}"
    print(head + (f" {'full sim ms':>11s}" if full else ""))
    for label, extra in (("off", {}), ("on", OVERLAPS)):
        for m in COUNTS:
            st = load_strategy({**BASE, **extra, "micro_batch_num": m})
            cache = ProfileCache(model, system)
            Estimate(model, st, system, cache).cost()  # warm the shared cache
            # a fresh ProfileCache: graph built and schedules made again (an Estimate without
            # one would share the cache kept with the system config, ProfileCache.of)
            cold = _median_ms(lambda: (lambda e: (e.cost(), e.memory()))(Estimate(model, st, system, ProfileCache(model, system))))
            warm = _median_ms(lambda: (lambda e: (e.cost(), e.memory()))(Estimate(model, st, system, cache)))
            row = f"{label:8s} {m:13d} {cold:8.1f} {warm:8.1f}"
            if full:
                est = Estimate(model, st, system, cache)
                row += f" {_median_ms(lambda: simulate_iteration(est), 3):11.1f}"
            print(row)


if __name__ == "__main__":
    main("--full" in sys.argv[1:])
