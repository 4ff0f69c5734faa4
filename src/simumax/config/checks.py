"""Cross-checks that need more than one config (each config checks itself on load)."""

from __future__ import annotations

import logging
import re
from typing import Any

from simumax.config.dsa_rules import check_dsa
from simumax.config.hardware import datasheet
from simumax.config.layout import virtual_stage_layers
from simumax.config.megatron_rules import check_megatron_torch_fsdp2_model, check_moe_rules
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.graph.placement import virtual_stage_places

log = logging.getLogger(__name__)

# the tier names SimuMax's strategy files use; a system without one of them derives the
# group's tier from the cluster shape instead (cost/network.py)
SIMUMAX_TIER = re.compile(r"high_intra_node|low_intra_node|intra_node|inter_node|intra_node_pcie_\d+x")


def stage_layer_counts(model: ModelConfig, st: StrategyConfig) -> list[int]:
    """Transformer layers on each pipeline rank (all its model chunks)."""
    out = [0] * st.pp_size
    for (r, _), n in zip(virtual_stage_places(st), vstage_layer_counts(model, st)):
        out[r] += n
    return out


def vstage_layer_counts(model: ModelConfig, st: StrategyConfig) -> list[int]:
    """Transformer layers of each virtual stage (model chunk) in forward order: from the
    layout, the embedding / loss accounting, or the even / uneven-first-last split
    (config/layout.py)."""
    segments = model.hybrid_segments
    if segments is not None:  # a hybrid pattern's '|' segments are the virtual stages (Megatron's fVPP)
        stages = st.pp_size * st.chunks_per_rank
        if len(segments) != stages:
            per_rank = f"interleaving_size {len(segments) // st.pp_size}" if len(segments) % st.pp_size == 0 else \
                f"a pp_size dividing {len(segments)}"
            raise ConfigError("interleaving_size", f"the hybrid pattern's {len(segments)} '|' segments are its virtual "
                              f"stages, {stages} here (pp {st.pp_size} x {st.chunks_per_rank}): set {per_rank}")
        return segments
    custom = st.pipeline_model_parallel_layout or st.account_for_embedding_in_pipeline_split or st.account_for_loss_in_pipeline_split
    return virtual_stage_layers(model, st, [] if custom else _rank_split(model, st))


def _rank_split(model: ModelConfig, st: StrategyConfig) -> list[int]:
    """Transformer layers on each pipeline rank (Megatron's uneven first/last rule), each
    dividing evenly over the rank's model chunks."""
    pp, n = st.pp_size, model.layer_num
    first, last = st.num_layers_in_first_pipeline_stage, st.num_layers_in_last_pipeline_stage
    if pp == 1:
        if first not in (None, n) or last not in (None, n):
            raise ConfigError("num_layers_in_first_pipeline_stage", "only meaningful with pp_size > 1")
        return [n]
    fixed = (first or 0) + (last or 0)
    middle_stages = pp - (first is not None) - (last is not None)
    rest = n - fixed
    if rest < 0 or (middle_stages == 0 and rest != 0):
        raise ConfigError("num_layers_in_first_pipeline_stage", f"first+last stage layers ({fixed}) do not fit layer_num ({n}) over pp {pp}")
    if middle_stages and (rest % middle_stages or rest // middle_stages == 0):
        what = "layer_num" if fixed == 0 else "layer_num minus first/last stage layers"
        hint = "; give the first or last stage its own count (num_layers_in_first_pipeline_stage / _last_: Megatron's " \
               "--decoder-first-pipeline-num-layers), or count the embedding or the loss as a layer " \
               "(account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split)" \
            if fixed == 0 and rest // middle_stages > 0 else ""
        raise ConfigError("pp_size", f"{what} ({rest}) must split evenly and non-empty over {middle_stages} stages{hint}")
    mid = rest // middle_stages if middle_stages else 0
    counts = [mid] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    v = st.chunks_per_rank
    if v > 1 and any(c % v for c in counts):
        field = "interleaving_size" if st.schedule == "interleaved" else "pp_schedule"
        raise ConfigError(field, f"layers per stage {counts} must split into {v} equal model chunks per rank")
    return counts


def _windowed(model: ModelConfig, seq_len: int) -> bool:
    """Sliding-window attention shorter than the sequence (a window past it is full attention)."""
    return model.window_size is not None and model.window_size < seq_len


def te_cp_refusal(model: ModelConfig, seq_len: int, cp_comm_type: str) -> str | None:
    """Why TransformerEngine refuses this context-parallel scheme for the model, or None
    (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
    attn_forward_func_with_cp: a softmax type other than vanilla needs a2a, and "Context
    parallelism does not support sliding window attention" but with a2a or all_gather)."""
    if model.attention_sinks and cp_comm_type != "a2a":
        return (f"TransformerEngine runs attention sinks (a learnable softmax offset) with context parallelism only "
                f"with a2a, not {cp_comm_type}")
    if _windowed(model, seq_len) and cp_comm_type not in ("a2a", "all_gather"):
        return (f"TransformerEngine runs sliding-window attention (window_size) with context parallelism only with a2a "
                f"or all_gather, not {cp_comm_type}")
    return None


def _check_hybrid(model: ModelConfig, st: StrategyConfig) -> None:
    """Megatron's hybrid stack with a strategy (megatron/training/arguments.py, mamba_mixer.py):
    Mamba heads and groups split over TP, and over CP as MambaContextParallel splits them (the
    heads, and the groups or CP over them); virtual stages only from '|' segments of the
    pattern (which exclude first / last stage counts), no pipeline layout string."""
    tp, cp = st.tp_size, st.cp_size
    if "M" in model.hybrid_layer_pattern:  # type: ignore[operator]
        heads, groups = model.mamba_heads, model.mamba_num_groups
        if heads % tp or groups % tp:
            raise ConfigError("tp_size", f"Mamba heads ({heads}) and groups ({groups}) must be divisible by tp ({tp}), "
                              "as Megatron asserts")
        local = groups // tp
        if (heads // tp) % cp or (cp % local if local < cp else local % cp):
            raise ConfigError("cp_size", f"Mamba heads per TP rank ({heads // tp}) must divide by cp ({cp}), and the "
                              f"groups per TP rank ({local}) divide it or divide by it (MambaContextParallel)")
    segments = model.hybrid_segments is not None
    if (st.interleaving_size > 1 and not segments) or st.pipeline_model_parallel_layout \
            or st.account_for_embedding_in_pipeline_split or st.account_for_loss_in_pipeline_split:
        raise ConfigError("interleaving_size" if st.interleaving_size > 1 else "pipeline_model_parallel_layout",
                          "a hybrid stack takes its virtual stages from '|' segments of its pattern, and no layout string "
                          "or embedding / loss accounting, as Megatron asserts")
    if segments and (st.num_layers_in_first_pipeline_stage or st.num_layers_in_last_pipeline_stage):
        raise ConfigError("num_layers_in_first_pipeline_stage", "a hybrid pattern with '|' segments states every "
                          "stage's blocks, as Megatron asserts")


def _check_linear_attention(model: ModelConfig, st: StrategyConfig) -> None:
    """Gated DeltaNet's heads split over TP x CP (transformer_config.py asserts it: its
    context parallelism all-to-alls heads, not sequence chunks); with fp8 its in_proj width
    aligned for the fp8 GEMM (gated_delta_net/common.py)."""
    tp_cp = st.tp_size * st.cp_size
    for field in ("linear_num_key_heads", "linear_num_value_heads"):
        heads = getattr(model, field)
        if heads % tp_cp:
            raise ConfigError("tp_size" if heads % st.tp_size else "cp_size",
                              f"{field} ({heads}) must be divisible by tp x cp ({tp_cp}), as Megatron asserts")
    if st.fp8:  # its in_proj output feeds an fp8 GEMM (megatron-core's get_fp8_align_size)
        align = 32 if st.fp8_recipe == "mxfp8" else 16
        width = model.gdn_in_proj_width
        if width % align:
            raise ConfigError("linear_num_value_heads", f"with fp8 ({st.fp8_recipe}) the Gated DeltaNet in_proj width "
                              f"({width}) must be a multiple of {align}, as Megatron asserts")


def check_compatible(model: ModelConfig, st: StrategyConfig, system: SystemConfig) -> None:
    """Raise ConfigError for the first rule the three configs break together."""
    tp = st.tp_size
    if st.dtype == "fp32":
        # the kernels are described for 2-byte training: fp32 would cost every GEMM as a bf16
        # one (Megatron runs fp32 operands, TE's GEMM in TF32 at half the rate) and attention as
        # flash attention (TransformerEngine's fused backends take bf16 / fp16 only)
        raise ConfigError("dtype", "fp32 training is not modelled (its GEMMs would be costed as bf16 ones and its "
                          "attention as flash attention); estimate bf16 or fp16")
    if st.fsdp_impl == "megatron_torch_fsdp2":  # its strategy rules ran at load; the model's here
        check_megatron_torch_fsdp2_model(model)
    rows = model.position_rows(st.seq_len)
    if rows and rows < st.seq_len:
        raise ConfigError("seq_len", f"exceeds the learned position table (max_position_embeddings {rows}; Megatron "
                          "asserts max_position_embeddings >= seq_length)")
    if model.hybrid_layer_pattern is not None:
        _check_hybrid(model, st)
    if model.has_linear_attention:
        _check_linear_attention(model, st)
    if model.experimental_attention_variant == "dsa":
        counts = vstage_layer_counts(model, st)
        starts = [sum(counts[:i]) for i in range(len(counts))]
        check_dsa(model, st, [list(range(a, a + n)) for a, n in zip(starts, counts)])
    if model.attention_type == "mha":
        if model.head_num % tp:
            raise ConfigError("tp_size", f"head_num ({model.head_num}) must be divisible by tp ({tp})")
        kv = model.kv_head_num
        if kv % tp and tp % kv:
            raise ConfigError("tp_size", f"kv_head_num ({kv}) and tp ({tp}) must divide one another (kv heads are split or replicated)")
    elif model.head_num % tp:
        raise ConfigError("tp_size", f"head_num ({model.head_num}) must be divisible by tp ({tp})")
    elif st.transformer_impl == "local":  # MLA's down-projections: the local spec's ColumnParallelLinear splits them
        for field, what, width in (("q_lora_rank", "q_lora_rank", model.q_lora_rank or 0),
                                   ("kv_lora_rank", "kv_lora_rank + qk_pos_emb_head_dim", model.kv_lora_rank + model.qk_pos_emb_head_dim)):
            if width % tp:
                raise ConfigError(field, f"with transformer_impl local the MLA down-projection's outputs ({what} = {width}) are "
                                  f"split over TP and must be divisible by tp ({tp}), as Megatron-Core's ColumnParallelLinear asserts")
    if st.cp_size > 1 and st.cp_a2a_size > 1 and (model.head_num // tp) % st.cp_a2a_size:
        field = "cp_size" if st.cp_comm_type == "a2a" else "hierarchical_context_parallel_sizes"
        raise ConfigError(field, f"heads per TP rank ({model.head_num // tp}) must be divisible by the all-to-all's "
                          f"{st.cp_a2a_size} CP ranks")
    if not model.padded_vocab_size and model.vocab_size % tp:
        raise ConfigError("vocab_size", f"{model.vocab_size} must be divisible by tp ({tp}) without padding (padded_vocab_size: false); Megatron refuses it")
    if st.overlap_moe_expert_parallel_comm and (model.mtp_num_layers or 0) > 1:
        raise ConfigError("overlap_moe_expert_parallel_comm", f"supports at most one MTP layer (mtp_num_layers "
                          f"{model.mtp_num_layers}), as Megatron asserts")
    if model.mtp_num_layers and st.recompute_mode == "full_block" and st.recompute_group_layers > 1:
        raise ConfigError("recompute_layer_num", f"multi-token prediction with full recompute's uniform method takes one layer "
                          f"per checkpoint (got {st.recompute_group_layers}), as megatron-core asserts")
    if model.intermediate_size % tp:
        raise ConfigError("tp_size", f"intermediate_size ({model.intermediate_size}) must be divisible by tp ({tp})")
    if st.moe_shared_expert_overlap:
        # megatron-core TransformerConfig: shared experts, the all-to-all dispatcher
        if not (model.is_moe and model.moe_shared_expert_intermediate_size):
            raise ConfigError("moe_shared_expert_overlap", "needs a MoE model with shared experts")
        if st.moe_dispatcher_policy == "all_gather":
            raise ConfigError("moe_shared_expert_overlap", "needs the all-to-all or flex dispatcher, not all_gather")
        if st.overlap_moe_expert_parallel_comm:
            raise ConfigError("moe_shared_expert_overlap", "cannot be combined with overlap_moe_expert_parallel_comm "
                              "(Megatron asserts it)")
        if model.moe_latent_size:
            raise ConfigError("moe_shared_expert_overlap", "with moe_latent_size is not supported in training (Megatron)")
    if st.moe_apply_probs_on_input and not (model.is_moe and model.topk == 1):
        # megatron-core experts.py: "`moe_apply_probs_on_input` only works with `moe_router_topk`=1."
        raise ConfigError("moe_apply_probs_on_input", f"needs a MoE model with top-1 routing (topk {model.topk})")
    if model.is_moe and st.moe_router_dtype == "fp64":
        # megatron-core runs an fp64 router with torch.mm in fp64 (no TE GEMM): FP64 units no system file describes
        raise ConfigError("moe_router_dtype", "fp64 is not modelled (FP64 GEMMs, no peak for them in a system file); use fp32 or leave it unset")
    if st.moe_router_fusion and st.te_version and not st.te_at_least("2.7"):
        # megatron-core TransformerConfig.moe_router_fusion: "only supported in TransformerEngine 2.7.0 and above"
        raise ConfigError("moe_router_fusion", f"needs TransformerEngine 2.7 or later (te_version {st.te_version})")
    if model.is_moe and st.moe_dispatcher_policy == "flex" and model.moe_pad_expert_input_to_capacity:
        raise ConfigError("moe_dispatcher_policy", "flex (DeepEP) does not pad expert inputs to capacity (Megatron); "
                          "set moe_pad_expert_input_to_capacity false")
    check_moe_rules(model, st)
    if model.is_moe:
        if model.expert_num % st.ep_size:
            raise ConfigError("ep_size", f"expert_num ({model.expert_num}) must be divisible by ep ({st.ep_size})")
        if model.moe_ffn % st.etp_size:
            raise ConfigError("etp_size", f"expert hidden size ({model.moe_ffn}) must be divisible by etp ({st.etp_size})")
        if tp > 1 and not st.enable_sequence_parallel:
            raise ConfigError("enable_sequence_parallel", "Megatron requires sequence parallelism for MoE with tp > 1")
    elif st.ep_size > 1 and system.first_warning(f"ep_on_dense:{model.model_name}"):
        # SimuMax estimates such files (its strategies ship with EP sizes and its dense models
        # run under them); nothing of a dense model is split over EP (Megatron would refuse it)
        log.warning("ep_size=%d has no effect on the dense model %s (no expert layers); estimated as it is",
                    st.ep_size, model.model_name)
    refusal = te_cp_refusal(model, st.seq_len, st.cp_comm_type) if st.cp_size > 1 else None
    if refusal:
        raise ConfigError("cp_comm_type", refusal)
    if st.cpu_offloading and st.cpu_offloading_num_layers >= model.layer_num:
        raise ConfigError("cpu_offloading_num_layers", f"must be fewer than the model's layers ({model.layer_num}), as Megatron")
    if st.pp_size > model.layer_num:
        raise ConfigError("pp_size", f"must be <= layer_num ({model.layer_num})")
    stage_layer_counts(model, st)
    if st.fp8_on:
        check_fp8(st, system)
    if st.fp4_on:
        check_fp4(st, system)
    for name in ("tp_net", "cp_net", "ep_net", "etp_net", "dp_net", "pp_net", "edp_net"):
        tier = getattr(st, name)
        if tier is not None and tier not in system.networks.tiers and not SIMUMAX_TIER.fullmatch(tier):
            raise ConfigError(name, f"unknown network tier {tier!r}; system has {sorted(system.networks.tiers)}")


def _low_precision_peak(system: SystemConfig, family: str) -> Any:
    """The system's ``<family>_matmul`` spec; ConfigError naming the field when it has no peak."""
    spec = system.accelerator.op.get(f"{family}_matmul")
    if spec is None or spec.tflops <= 0:
        sheet = datasheet(system.sys_name)  # a device with the units runs their first recipe
        if sheet is not None and ("nvfp4" if family == "fp4" else "delayed") in sheet.fp8_recipes:
            measure = "; `simumax calibrate` on an fp8 job measures its table" if family == "fp8" else ""
            fix = (f"the device ({sheet.match}, {sheet.arch}) has {family.upper()} units but the file gives them no rate: "
                   f"add accelerator.op.{family}_matmul (its tflops{measure}), or turn {family} off")
        else:
            fix = f"turn {family} off"
        raise ConfigError(family, f"system {system.sys_name!r} has no {family.upper()} peak (accelerator.op.{family}_matmul); {fix}")
    return spec


def check_fp8(st: StrategyConfig, system: SystemConfig) -> None:
    """FP8 needs an FP8 peak in the system, and a device whose tensor cores run the recipe.

    A system file may claim an FP8 peak for a device without FP8 units (SimuMax's
    ``a100_pcie`` gives 624 TFLOP/s): it runs as the file says, with one warning per system."""
    spec = _low_precision_peak(system, "fp8")
    sheet = datasheet(system.sys_name)
    if sheet is None:
        return
    if not sheet.fp8_recipes:
        if system.first_warning("fp8_peak"):
            log.warning(
                "%s: accelerator.op.fp8_matmul.tflops claims an FP8 peak (%g TFLOP/s) but %s has no FP8 units; running as the file says",
                system.source or system.sys_name, spec.tflops, sheet.match,
            )
        return
    if st.fp8_recipe not in sheet.fp8_recipes:
        raise ConfigError(
            "fp8_recipe", f"{st.fp8_recipe} needs {'Blackwell' if st.fp8_recipe == 'mxfp8' else 'Hopper or later'}; "
            f"{system.sys_name} is {sheet.match} ({sheet.arch}: {', '.join(sheet.fp8_recipes)})",
        )


def check_fp4(st: StrategyConfig, system: SystemConfig) -> None:
    """FP4 needs an FP4 peak in the system and a device whose tensor cores run the recipe
    (NVFP4: Blackwell)."""
    _low_precision_peak(system, "fp4")
    sheet = datasheet(system.sys_name)
    if sheet is not None and st.lp_recipe not in sheet.fp8_recipes:
        raise ConfigError("fp4_recipe", f"{st.lp_recipe} needs Blackwell; {system.sys_name} is {sheet.match} ({sheet.arch})")
