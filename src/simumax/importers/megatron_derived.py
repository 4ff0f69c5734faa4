"""What Megatron-LM derives from a command line once its flags are read
(``training/arguments.py``, validate_args): defaults for flags left out, the flags
``megatron_args`` kept aside combined (dropout, tokenizer, sharding, recompute), the
virtual stages, P2P overlap, the world size and the micro-batch count."""

from __future__ import annotations

import math
from typing import Any

from simumax.config.layout import expand as expand_layout
from simumax.config.megatron_names import VALUED
from simumax.errors import ConfigError
from simumax.importers.megatron_flag_tables import MEGATRON_DEFAULTS, TOKENIZER_VOCAB
from simumax.importers.megatron_values import typed

SIZE_FIELDS = frozenset({"tp_size", "pp_size", "cp_size", "ep_size", "etp_size", "micro_batch_size"})


def megatron_defaults(m: dict[str, Any], s: dict[str, Any], extra: dict[str, str], notes: list[str]) -> None:
    """What Megatron makes of flags left out, and of the flags ``_read_flags`` kept in
    ``extra`` (dropout, tokenizer, sharding, recompute granularity and modules ...)."""
    if m.get("linear_attention_freq") is not None and m.get("experimental_attention_variant") is None:
        m.pop("linear_attention_freq")  # megatron-core reads it only for a linear-attention variant
        notes.append("--linear-attention-freq without --experimental-attention-variant gated_delta_net: no effect, as in "
                     "Megatron (every layer softmax attention)")
    legacy_mtp = extra.pop("--mtp-hybrid-override-pattern", None)
    if legacy_mtp and m.get("mtp_num_layers") and "/" not in (m.get("hybrid_layer_pattern") or ""):
        # Megatron's old MTP flag becomes the unified pattern's depths (arguments.py)
        m["hybrid_layer_pattern"] = (m.get("hybrid_layer_pattern") or "") + "/" + "/".join([legacy_mtp] * m["mtp_num_layers"])
    if "D" in (m.get("hybrid_layer_pattern") or ""):  # argument_utils: D blocks make the variant dsa
        m.setdefault("experimental_attention_variant", "dsa")
    pattern = m.get("hybrid_layer_pattern")
    if pattern:  # the pattern's blocks are the layers, whatever --num-layers says (arguments.py)
        main, *mtp = pattern.split("/")
        if mtp and m.get("mtp_num_layers") not in (None, 0, len(mtp)):
            notes.append(f"--mtp-num-layers {m['mtp_num_layers']}: the pattern's {len(mtp)} MTP depths are used, as "
                         "Megatron does")
        if mtp:
            m["mtp_num_layers"] = len(mtp)
        elif m.pop("mtp_num_layers", None):  # Megatron warns and builds no MTP block without the pattern's part
            notes.append("--mtp-num-layers with a hybrid pattern that has no '/' MTP blocks: no MTP, as Megatron "
                         "builds none (give them as --hybrid-layer-pattern 'main/mtp')")
        pattern = main
        blocks = len(pattern.replace("|", ""))
        if m.get("layer_num") not in (None, blocks):
            notes.append(f"--hybrid-layer-pattern has {blocks} layers: --num-layers {m['layer_num']} ignored, as "
                         "Megatron does")
        m["layer_num"] = blocks
        segments, pp = pattern.count("|") + 1, s.get("pp_size", 1)
        if segments > pp and segments % pp == 0:  # its '|' segments are the virtual stages
            s["interleaving_size"] = segments // pp
    if s.get("use_sharp"):
        notes.append("--use-sharp: its collectives' SMs under --use-nccl-ub are modelled, not the in-network "
                     "reduction's bandwidth")
    for flag, field, value, text in MEGATRON_DEFAULTS:  # flags left out mean what Megatron makes of them
        if field not in m:
            m[field] = value
            if text:
                notes.append(f"{flag} not given: Megatron's default {text}")
    if "dtype" not in s:  # Megatron's params_dtype is fp32 unless --bf16 / --fp16 (arguments.py, validate_args)
        s["dtype"] = "fp32"
        notes.append("--bf16 / --fp16 not given: Megatron trains in fp32 (not modelled: an estimate needs bf16 or fp16)")
    if s["dtype"] == "fp16":  # DDP keeps and reduces fp16 gradients unless --accumulate-allreduce-grads-in-fp32
        s.setdefault("use_fp32_accum_grad", False)
    dropout = [float(extra.get(f, "0.1")) for f in ("--attention-dropout", "--hidden-dropout")]
    s["enable_dropout"] = any(p > 0 for p in dropout)
    if "--attention-dropout" not in extra and "--hidden-dropout" not in extra:
        notes.append("--attention-dropout / --hidden-dropout not given: Megatron's default 0.1 (dropout on)")
    if "limited_devices" in extra and "moe_router_group_topk" not in m:
        m["moe_router_num_groups"], m["moe_router_group_topk"] = s.get("ep_size", 1), int(extra["limited_devices"])
    if m.get("expert_num"):
        m["model_type"] = "moe"
        # megatron-core >= 0.13: every dispatcher permutes the routing probabilities with the
        # tokens and the experts' activation applies them (experts.py, permuted_probs)
        s.setdefault("dispatch_probs", True)
        if "moe_dispatcher_policy" not in s:
            s["moe_dispatcher_policy"] = "all_gather"
            notes.append("--moe-token-dispatcher-type not given: Megatron's default allgather")
        # Megatron is dropless unless told otherwise (SimuMax files default to padding)
        m.setdefault("moe_pad_expert_input_to_capacity", False)
        m.setdefault("capacity", None)
    if "kv_head_num" not in m:
        m["kv_head_num"] = m.get("head_num")
    if "intermediate_size" not in m and "hidden_size" in m:
        # Megatron's default --ffn-hidden-size: 4h, or 2/3 of it rounded down to 64 with SwiGLU
        h = m["hidden_size"]
        m["intermediate_size"] = int(4 * h * 2 / 3 / 64) * 64 if m.get("use_swiglu") and "quick_geglu" not in extra else 4 * h
        notes.append(f"--ffn-hidden-size not given: Megatron's default {m['intermediate_size']}")
    if "padded_vocab" in extra:  # megatron-core argument_utils: padded_vocab_size, else vocab_size, unpadded
        if extra["padded_vocab"] != "as given":
            m["vocab_size"] = int(extra["padded_vocab"])
        m["make_vocab_size_divisible_by"] = 1  # (the embedding still splits over TP)
        notes.append("--padded-vocab-size / --no-pad-vocab-size: the vocabulary as given, padded only to a multiple of TP")
    if "vocab_size" not in m:
        # pretrain_gpt.py's default tokenizer is GPT2BPETokenizer, the one that reads --merge-file
        tokenizer = extra.get("--tokenizer-type") or ("GPT2BPETokenizer" if "--merge-file" in extra else None)
        if tokenizer not in TOKENIZER_VOCAB:
            raise ConfigError("--vocab-size", "required (Megatron reads it from the tokenizer; pass it explicitly)")
        m["vocab_size"] = TOKENIZER_VOCAB[tokenizer]
        notes.append(f"--vocab-size not given: {tokenizer}'s {m['vocab_size']} tokens (padded as Megatron pads them)")
    if "sharding" in extra:  # Megatron-FSDP's --data-parallel-sharding-strategy
        s["zero_state"] = extra["sharding"]
    if "ncclep" in extra and s.get("moe_dispatcher_policy") == "flex":
        s["moe_dispatcher_policy"] = "all2all"
        notes.append("--moe-flex-dispatcher-backend ncclep: modelled as the all-to-all dispatcher (one copy per routed expert)")
    if "torch_fsdp2" in extra:
        if s.get("zero_state") == 1:  # --use-distributed-optimizer, read before
            raise ConfigError("--use-distributed-optimizer", "--use-torch-fsdp2 is not supported with MCore's "
                              "distributed optimizer (Megatron)")
        # Megatron's TorchFullyShardedDataParallel: fully_shard on every TransformerLayer, the
        # embedding and the output layer, all resharded after forward unless the flag says none
        keep = "torch_fsdp2_keep" in extra
        s.update(fsdp_impl="megatron_torch_fsdp2", zero_state=3, fsdp_reshard_after_forward="never" if keep else "default")
        if s.pop("fp8_param_gather", False):  # validate_args turns it off (TE >= 2.0) with a warning
            notes.append("--fp8-param-gather: Megatron turns it off with --use-torch-fsdp2 (bf16 all-gathers)")
    if "deepspeed" in extra and int(extra.get("ds_zero", "0")) >= 1:  # ZeRO from the DeepSpeed config
        s.update(fsdp_impl="deepspeed", zero_state=int(extra["ds_zero"]))
        notes.append("--deepspeed: ZeRO stage from --zero-stage; the rest of ds_config.json keeps DeepSpeed's defaults")
    if "moe_layer_recompute" in extra:  # megatron-core TransformerConfig: deprecated for selective + moe
        if extra.get("granularity") == "full":
            raise ConfigError("--moe-layer-recompute", "Megatron refuses it with --recompute-granularity full")
        mods = extra.get("modules", "core_attn").split()
        extra.update(granularity="selective", modules=" ".join(mods + ["moe"] * ("moe" not in mods)))
    gran = extra.get("granularity")
    if gran == "full":
        # Megatron's --recompute-num-layers defaults to 1, which with the uniform method
        # (or no count) recomputes every layer
        if "method" not in extra:  # megatron-core's TransformerConfig refuses full without one
            notes.append("--recompute-granularity full without --recompute-method: Megatron refuses it (block or "
                         "uniform); taken as block over every layer")
        s.update(enable_recompute=True, recompute_granularity="full_block", recompute_method=extra.get("method", "block"))
        s.setdefault("recompute_layer_num", None)
    elif gran == "selective":
        if "method" in extra:  # validate_args: 'recompute method is not yet supported for selective'
            notes.append("--recompute-method with --recompute-granularity selective: Megatron refuses it; read past")
        mods = extra.get("modules", "core_attn").split()
        if mods == ["core_attn"]:
            s.update(enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True)
        else:
            s.update(enable_recompute=True, megatron_recompute=True, megatron_recompute_modules=mods)


def parallel_sizes(m: dict[str, Any], s: dict[str, Any], extra: dict[str, str], notes: list[str], gbs: int | None,
                    world_size: int | None) -> None:
    """Virtual stages, the CP scheme's default, P2P overlap and offload, the world size and
    the micro-batch count from the global batch."""
    # sizes the world size and the batch split divide by: refuse 0 here, by the flag's name
    for flag, (kind, field, _) in VALUED.items():
        if kind == "s" and field in SIZE_FIELDS and field in s and s[field] < 1:
            raise ConfigError(flag, f"must be >= 1 (got {s[field]})")
    tp, pp, cp = s.get("tp_size", 1), s.get("pp_size", 1), s.get("cp_size", 1)
    if "vp_layers" in extra:
        if "layer_num" not in m:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage", "needs --num-layers")
        vp_layers = typed("--num-layers-per-virtual-pipeline-stage", extra["vp_layers"])
        if vp_layers < 1 or pp < 1:
            raise ConfigError("--num-layers-per-virtual-pipeline-stage", "must be >= 1")
        per_rank = m["layer_num"] // pp
        s["interleaving_size"] = max(1, per_rank // vp_layers)
    layout = s.get("pipeline_model_parallel_layout")
    if layout and "interleaving_size" not in s and "vp_layers" not in extra:
        # Megatron derives the virtual stages from the layout (PipelineParallelLayerLayout:
        # len(layout) // pipeline_model_parallel_size)
        s["interleaving_size"] = max(1, len(expand_layout(layout)) // pp)
    if cp > 1 and "cp_comm_type" not in s:  # Megatron's default (arguments.py: --cp-comm-type p2p)
        s["cp_comm_type"] = "p2p"
        notes.append("--cp-comm-type not given: Megatron's default p2p (TransformerEngine's ring)")
    _p2p_and_offload_defaults(s, pp, notes)
    # default: DP 1 for the dense groups, enough ranks for the expert groups too
    s["world_size"] = world_size if world_size is not None else pp * math.lcm(tp * cp, s.get("ep_size", 1) * s.get("etp_size", 1))
    if s["world_size"] < 1 or s["world_size"] % (tp * pp * cp):
        raise ConfigError("--world-size", f"{s['world_size']} GPUs do not split into TP x PP x CP = {tp * pp * cp}")
    dp = s["world_size"] // (tp * pp * cp)
    if gbs is not None:
        mbs = s.get("micro_batch_size", 1)
        if gbs % (mbs * dp):
            raise ConfigError("--global-batch-size", f"{gbs} is not a multiple of micro-batch {mbs} x DP {dp}")
        s["micro_batch_num"] = gbs // (mbs * dp)


def _p2p_and_offload_defaults(s: dict[str, Any], pp: int, notes: list[str]) -> None:
    """What Megatron-LM 0.19's validate_args makes of P2P overlap and layer offload: the
    interleaved schedule overlaps P2P unless --no-overlap-p2p-communication, 1F1B never
    does (it turns the option off); --cpu-offloading-num-layers > 0 turns offload on."""
    if pp > 1 and s.get("interleaving_size", 1) > 1:
        if "overlap_p2p_comm" not in s:
            s["overlap_p2p_comm"] = True
            notes.append("P2P overlap: Megatron-LM 0.19's default with the interleaved schedule (--no-overlap-p2p-communication turns "
                         "it off; older versions needed --overlap-p2p-communication)")
        elif not s["overlap_p2p_comm"] and pp == 2:
            raise ConfigError("--no-overlap-p2p-communication", "the interleaved schedule over 2 pipeline stages runs only "
                              "with P2P overlap (Megatron: pipeline-model-parallel size should be greater than 2)")
    elif s.pop("overlap_p2p_comm", False) and pp > 1:
        notes.append("--overlap-p2p-communication: Megatron turns it off without the interleaved schedule (blocking P2P modelled)")
    if s.get("cpu_offloading_num_layers", 0) > 0:
        s["cpu_offloading"] = True
