"""Time perf.simulate(out) (event simulation + Chrome trace + memory files + Gantt PNG).

Targets (on 2 cores): Llama3-8B TP2 PP1 mbc 8 on A100 PCIe <= 0.5 s (SimuMax: 19 s);
PP16 x 256 micro-batches <= 2 s; a trace of about a million events (Llama 3.1 405B, TP4
PP16 VP4, 1,536 micro-batches, overlaps on) streamed to disk <= 10 s (issue 26).

    python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import statistics
import tempfile
import time

from simumax.api import PerfLLM
from simumax.config.loader import load_strategy

CASES = [
    ("llama3-8b tp2 pp1 mbc8", "tp2_pp1_dp4_mbs1", {"micro_batch_num": 8}, 0.5),
    ("llama3-8b pp16 mbc256 1f1b", "tp1_pp2_dp4_mbs1", {"world_size": 16, "pp_size": 16, "micro_batch_num": 256}, 2.0),
    ("llama3-8b pp16 mbc256 zb", "tp1_pp2_dp4_mbs1", {"world_size": 16, "pp_size": 16, "micro_batch_num": 256, "pp_schedule": "zb"}, 2.0),
    ("llama3-8b pp8 vp2 mbc64", "tp1_pp2_dp4_mbs1", {"world_size": 8, "pp_size": 8, "interleaving_size": 2, "micro_batch_num": 64}, 2.0),
]
# (name, model, system, strategy fields, target s): the million-event trace
LARGE = [
    ("405b pp16 vp4 mbc1536 ~1M events", "llama3-405b_padding_128", "gb200-nvl72", {
        "seq_len": 8192, "micro_batch_num": 1536, "world_size": 512, "tp_size": 4, "pp_size": 16, "interleaving_size": 4,
        "enable_sequence_parallel": True, "overlap_grad_reduce": True, "overlap_param_gather": True, "overlap_p2p_comm": True,
    }, 10.0),
]


def main() -> None:
    print(f"{'case':32s} {'median s':>9s} {'target s':>9s}")
    for name, strategy, updates, target in CASES:
        st = load_strategy(strategy).with_updates(updates)
        times = []
        for _ in range(3):
            perf = PerfLLM().configure(strategy_config=st, model_config="llama3-8b", system_config="a100_pcie")
            with tempfile.TemporaryDirectory() as out:
                t0 = time.perf_counter()
                perf.simulate(out)
                times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        flag = "ok" if med <= target else "SLOW"
        print(f"{name:32s} {med:9.3f} {target:9.1f}  {flag}")
    for name, model, system, fields, target in LARGE:
        perf = PerfLLM().configure(strategy_config=load_strategy(fields), model_config=model, system_config=system)
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            res = perf.simulate(out, gantt=False)
            dt = time.perf_counter() - t0
            with open(res.files["trace"]) as f:
                events = sum(1 for line in f) - 2  # one event per line between the header and the end
        flag = "ok" if dt <= target else "SLOW"
        print(f"{name:32s} {dt:9.3f} {target:9.1f}  {flag}  ({events:,} events)")


if __name__ == "__main__":
    main()
