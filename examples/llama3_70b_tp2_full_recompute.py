"""Llama3-70B (first 12 layers) with TP2 and full recompute on B200: does it fit, and what
does recompute cost? Writes the results, configs and plots to out/llama3_70b_tp2/."""

from simumax import PerfLLM
from simumax.config.loader import load_model, load_strategy

model = load_model("llama3-70b").with_updates({"layer_num": 12}, source="example")
full = load_strategy("tp2_pp1_dp4_mbs1_full_recompute")
none = full.with_updates({"enable_recompute": False}, source="example")
for name, st in (("full recompute", full), ("no recompute", none)):
    perf = PerfLLM().configure(strategy_config=st, model_config=model, system_config="b200-sxm-180gb")
    cost, mem = perf.analysis_cost(), perf.analysis_mem()
    print(f"{name}: {cost.duration_time_per_iter * 1e3:.1f} ms, peak {mem.peak_mem / 2**30:.1f} GiB, fits: {mem.fits}")
perf.analysis("out/llama3_70b_tp2")
