"""A Megatron-LM command line (``pretrain_gpt.py`` arguments) as a simumax model and
strategy. Unknown flags are listed back as notes, not errors (launch scripts carry many
that do not affect time or memory: data paths, logging, learning rate ...)."""

from __future__ import annotations

import shlex
from typing import Any

from simumax.config.megatron_names import SWITCHES, VALUED, flag_of
from simumax.config.megatron_rules import check_megatron_torch_fsdp2, check_megatron_torch_fsdp2_model
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError
from simumax.importers.launch_script import LAUNCHER_FLAGS, launcher_world_size
from simumax.importers.megatron_derived import megatron_defaults, parallel_sizes
from simumax.importers.megatron_flag_tables import (IGNORED_VALUED, MUON_DEFAULT_ONLY, NO_EFFECT, NO_EFFECT_FAMILIES,
                                                    NOT_MODELLED, OLDER_NO_EFFECT)
from simumax.importers.megatron_values import (int_or_layer_list, is_one, layer_pattern, skip_freq, typed, values_after,
                                               window_keys)


def parse_megatron_args(text: str | list[str], world_size: int | None = None, name: str = "megatron") -> tuple[ModelConfig, StrategyConfig, list[str]]:
    """(model, strategy, notes). ``world_size`` defaults to the GPUs a torchrun launcher in
    the words starts, else the smallest that holds the parallel sizes with DP 1 (the
    launcher, not the arguments, decides it)."""
    try:
        tokens = shlex.split(text if isinstance(text, str) else " ".join(text))
    except ValueError as exc:  # unbalanced quotes
        raise ConfigError("arguments", f"cannot split the command line ({exc})") from None
    m: dict[str, Any] = {"model_name": name}
    s: dict[str, Any] = {"use_flash_sdp": False, "zero_state": 0, "moe_permute_fusion": False, "group_linear_mode": "serial",
                         "cross_entropy_fusion_impl": "native"}
    notes: list[str] = []
    extra: dict[str, str] = {}  # flags read now and applied after the walk, by name
    gbs = _read_flags(tokens, m, s, extra, notes)
    if world_size is None:
        world_size, read = launcher_world_size(tokens)
        if read:
            notes.append(f"world size {world_size} from the launcher: {read} (--world-size overrides it)")
    megatron_defaults(m, s, extra, notes)
    parallel_sizes(m, s, extra, notes, gbs, world_size)
    model = _by_flag("m", lambda: ModelConfig.init_from_dict(m, source="Megatron arguments"))
    strategy = _by_flag("s", lambda: StrategyConfig.init_from_dict(s, source="Megatron arguments", checked=False))
    if strategy.fsdp_impl == "megatron_torch_fsdp2":  # Megatron's refusals before the model's own
        try:
            check_megatron_torch_fsdp2(strategy)
            check_megatron_torch_fsdp2_model(model)
        except ConfigError as exc:
            raise ConfigError(flag_of("m" if exc.field.startswith("untie") else "s", exc.field) or exc.field, exc.rule) from None
    _by_flag("s", strategy.check)
    return model, strategy, notes


def _read_flags(tokens: list[str], m: dict[str, Any], s: dict[str, Any], extra: dict[str, str], notes: list[str]) -> int | None:
    """Walk the command line: model (``m``) and strategy (``s``) fields a flag sets alone,
    ``extra`` for what later rules combine, ``notes`` for flags read past; returns
    --global-batch-size."""
    gbs = None
    no_effect: list[str] = []
    not_modelled: dict[str, list[str]] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        flag, _, inline = tok.partition("=")
        value = inline or (tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else None)
        step = 1 if inline or value is None else 2
        if flag in VALUED:
            if value is None:
                raise ConfigError(flag, "needs a value")
            target, field, typ = VALUED[flag]
            (m if target == "m" else s)[field] = typed(flag, value, typ)
        elif flag in SWITCHES:
            target, field, val = SWITCHES[flag]
            (m if target == "m" else s)[field] = val
            step = 1
        elif flag == "--global-batch-size" and value is not None:
            gbs = typed(flag, value)
            if gbs < 1:
                raise ConfigError("--global-batch-size", f"must be >= 1 (got {gbs})")
        elif flag == "--normalization" and value is not None:
            m["norm_type"] = "rmsnorm" if value.lower() == "rmsnorm" else "layernorm"
        elif flag == "--position-embedding-type" and value is not None:
            m["position_embedding_type"] = {"learned_absolute": "learned_absolute", "none": "none"}.get(value, "rope")
        elif flag == "--num-layers-per-virtual-pipeline-stage" and value is not None:
            extra["vp_layers"] = value
        elif flag == "--moe-token-dispatcher-type" and value is not None:
            if value not in ("allgather", "alltoall", "alltoall_seq", "flex"):
                raise ConfigError(flag, f"expected allgather, alltoall, alltoall_seq or flex, got {value!r}")
            s["moe_dispatcher_policy"] = {"allgather": "all_gather", "flex": "flex"}.get(value, "all2all")
        elif flag in ("--moe-deepep-num-sms", "--moe-hybridep-num-sms") and value is not None:
            # megatron-core routes the deprecated per-backend knobs to moe_flex_dispatcher_num_sms
            s.setdefault("moe_flex_dispatcher_num_sms", typed(flag, value))
        elif flag == "--moe-flex-dispatcher-backend" and value is not None:
            if value not in ("deepep", "hybridep", "ncclep"):
                raise ConfigError(flag, f"expected deepep, hybridep or ncclep, got {value!r}")
            if value == "ncclep":
                extra["ncclep"] = "1"
        elif flag == "--recompute-granularity" and value is not None:
            extra["granularity"] = value
        elif flag in ("--recompute-modules", "--offload-modules"):
            mods = values_after(tokens, i)
            if flag == "--offload-modules":
                s["offload_modules"] = mods
            else:
                extra["modules"] = " ".join(mods)
            step = 1 + len(mods)
        elif flag == "--hierarchical-context-parallel-sizes":
            words = values_after(tokens, i)
            try:
                s["hierarchical_context_parallel_sizes"] = [int(w) for w in words]
            except ValueError:
                raise ConfigError(flag, f"expected integers, got {' '.join(words)!r}") from None
            step = 1 + len(words)
        elif flag == "--use-torch-fsdp2":
            extra["torch_fsdp2"] = "1"
        elif flag == "--torch-fsdp2-no-reshard-after-forward":  # fully_shard(reshard_after_forward=False) on every unit
            extra["torch_fsdp2_keep"] = "1"
        elif flag == "--data-parallel-sharding-strategy" and value is not None:
            levels = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
            if value not in levels:
                raise ConfigError(flag, f"expected one of {', '.join(levels)}, got {value!r}")
            extra["sharding"] = levels[value]
        elif flag in ("--attention-dropout", "--hidden-dropout") and value is not None:
            extra[flag] = str(typed(flag, value, float))
        elif flag == "--zero-stage" and value is not None:  # Megatron-DeepSpeed
            if value not in ("0", "1", "2", "3"):
                raise ConfigError(flag, f"expected 0, 1, 2 or 3, got {value!r}")
            extra["ds_zero"] = value
        elif flag == "--deepspeed":
            extra["deepspeed"] = "1"
        elif flag == "--recompute-activations":  # Megatron's alias of selective core-attention recompute
            extra["granularity"] = "selective"
        elif flag == "--fp8-format":
            s["fp8"] = True
        elif flag in ("--fp4-format", "--fp4"):
            s["fp4"] = True
        elif flag == "--moe-layer-freq" and value is not None:
            pattern = layer_pattern(value)
            lead = len(pattern) - len("".join(pattern).lstrip("0")) if pattern else 0
            if pattern and set("".join(pattern[lead:])) <= {"1"}:
                m["dense_layers"] = lead  # dense layers first (DeepSeek's first_k_dense)
            else:
                m["moe_layer_freq"] = int_or_layer_list(flag, value)  # an int: every N-th layer from the first
        elif flag == "--moe-router-topk-limited-devices" and value is not None:
            # megatron-core TransformerConfig: deprecated for group-limited routing with one
            # group per EP rank (moe_router_num_groups = EP size, moe_router_group_topk = N)
            try:
                extra["limited_devices"] = str(int(value))
            except ValueError:
                raise ConfigError(flag, f"expected an int, got {value!r}") from None
        elif flag == "--window-size" and value is not None:  # TransformerEngine's (left, right); -1: unbounded
            m["window_size"] = window_keys(value)
        elif flag == "--window-attn-skip-freq" and value is not None:
            m["window_attn_skip_freq"] = skip_freq(value)
        elif flag == "--softmax-type" and value is not None:
            if value not in ("vanilla", "off-by-one", "learnable"):
                raise ConfigError(flag, f"expected vanilla, off-by-one or learnable, got {value!r}")
            m["attention_sinks"] = value == "learnable"  # GPT-OSS's learned sink logits
            if value == "off-by-one":
                notes.append("--softmax-type off-by-one: costed as the vanilla softmax (one constant sink logit)")
        elif flag == "--no-rope-freq" and value is not None:  # Megatron's no_rope_freq_type: an int or a list
            m["no_rope_freq"] = int_or_layer_list(flag, value)
        elif flag == "--linear-attention-freq" and value is not None:  # la_freq_type: an int or a list
            m["linear_attention_freq"] = int_or_layer_list(flag, value)
        elif flag == "--experimental-attention-variant" and value is not None:
            if value not in ("gated_delta_net", "dsa"):
                raise ConfigError(flag, f"expected gated_delta_net or dsa, got {value!r}")
            m["experimental_attention_variant"] = value
        elif flag == "--attention-backend" and value is not None:  # Megatron-Core's AttnBackend
            if value not in ("auto", "flash", "fused", "unfused", "local"):
                raise ConfigError(flag, f"expected auto, flash, fused, unfused or local, got {value!r}")
            # flash / fused / auto run TE's fused (flash) attention; unfused and local materialise the softmax
            s["use_math_sdp"] = value in ("unfused", "local")
        elif flag == "--main-grads-dtype" and value is not None:  # the precision-aware optimizer's main grads
            if value not in ("fp32", "bf16"):
                raise ConfigError(flag, f"expected fp32 or bf16, got {value!r}")
            s["grad_reduce_in_bf16"] = value == "bf16"
        elif flag == "--moe-layer-recompute":
            extra["moe_layer_recompute"] = "1"
        elif flag == "--checkpoint-activations":
            # Megatron-LM 2021: every layer recomputed in chunks of --checkpoint-num-layers (1);
            # since 2022 --recompute-granularity full --recompute-method uniform (this flag exits)
            extra["granularity"] = "full"
            extra.setdefault("method", "uniform")
        elif flag in ("--checkpoint-num-layers", "--activations-checkpoint-num-layers") and value is not None:
            s["recompute_layer_num"] = typed(flag, value)  # the older names of --recompute-num-layers
        elif flag in ("--recompute-method", "--activations-checkpoint-method") and value is not None:
            if value not in ("block", "uniform"):
                raise ConfigError(flag, f"expected block or uniform, got {value!r}")
            extra["method"] = value
        elif flag == "--quick-geglu":  # megatron-core: a gated MLP (gated_linear_unit) with quick-GELU
            m["use_swiglu"] = True
            extra["quick_geglu"] = "1"  # (not --swiglu: Megatron's default FFN stays 4h)
            notes.append("--quick-geglu: the gated MLP's GEMMs as SwiGLU's, its activation costed as SwiGLU's")
        elif flag == "--padded-vocab-size" and value is not None:  # the model's vocabulary as it is, unpadded further
            extra["padded_vocab"] = str(typed(flag, value))
        elif flag in ("--no-pad-vocab-size", "--disable-pad-vocab-size"):
            extra.setdefault("padded_vocab", "as given")
        elif flag in ("--tokenizer-type", "--merge-file") and value is not None:
            extra[flag] = value
            no_effect.append(flag)
        elif flag == "--DDP-impl" and value is not None:  # Megatron-LM <= 2022: local is the DDP modelled
            if value == "local":
                no_effect.append(flag)
            else:
                not_modelled.setdefault("torch DDP's bucketed all-reduce: Megatron's own DDP is modelled", []).append(flag)
        elif flag == "--mtp-hybrid-override-pattern" and value is not None:  # the MTP depth's blocks, old form
            extra[flag] = value
        elif flag == "--qk-l2-norm":  # Llama 4's weightless L2 norm of q and k (the HF importer reads it so too)
            m["qk_layernorm"] = True
            notes.append("--qk-l2-norm: the weightless L2 q/k norm modelled as a q/k RMSNorm (its few weights counted)")
        elif flag in ("--heterogeneous-layers-config-path", "--heterogeneous-layers-config-encoded-json"):
            raise ConfigError(flag, "layers that differ from one another (Llama-Nemotron's heterogeneous blocks) are not "
                              "modelled: every layer here has the model's one attention and MLP shape")
        elif flag == "--hybrid-override-pattern" and value is not None:  # 0.19's deprecated name of the pattern
            m["hybrid_layer_pattern"] = value
        elif flag in ("--is-hybrid-model", "--hybrid-attention-ratio", "--hybrid-mlp-ratio"):
            # the deprecated ratios make a pattern by megatron-core's pattern_from_ratios
            raise ConfigError(flag, "give the hybrid stack as --hybrid-layer-pattern (M Mamba, * attention, - MLP, "
                              "E MoE): the deprecated ratios are not read")
        elif flag in ("--reset-attention-mask", "--reset-position-ids"):
            # gpt_dataset.py edits the dense [s, s] mask and the positions; megatron-core passes
            # the mask with attn_mask_type causal, which TE's attention ignores (the unfused one
            # applies it to the same softmax): the same kernels either way
            notes.append(f"{flag}: no effect on time or memory (TransformerEngine's causal attention ignores the dense "
                         "mask); attention within documents is --dataloader-inter-document-masking (document_lengths)")
        elif flag in ("--dataloader-inter-document-masking", "--sft"):
            # attention within each packed document (THD over cu_seqlens): the lengths are the data's
            notes.append(f"{flag}: attention stays inside each document packed into a sequence; their lengths come "
                         "from the data: set the strategy's document_lengths (until then one document per sequence)")
        elif flag == "--optimizer" and value in ("muon", "dist_muon"):
            s["optimizer"] = "muon"  # dist_muon: Megatron's deprecated name for muon + the distributed optimizer
            if value == "dist_muon":
                s["zero_state"] = 1
        elif flag == "--optimizer" and value is not None and value != "adam":
            notes.append(f"--optimizer {value}: not modelled, the step and its states are Adam's (two fp32 moments)")
        elif flag in MUON_DEFAULT_ONLY and value is not None and value != MUON_DEFAULT_ONLY[flag]:
            not_modelled.setdefault(f"Muon's Newton-Schulz GEMMs are costed with {flag} {MUON_DEFAULT_ONLY[flag]}",
                                    []).append(flag)
        elif flag in MUON_DEFAULT_ONLY:
            no_effect.append(flag)
        elif flag in NO_EFFECT or flag in OLDER_NO_EFFECT or (flag == "--rotary-percent" and value is not None and is_one(value)) or flag == "--optimizer":
            no_effect.append(flag)
        elif flag in NOT_MODELLED:
            not_modelled.setdefault(NOT_MODELLED[flag], []).append(flag)
        elif flag.startswith(NO_EFFECT_FAMILIES):
            no_effect.append(flag)
        elif flag.startswith("--") and flag not in IGNORED_VALUED and flag not in LAUNCHER_FLAGS:
            notes.append(f"ignored {flag}")
        i += step
    if no_effect:
        notes.append(f"no effect on time or memory, read past: {' '.join(no_effect)}")
    for why, flags in not_modelled.items():
        notes.append(f"not modelled, read past: {' '.join(flags)} ({why})")
    return gbs


def _by_flag(target: str, build: Any) -> Any:
    """``build()``, its ConfigError naming the Megatron flag that set the field (our field
    name when no flag sets it)."""
    try:
        return build()
    except ConfigError as exc:
        flag = flag_of(target, exc.field.split(".")[0])
        if flag is None:
            raise
        raise ConfigError(flag, exc.rule) from None
