"""DeepSeek-V2 (4 layers, as the validation runs), EP4 PP2 DP4 with selective recompute."""

from simumax import PerfLLM
from simumax.config.loader import load_model

model = load_model("deepseekv2").with_updates({"layer_num": 4}, source="example")
perf = PerfLLM().configure(strategy_config="ep4_pp2_dp4_mbs1_selective_recompute", model_config=model, system_config="a100_pcie")
cost, mem = perf.analysis_cost(), perf.analysis_mem()
print(f"iteration {cost.duration_time_per_iter * 1e3:.1f} ms, MFU {cost.mfu:.1%}")
print("breakdown (ms):", {k: round(v * 1e3, 1) for k, v in cost.breakdown.items() if v})
print("peak per stage (GiB):", [round(s.peak_mem / 2**30, 2) for s in mem.stages])
