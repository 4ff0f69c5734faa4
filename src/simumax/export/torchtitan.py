"""A strategy as a torchtitan job-config snippet (TOML: the ``[parallelism]``,
``[training]`` and ``[activation_checkpoint]`` sections of torchtitan's JobConfig).

torchtitan shards with FSDP2 over ``data_parallel_shard_degree`` (x context parallel) and
replicates over ``data_parallel_replicate_degree`` (HSDP); the product of the degrees is the
world size. Only what this package models is written; the rest keeps torchtitan's defaults."""

from __future__ import annotations

from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError

SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb": "InterleavedZeroBubble", "dualpipev": "DualPipeV"}


def torchtitan_toml(st: StrategyConfig) -> str:
    if st.fsdp_impl == "deepspeed":
        raise ConfigError("fsdp_impl", "torchtitan shards with FSDP2, not DeepSpeed: export --format deepspeed instead")
    if st.optimizer != "adam":  # the TOML says no optimizer: torchtitan would run its AdamW
        raise ConfigError("optimizer", "the torchtitan export writes no optimizer section (torchtitan's AdamW): "
                          "export an adam strategy, or --format megatron for muon")
    if st.zero_state < 3 and st.dp_size > 1:
        raise ConfigError("zero_state", "torchtitan shards with FSDP2 (zero_state 3); set zero_state=3 to export it")
    replicate = st.fsdp_replicate_size
    if st.cp_size > 1 and replicate > 1 and st.dp_size % replicate:
        raise ConfigError("fsdp_replicate_size", f"must divide dp ({st.dp_size}) for torchtitan's mesh")
    shard = st.dp_size // replicate if st.dp_size % replicate == 0 else st.dp_size
    rc = st.recompute_mode
    mode = {"none": "none", "full_block": "full"}.get(rc, "selective")
    lines = [
        "[parallelism]",
        f"data_parallel_replicate_degree = {replicate}",
        f"data_parallel_shard_degree = {shard}",
        f"tensor_parallel_degree = {st.tp_size}",
        f"context_parallel_degree = {st.cp_size}",
        f"pipeline_parallel_degree = {st.pp_size}",
    ]
    if st.pp_size > 1:
        lines += [f'pipeline_parallel_schedule = "{SCHEDULES[st.schedule]}"',
                  f"pipeline_parallel_microbatch_size = {st.micro_batch_size}"]
    policy = st.fsdp_reshard_after_forward
    if st.fsdp_impl == "megatron_torch_fsdp2" and policy == "default":  # Megatron's wrapper reshards every unit
        policy = "always"
    if st.fsdp2 and policy != "default":
        lines.append(f'fsdp_reshard_after_forward = "{policy}"')
    if st.ep_size > 1:
        lines.append(f"expert_parallel_degree = {st.ep_size}")
    if st.tp_size > 1:
        lines.append(f"enable_async_tensor_parallel = {'true' if st.tp_comm_overlap else 'false'}")
    lines += [
        "",
        "[training]",
        # per data-parallel rank and step: the pipeline splits it into micro-batches; without
        # a pipeline torchtitan accumulates global / (local x dp) steps
        f"local_batch_size = {st.micro_batch_size * (st.micro_batch_num if st.pp_size > 1 else 1)}",
        f"global_batch_size = {st.global_batch_size}",
        f"seq_len = {st.seq_len}",
        "",
        "[activation_checkpoint]",
        f'mode = "{mode}"',
    ]
    if mode == "selective":
        lines.append('selective_ac_option = "op"')
    return "\n".join(lines) + "\n"
