"""Llama3-8B, TP1 PP2 DP4 on 8 A100 PCIe: time, MFU and memory per stage (the SimuMax
tutorial's first example, with this package's API)."""

from simumax import ModelConfig, PerfLLM, StrategyConfig, SystemConfig
from simumax.config.loader import load_model, load_strategy, load_system

# configs from the shipped presets (ModelConfig.init_from_config_file(path) reads your own)
model: ModelConfig = load_model("llama3-8b")
strategy: StrategyConfig = load_strategy("tp1_pp2_dp4_mbs1")
system: SystemConfig = load_system("a100_pcie")

perf = PerfLLM().configure(strategy_config=strategy, model_config=model, system_config=system)
perf.run_estimate()
cost, mem = perf.analysis_cost(), perf.analysis_mem()
print(f"iteration {cost.duration_time_per_iter * 1e3:.1f} ms, MFU {cost.mfu:.1%}, "
      f"{cost.throughput_per_accelerator:.0f} tokens/s/GPU")
for s in mem.stages:
    print(f"stage {s.stage}: peak {s.peak_mem / 2**30:.2f} GiB at {s.peak_path['phase']} {s.peak_path['op']}")
