"""The rules between a strategy's fields (a broken one is a ConfigError naming the field):
divisibility of the parallel sizes, combinations Megatron-LM / TransformerEngine /
DeepSpeed refuse, schedule and recompute consistency."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simumax.config.megatron_rules import (
    check_megatron_torch_fsdp2,
    check_optimizer_offload_rules,
    check_overlap_rules,
    check_precision_rules,
)
from simumax.errors import ConfigError

if TYPE_CHECKING:
    from simumax.config.strategy import StrategyConfig


def check_rules(st: "StrategyConfig") -> None:
    denom = st.tp_size * st.cp_size * st.pp_size
    if st.world_size % denom:
        raise ConfigError("world_size", f"must be divisible by tp*cp*pp = {denom} (got {st.world_size})")
    _check_sharding(st)
    if st.fp8_on and st.fp4_on:
        raise ConfigError("fp4", "cannot be combined with fp8 (Megatron runs one low-precision recipe)")
    if st.use_math_sdp and st.use_flash_sdp:
        raise ConfigError("use_math_sdp", "cannot be true together with use_flash_sdp")
    if st.interleaving_size > 1 and st.pp_size == 1:
        raise ConfigError("interleaving_size", "virtual pipeline needs pp_size > 1")
    if st.enable_sequence_parallel and st.tp_size > 1 and st.seq_len % (st.tp_size * st.cp_size):
        raise ConfigError("seq_len", f"must be divisible by tp*cp = {st.tp_size * st.cp_size} with sequence parallelism")
    if st.rank_order == "tp-cp-ep-pp-dp" and st.cp_size > 1 and st.fsdp_replicate_size > 1:
        raise ConfigError("rank_order", "tp-cp-ep-pp-dp with context parallelism and HSDP (fsdp_replicate_size > 1) is "
                          "not modelled (its shard and replica groups split DP x CP blocks)")
    hcp = st.hierarchical_context_parallel_sizes
    if st.cp_comm_type == "a2a+p2p" and st.cp_size > 1:
        if not hcp or len(hcp) != 2 or hcp[0] * hcp[1] != st.cp_size:
            raise ConfigError("hierarchical_context_parallel_sizes", f"a2a+p2p needs [all-to-all size, ring size] "
                              f"whose product is cp_size {st.cp_size} (got {hcp})")
    elif hcp is not None and st.cp_size > 1:
        raise ConfigError("hierarchical_context_parallel_sizes", "is read with cp_comm_type a2a+p2p only (Megatron)")
    if st.cp_size > 1 and st.seq_len % (2 * st.cp_size):
        raise ConfigError("seq_len", f"must be divisible by 2*cp = {2 * st.cp_size} for context parallelism")
    if st.document_lengths is not None:
        _check_documents(st)
    if (st.ep_size * st.etp_size) > 1 and (st.dp_size * st.cp_size * st.tp_size) % (st.ep_size * st.etp_size):
        raise ConfigError(
            "ep_size", f"ep*etp ({st.ep_size * st.etp_size}) must divide tp*cp*dp ({st.dp_size * st.cp_size * st.tp_size})"
        )
    _check_schedule(st)
    if st.overlap_moe_expert_parallel_comm:
        if st.ep_size == 1:
            raise ConfigError("overlap_moe_expert_parallel_comm", "needs expert parallelism (ep_size > 1)")
        if st.pp_size > 1 and st.schedule not in ("interleaved", "dualpipev"):
            raise ConfigError(
                "overlap_moe_expert_parallel_comm", "with pp_size > 1 needs the interleaved (or dualpipev) schedule, as Megatron"
            )
        # megatron-core TransformerConfig.__post_init__ asserts each of these
        if st.recompute_mode == "full_block":
            raise ConfigError("overlap_moe_expert_parallel_comm", "cannot be combined with full recompute (Megatron)")
        if "moe" in st.recomputed_modules:
            raise ConfigError("megatron_recompute_modules", "'moe' cannot be recomputed with "
                              "overlap_moe_expert_parallel_comm (Megatron)")
    if st.delay_wgrad_compute and not st.overlap_moe_expert_parallel_comm:
        raise ConfigError("delay_wgrad_compute", "needs overlap_moe_expert_parallel_comm")
    if st.optimizer_cpu_offload and st.zero_state < 1:
        raise ConfigError("optimizer_cpu_offload", "needs the distributed optimizer (zero_state >= 1), as Megatron")
    if st.fine_grained_activation_offloading != bool(st.offload_modules):
        raise ConfigError("offload_modules", "fine_grained_activation_offloading and offload_modules go together "
                          "(Megatron: --fine-grained-activation-offloading --offload-modules core_attn ...)")
    if st.cpu_offloading:
        _check_cpu_offloading(st)
    _check_optimizer_dtypes(st)
    _check_muon(st)
    if st.overlap_param_gather_with_optimizer_step and not (
            st.overlap_param_gather and st.zero_state == 1 and st.fsdp_impl != "deepspeed" and st.interleaving_size > 1):
        raise ConfigError("overlap_param_gather_with_optimizer_step", "needs the distributed optimizer (zero_state 1), "
                          "overlap_param_gather and the interleaved schedule (interleaving_size > 1), as Megatron")
    if st.fp8_param_gather:
        if not st.fp8_on or st.fp4_on:
            raise ConfigError("fp8_param_gather", "needs fp8 (the weights are stored in the fp8 recipe's format)")
        if st.zero_state != 1 or st.fsdp_impl == "deepspeed":
            raise ConfigError("fp8_param_gather", "is modelled with Megatron's distributed optimizer (zero_state 1); "
                              "Megatron also needs it (or an FSDP), and with Megatron-FSDP it is not modelled")
    if st.recompute_method == "uniform" and st.enable_recompute:
        if st.megatron_recompute or st.recompute_granularity != "full_block":
            raise ConfigError("recompute_method", "uniform groups whole layers: it needs recompute_granularity "
                              "full_block (Megatron: --recompute-granularity full)")
        if st.recompute_layer_num == 0:
            raise ConfigError("recompute_layer_num", "must be >= 1 with recompute_method uniform (the layers per "
                              "checkpointed group; Megatron: --recompute-num-layers)")
    if st.megatron_recompute and not st.megatron_recompute_modules:
        raise ConfigError("megatron_recompute_modules", "must name at least one module when megatron_recompute is true")
    check_precision_rules(st)
    check_overlap_rules(st)
    check_optimizer_offload_rules(st)


def _check_documents(st: "StrategyConfig") -> None:
    """Packed documents (THD attention): lengths that fill the sequence, a fused attention
    that takes cu_seqlens, and with context parallelism each document in 2·cp chunks."""
    lengths = st.document_lengths
    if isinstance(lengths, list):
        if not lengths or sum(lengths) != st.seq_len:
            raise ConfigError("document_lengths", f"must sum to seq_len {st.seq_len} (got {sum(lengths)} over "
                              f"{len(lengths)} documents)")
    elif lengths is not None and lengths > st.seq_len:
        raise ConfigError("document_lengths", f"a document length ({lengths}) longer than seq_len ({st.seq_len})")
    if st.use_math_sdp or st.transformer_impl == "local":
        raise ConfigError("document_lengths", "needs TransformerEngine's fused attention (THD format); the unfused "
                          "attention takes no document boundaries (Megatron-Core's DotProductAttention refuses "
                          "packed_seq_params)")
    if st.cp_size > 1:
        odd = sorted({n for n, _ in st.document_groups if n % (2 * st.cp_size)})
        if odd:
            raise ConfigError("document_lengths", f"with context parallelism each document is split into 2*cp = "
                              f"{2 * st.cp_size} chunks (TransformerEngine's THD partitioning): lengths {odd[:4]} "
                              f"are not multiples of it (pad them, as cu_seqlens_padded does)")


def _check_muon(st: "StrategyConfig") -> None:
    """Muon as megatron-core 0.19 builds it (optimizer/__init__.py, _get_megatron_emerging_optimizer):
    no fp16, the layer-wise distributed optimizer or none, Megatron's own optimizer step."""
    if st.optimizer != "muon":
        return
    if st.dtype == "fp16":
        raise ConfigError("optimizer", "muon with fp16 is not supported (Megatron)")
    if st.zero_state >= 2 or st.fsdp_impl != "megatron_fsdp":
        raise ConfigError("optimizer", "muon is modelled with Megatron's layer-wise distributed optimizer (zero_state 1) "
                          "or none (0), not with sharded gradients or parameters or another framework's optimizer")
    if st.use_precision_aware_optimizer or st.optimizer_cpu_offload:
        raise ConfigError("optimizer", "muon with the precision-aware optimizer or optimizer offload is not modelled")
    if st.zero_state >= 1 and st.overlap_param_gather_with_optimizer_step:
        raise ConfigError("overlap_param_gather_with_optimizer_step", "is not supported with muon's layer-wise "
                          "distributed optimizer (Megatron)")
    if st.transformer_impl != "transformer_engine":
        raise ConfigError("optimizer", "muon is modelled on TransformerEngine layers (transformer_impl transformer_engine)")


def _check_optimizer_dtypes(st: "StrategyConfig") -> None:
    """Megatron's OptimizerConfig: lower-precision optimizer state needs its precision-aware
    optimizer (TransformerEngine's FusedAdam), which needs the distributed optimizer."""
    if not st.use_precision_aware_optimizer:
        for field in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            if getattr(st, field) != "fp32":
                raise ConfigError(field, "other than fp32 needs use_precision_aware_optimizer (Megatron)")
        return
    if st.zero_state < 1:
        raise ConfigError("use_precision_aware_optimizer", "needs the distributed optimizer (zero_state >= 1), as Megatron")
    if st.fsdp_impl in ("torch_fsdp2", "deepspeed") and (st.zero_state >= 2 or st.fsdp_impl == "deepspeed"):
        raise ConfigError("use_precision_aware_optimizer", f"is Megatron's optimizer option; {st.fsdp_impl} steps its own")
    if st.fsdp_impl == "megatron_torch_fsdp2":
        raise ConfigError("use_precision_aware_optimizer", "needs the distributed optimizer, which Megatron refuses "
                          "with --use-torch-fsdp2 (fsdp_impl megatron_torch_fsdp2)")


def _check_sharding(st: "StrategyConfig") -> None:
    if st.fsdp2 and st.zero_state != 3:
        raise ConfigError("fsdp_impl", f"{st.fsdp_impl} (fully_shard) shards parameters: it needs zero_state 3")
    if st.fsdp_reshard_after_forward != "default" and not st.fsdp2:
        raise ConfigError("fsdp_reshard_after_forward", "is an FSDP2 option: it needs fsdp_impl torch_fsdp2 or "
                          "megatron_torch_fsdp2")
    if st.fsdp_impl == "megatron_torch_fsdp2":
        check_megatron_torch_fsdp2(st)
    if st.fsdp_reshard_after_forward == "always" and st.fsdp_impl == "torch_fsdp2" and st.pp_size > 1:
        raise ConfigError("fsdp_reshard_after_forward", "always with pp_size > 1 (a gather in every forward and "
                          "backward under torch's pipelining) is not modelled: use default or never")
    if st.fsdp_impl == "deepspeed":
        _check_deepspeed(st)
    if st.fsdp_replicate_size > 1:
        if st.zero_state < 1:
            raise ConfigError("fsdp_replicate_size", "replicas of a sharded state need zero_state >= 1")
        if (st.dp_size * st.cp_size) % st.fsdp_replicate_size:
            raise ConfigError("fsdp_replicate_size", f"must divide dp x cp ({st.dp_size * st.cp_size})")


def _check_deepspeed(st: "StrategyConfig") -> None:
    """What DeepSpeed's ZeRO refuses (or runs as something not modelled here)."""
    if st.zero_state < 1:
        raise ConfigError("fsdp_impl", "deepspeed models ZeRO stages 1-3 (zero_state >= 1)")
    if st.zero_state >= 2 and st.pp_size > 1:
        raise ConfigError("pp_size", "DeepSpeed's pipeline engine runs ZeRO-1 only (ZeRO-2/3 are incompatible with "
                          "pipeline parallelism)")
    if st.zero_state == 3 and st.ep_size > 1:
        raise ConfigError("ep_size", "DeepSpeed-MoE does not run with ZeRO-3")
    if st.fsdp_replicate_size > 1:
        raise ConfigError("fsdp_replicate_size", "DeepSpeed's hierarchical sharding (MiCS / ZeRO++ hpZ) is not modelled")


def _check_schedule(st: "StrategyConfig") -> None:
    sched = st.schedule
    if sched == "interleaved" and st.interleaving_size == 1:
        raise ConfigError("pp_schedule", "interleaved needs interleaving_size > 1")
    if sched != "interleaved" and st.interleaving_size > 1:
        raise ConfigError("pp_schedule", f"{sched} takes no interleaving_size (got {st.interleaving_size})")
    if sched == "interleaved":
        group = st.microbatch_group_size_per_vp_stage or st.pp_size
        if st.micro_batch_num < st.pp_size:  # megatron-core: the group (pp_size by default) exceeds the micro-batches
            raise ConfigError("micro_batch_num", f"the interleaved schedule needs at least pp_size = {st.pp_size} "
                                                 f"micro-batches (got {st.micro_batch_num})")
        if not st.pp_size <= group <= st.micro_batch_num:
            raise ConfigError(
                "microbatch_group_size_per_vp_stage",
                f"must lie in [pp_size={st.pp_size}, micro_batch_num={st.micro_batch_num}] (got {group})",
            )
        rest = st.micro_batch_num % group
        if 0 < rest < st.pp_size:
            raise ConfigError(
                "micro_batch_num", f"remainder modulo the VPP micro-batch group ({group}) must be 0 or >= pp_size (got {rest})"
            )
    if sched == "dualpipev" and st.pp_size == 1:
        raise ConfigError("pp_schedule", "dualpipev needs pp_size > 1")
    if sched == "dualpipev" and st.micro_batch_num < 2 * st.pp_size:
        raise ConfigError("micro_batch_num", f"dualpipev needs at least 2*pp_size = {2 * st.pp_size} micro-batches")


def _check_cpu_offloading(st: "StrategyConfig") -> None:
    """Megatron's TransformerConfig refuses these with --cpu-offloading."""
    if st.cpu_offloading_num_layers < 1:
        raise ConfigError("cpu_offloading_num_layers", "must be >= 1 with cpu_offloading (the layers offloaded)")
    if st.pp_size > 1:
        raise ConfigError("cpu_offloading", "Megatron has no CPU offloading with pipeline parallelism (pp_size 1)")
    if st.recompute_mode != "none":
        raise ConfigError("cpu_offloading", "Megatron's CPU offloading does not work with activation recomputation")
    if st.fine_grained_activation_offloading:
        raise ConfigError("cpu_offloading", "use one activation offload: cpu_offloading or fine_grained_activation_offloading")
