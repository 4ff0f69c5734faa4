"""The fastest strategy for Llama3-8B on 16 A100s with a global batch of 64 sequences
(every legal TP/PP/recompute/ZeRO combination that fits), and its Megatron-LM flags."""

from simumax import PerfLLM
from simumax.export.megatron_flags import megatron_flags, model_flags
from simumax.config.strategy import StrategyConfig

perf = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama3-8b", system_config="a100_pcie")
rows = perf.search_best_parallel_strategy_with_recompute(16, gmi_error=2, global_batch_size=64)
fit = [r for r in rows if r.fits]
print(f"{len(fit)} of {len(rows)} strategies fit")
for r in fit[:5]:
    print(f"{r.label:55s} {r.iter_time * 1e3:8.1f} ms  MFU {r.mfu:.1%}  peak {r.peak_mem / 2**30:.1f} GiB")
best = StrategyConfig.init_from_dict(fit[0].strategy)
print(" ".join(model_flags(perf.model_config) + megatron_flags(best, perf.model_config)))
