"""Strategy-search speed on the two reference workloads (targets on 2 cores):

* DeepSeek-V3 (61 layers) on 2048 GPUs, gbs 16384, mbs 1, tp 1/2/4/8, ep 8/16/32/64,
  every legal pp in 1..61 (uneven first/last stages), three recompute modes, a100_pcie:
  <= 4 s (SimuMax: 42 s).
* Llama3-70B on 1024 GPUs, gbs 1024, the full space: tp 1/2/4/8, every pp, vp 1/2/4,
  cp 1/2, mbs 1/2/4, five recompute variants, ZeRO 0/1: <= 60 s.
* Llama 3.1 405B on 16,384 GB200 GPUs, gbs 2048 x 8192 tokens, tp 1-8, every pp, vp 1/2/4,
  cp 1/2, mbs 1/2, recompute none/selective/full, ZeRO 0/1, Megatron's four overlap options
  on: <= 15 s with --jobs 2; and with ZeRO 0-3 and host offload (none / optimizer /
  activations / both) in the space: <= 60 s.

    python benchmarks/bench_search.py [--jobs 2]
"""

from __future__ import annotations

import argparse
import time

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.search.run import run_search
from simumax.search.space import ALL_RECOMPUTE, SearchSpace

WORKLOADS = {
    "deepseek-v3 2048 GPUs": (
        "deepseek-v3", "ep8_pp1_dp8_mbs1", 4.0,
        SearchSpace(world_size=2048, global_batch_size=16384, tp=(1, 2, 4, 8), ep=(8, 16, 32, 64), mbs=(1,),
                    recompute=("none", "selective", "full_block")),
    ),
    "llama3-70b 1024 GPUs": (
        "llama3-70b", "tp1_pp2_dp4_mbs1", 60.0,
        SearchSpace(world_size=1024, global_batch_size=1024, tp=(1, 2, 4, 8), vp=(1, 2, 4), cp=(1, 2), mbs=(1, 2, 4),
                    recompute=ALL_RECOMPUTE, zero=(0, 1)),
    ),
    "llama3.1-405b 16384 GPUs": (
        "llama3-405b_padding_128", "tp1_pp2_dp4_mbs1", 15.0,
        SearchSpace(world_size=16384, global_batch_size=2048, tp=(1, 2, 4, 8), vp=(1, 2, 4), cp=(1, 2), mbs=(1, 2),
                    recompute=("none", "selective", "full_block"), zero=(0, 1)),
    ),
    "llama3.1-405b 16384 GPUs, ZeRO 0-3 + offload": (
        "llama3-405b_padding_128", "tp1_pp2_dp4_mbs1", 60.0,
        SearchSpace(world_size=16384, global_batch_size=2048, tp=(1, 2, 4, 8), vp=(1, 2, 4), cp=(1, 2), mbs=(1, 2),
                    recompute=("none", "selective", "full_block"), zero=(0, 1, 2, 3),
                    offload=("none", "optimizer", "activations", "both")),
    ),
}
# per workload: the system and fixed strategy fields (the 405B job as production runs it:
# sequence 8192, every Megatron overlap option on, GB200; the base strategy at TP 8 with SP, as
# Megatron accepts tp_comm_overlap only there; the search still tries every TP)
SETUP = {
    "llama3.1-405b 16384 GPUs": ("gb200-nvl72", {
        "seq_len": 8192, "tp_size": 8, "world_size": 64, "overlap_grad_reduce": True, "overlap_param_gather": True, "tp_comm_overlap": True,
        "overlap_p2p_comm": True,
    }),
}
SETUP["llama3.1-405b 16384 GPUs, ZeRO 0-3 + offload"] = SETUP["llama3.1-405b 16384 GPUs"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="substring of a workload name")
    args = ap.parse_args()
    print(f"{'workload':24s} {'candidates':>10s} {'fit':>6s} {'seconds':>8s} {'target':>7s}  best")
    for name, (model, strategy, target, space) in WORKLOADS.items():
        if args.only and args.only not in name:
            continue
        sys_name, fields = SETUP.get(name, ("a100_pcie", {}))
        system = load_system(sys_name)
        m, st = load_model(model), load_strategy(strategy).with_updates(fields)
        t0 = time.perf_counter()
        rows = run_search(m, system, st, space, gmi_error=4, jobs=args.jobs)
        dt = time.perf_counter() - t0
        best = rows[0].label if rows and rows[0].fits else "-"
        n_fit = sum(r.fits for r in rows)
        print(f"{name:24s} {len(rows):10d} {n_fit:6d} {dt:8.2f} {target:7.0f}  {best}")


if __name__ == "__main__":
    main()
