"""A strategy as a DeepSpeed config (``ds_config.json``): batch sizes, precision and the
``zero_optimization`` section (stage, overlap_comm, buckets, optimizer offload).

DeepSpeed's config holds no model parallelism: TP / PP / CP / EP sizes go to the launcher
(Megatron-DeepSpeed flags, a PipelineModule's stage count). Only what this package models
is written; the rest keeps DeepSpeed's defaults."""

from __future__ import annotations

from typing import Any

from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError


def deepspeed_config(st: StrategyConfig) -> dict[str, Any]:
    if st.fsdp_impl != "deepspeed":
        raise ConfigError("fsdp_impl", "set fsdp_impl=deepspeed (and zero_state 1-3) to export a DeepSpeed config")
    zero: dict[str, Any] = {
        "stage": st.zero_state,
        "overlap_comm": st.ds_overlap,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": st.ds_reduce_bucket_size,
    }
    if st.zero_state == 3:
        zero["stage3_prefetch_bucket_size"] = st.ds_prefetch_bucket_size
        zero["stage3_max_reuse_distance"] = st.ds_max_reuse_distance
    if st.optimizer_cpu_offload:
        offload: dict[str, Any] = {"device": "cpu", "pin_memory": True}
        if st.optimizer_offload_fraction < 1:
            if st.zero_state != 3:
                raise ConfigError("optimizer_offload_fraction", "DeepSpeed offloads part of the optimizer "
                                  "(offload_optimizer.ratio) only at ZeRO-3")
            offload["ratio"] = st.optimizer_offload_fraction
        zero["offload_optimizer"] = offload
    return {
        "train_batch_size": st.global_batch_size,
        "train_micro_batch_size_per_gpu": st.micro_batch_size,
        "gradient_accumulation_steps": st.micro_batch_num,
        "bf16": {"enabled": st.dtype == "bf16"},
        "fp16": {"enabled": st.dtype == "fp16"},
        "zero_optimization": zero,
    }
