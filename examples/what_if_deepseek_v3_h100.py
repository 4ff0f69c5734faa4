"""DeepSeek-V3 on 1,024 H100s (EP64, PP8, full recompute): which hardware resource bounds the
step? Each resource is made 2x better in turn (faster NICs or faster GPUs?), then the same for
a cluster with half the NICs per node (`nics_per_node` 4)."""

from simumax import PerfLLM
from simumax.config.loader import load_model, load_strategy, load_system

model = load_model("deepseek-v3")
strategy = load_strategy("ep8_pp1_dp8_mbs1").with_updates({
    "world_size": 1024, "ep_size": 64, "pp_size": 8, "micro_batch_num": 32,
    "num_layers_in_first_pipeline_stage": 5, "num_layers_in_last_pipeline_stage": 8,
    "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None,
})
for nics in (8, 4):
    system = load_system("h100-sxm-80gb").with_updates({"nics_per_node": nics})
    perf = PerfLLM().configure(strategy_config=strategy, model_config=model, system_config=system)
    base = perf.analysis_cost().duration_time_per_iter
    print(f"{nics} NICs per node: {base * 1e3:.0f} ms per iteration")
    for w in perf.what_if(2.0):
        print(f"  {w.resource:<22} x2: {w.time * 1e3:8.0f} ms ({w.change:+.1%})")
