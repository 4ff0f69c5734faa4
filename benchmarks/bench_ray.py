"""The Ray executor's speed-up against its actor count (issue 26), on a local Ray instance
with as many CPUs as the machine has: Llama3-70B on 1024 GPUs (tp 1-8, vp 1/2, cp 1/2,
mbs 1/2, three recompute modes, ZeRO 0/1), the in-process search beside it; or, with
``--workload``, one of bench_search.py's workloads (a substring of its name): a larger
space spreads the actors' start-up (each builds its own profile cache) over more work.

    pip install 'simumax[ray]'; python benchmarks/bench_ray.py [--actors 1,2,4] [--workload offload]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.search.run import run_search
from simumax.search.space import SearchSpace


def main() -> None:
    import ray

    ap = argparse.ArgumentParser()
    ap.add_argument("--actors", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workload", default=None, help="substring of a bench_search.py workload name")
    args = ap.parse_args()
    counts = sorted({int(a) for a in args.actors.split(",")})
    ray.init(num_cpus=max(counts), include_dashboard=False, log_to_driver=False)
    m, y, base = load_model("llama3-70b"), load_system("a100_pcie"), load_strategy("tp1_pp2_dp4_mbs1")
    space = SearchSpace(world_size=1024, global_batch_size=1024, tp=(1, 2, 4, 8), vp=(1, 2), cp=(1, 2), mbs=(1, 2),
                        recompute=("none", "selective", "full_block"), zero=(0, 1))
    if args.workload:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_search import SETUP, WORKLOADS

        name = next(n for n in WORKLOADS if args.workload in n)
        model, strategy, _, space = WORKLOADS[name]
        sys_name, fields = SETUP.get(name, ("a100_pcie", {}))
        m, y, base = load_model(model), load_system(sys_name), load_strategy(strategy).with_updates(fields)
        print(f"workload: {name}")
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
