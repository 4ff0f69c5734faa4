"""Llama3-70B on 64 H100s, TP4 with full recompute: what each sharding level and
implementation costs in memory and time — Megatron's distributed optimizer (ZeRO-1),
Megatron-FSDP (ZeRO-2/3), PyTorch FSDP2 as torchtitan runs it, DeepSpeed ZeRO — and
what offloading the optimizer to the host saves."""

from simumax import PerfLLM
from simumax.config.loader import load_model, load_strategy
from simumax.errors import ConfigError

model = load_model("llama3-70b")
base = load_strategy("tp1_pp2_dp4_mbs1").with_updates({
    "world_size": 64, "tp_size": 4, "pp_size": 1, "enable_sequence_parallel": True, "micro_batch_num": 4,
    "enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": None,
}, source="example")
variants = [("ZeRO-0 (DDP)", {"zero_state": 0}), ("ZeRO-1 (distributed optimizer)", {"zero_state": 1})]
variants += [(f"ZeRO-{z} {impl}", {"zero_state": z, "fsdp_impl": impl}) for z in (2, 3) for impl in ("megatron_fsdp", "deepspeed")]
variants += [("ZeRO-3 torch_fsdp2", {"zero_state": 3, "fsdp_impl": "torch_fsdp2"}),
             ("ZeRO-1 + optimizer CPU offload", {"zero_state": 1, "optimizer_cpu_offload": True})]
print(f"{'strategy':34s} {'iteration ms':>12s} {'peak GiB':>9s}  fits")
for name, fields in variants:
    try:
        perf = PerfLLM().configure(strategy_config=base.with_updates(fields, source="example"), model_config=model,
                                   system_config="h100-sxm-80gb")
        cost, mem = perf.analysis_cost(), perf.analysis_mem()
    except ConfigError as exc:  # a combination the framework refuses
        print(f"{name:34s} refused: {exc}")
        continue
    print(f"{name:34s} {cost.duration_time_per_iter * 1e3:12.1f} {mem.peak_mem / 2**30:9.1f}  {mem.fits}")
