"""The Ray executor's speed-up against its actor count (issue 26), on a local Ray instance
with as many CPUs as the machine has: Llama3-70B on 1024 GPUs (tp 1-8, vp 1/2, cp 1/2,
mbs 1/2, three recompute modes, ZeRO 0/1), the in-process search beside it.

    pip install 'simumax[ray]'; python benchmarks/bench_ray.py [--actors 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.search.run import run_search
from simumax.search.space import SearchSpace


def main() -> None:
    import ray

    ap = argparse.ArgumentParser()
    ap.add_argument("--actors", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    counts = sorted({int(a) for a in args.actors.split(",")})
    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False)
    m, y, base = load_model("llama3-70b"), load_system("a100_pcie"), load_strategy("tp1_pp2_dp4_mbs1")
    space = SearchSpace(world_size=1024, global_batch_size=1024, tp=(1, 2, 4, 8), vp=(1, 2), cp=(1, 2), mbs=(1, 2),
                        recompute=("none", "selective", "full_block"), zero=(0, 1))
    t = time.perf_counter()
    rows = run_search(m, y, base, space)
    local = time.perf_counter() - t
    print(f"{platform.machine()}, {os.cpu_count()} CPUs; {len(rows)} candidates; in process {local:.1f} s")
    best = {}
    for n in counts:
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            run_search(m, y, base, space, jobs=n, executor="ray")
            times.append(time.perf_counter() - t)
        best[n] = min(times)
        print(f"ray, {n} actor(s): {best[n]:.1f} s (best of {args.repeats}), speed-up vs 1 actor {best[counts[0]] / best[n]:.2f}x")


if __name__ == "__main__":
    main()
