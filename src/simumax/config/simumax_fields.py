"""SimuMax's JSON read with SimuMax's meaning (docs/compat.md, issue 21 part 3).

Each config runs its input dict through one function here before validation:
* ``null`` for a field that takes no null means "absent" (the default applies);
* where SimuMax's default differs from ours and the field is absent, SimuMax's applies
  (the field defaults themselves are SimuMax's where they could be: ``world_size`` 8);
* fields and values only SimuMax has are mapped onto ours, or accepted and named in one
  warning where this package does not model what they change.
A value whose effect is not modelled and would change the numbers a lot is a ConfigError,
never a silently different result.
"""

from __future__ import annotations

import logging
from typing import Any

from simumax.errors import ConfigError

log = logging.getLogger(__name__)

# Megatron's default rank order (tp fastest); SimuMax writes it with its own spelling
DEFAULT_RANK_ORDERS = {"tp-cp-ep-dp-pp", "tp-cp-dp-pp", "tp-dp-pp", "tp-cp-ep-dp-pp-etp"}
PP_INNER_RANK_ORDERS = {"tp-cp-ep-pp-dp", "tp-cp-pp-dp", "tp-pp-dp"}  # Megatron's --use-tp-pp-dp-mapping

# strategy fields SimuMax writes that change nothing modelled here: version gates of TE
# features (this package reads ``te_version``) and SimuMax's own bookkeeping
_STRATEGY_IGNORED_PREFIXES = ("te_",)
_STRATEGY_IGNORED_SUFFIX = "_min_version"


def _drop_nulls(data: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``null`` on a field that takes no null reads as absent (SimuMax writes null for
    unset optional values)."""
    out = {}
    for k, v in data.items():
        info = fields.get(k)
        if v is None and info is not None and info.default is not None and not _nullable(info):
            continue
        out[k] = v
    return out


def _nullable(info: Any) -> bool:
    return "None" in repr(info.annotation)


def _warn(field: str, value: Any, what: str) -> None:
    log.warning("%s=%r is a SimuMax field this package does not model (%s); estimated without it", field, value, what)


def strategy_input(data: Any, fields: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        return data
    d = _drop_nulls(data, fields)
    # full_block with no layer count: SimuMax's default 0 (no layer recomputes); selective
    # recompute without one applies to every layer, as Megatron's --recompute-granularity selective
    if d.get("recompute_granularity") in ("full_block", "attn_only", "mlp_only") and "recompute_layer_num" not in d:
        d["recompute_layer_num"] = 0
        if d.get("enable_recompute"):
            log.warning("recompute_granularity=%s without recompute_layer_num recomputes no layer (SimuMax's "
                        "default 0); set recompute_layer_num, or null for every layer", d["recompute_granularity"])
    if d.get("moe_dispatcher_policy") == "all2all-seq":
        # Megatron's alltoall_seq dispatcher: the same all-to-all volume, split along the sequence
        d["moe_dispatcher_policy"] = "all2all"
    order = d.pop("order_of_paralielism", None)
    if order is not None and str(order).lower() in PP_INNER_RANK_ORDERS:
        d.setdefault("rank_order", "tp-cp-ep-pp-dp")
    elif order is not None and str(order).lower() not in DEFAULT_RANK_ORDERS:
        _warn("order_of_paralielism", order, "ranks are laid out in Megatron's order tp-cp-ep-dp-pp or tp-cp-ep-pp-dp")
    sparse = d.pop("attention_sparse_ratio", None)
    if sparse not in (None, 0, 0.0):
        raise ConfigError("attention_sparse_ratio", f"sparse attention is not modelled (got {sparse!r}); use 0")
    for name in ("use_accm_weight", "use_fused_grad_accumulation"):
        # SimuMax's names for Megatron's gradient-accumulation fusion: False writes each weight
        # gradient and adds it to the main grad in DDP's hook (graph/linears.weight_gradient)
        if d.pop(name, None) is False:
            d.setdefault("gradient_accumulation_fusion", False)
    mode = d.pop("cp_a2a_mode", None)
    if mode is not None and d.get("cp_size", 1) > 1:
        _warn("cp_a2a_mode", mode, "context parallelism follows cp_comm_type as TransformerEngine runs it")
    if d.pop("enable_straggler_model", False):  # said once, where the file is read
        _warn("enable_straggler_model", True, "every rank runs at the modelled speed: no straggler slows the step")
    for k in [k for k in d if k.startswith(_STRATEGY_IGNORED_PREFIXES) and k.endswith(_STRATEGY_IGNORED_SUFFIX)]:
        d.pop(k)
    return d


def model_input(data: Any, fields: dict[str, Any]) -> Any:
    if not isinstance(data, dict):
        return data
    d = _drop_nulls(data, fields)
    if d.get("attention_type") == "gqa":  # GQA is MHA with fewer kv heads (kv_head_num)
        d["attention_type"] = "mha"
    if "model_type" not in d and d.get("expert_num") is not None:
        d["model_type"] = "moe" if d["expert_num"] > 1 else "dense"
    if d.get("model_type") == "moe":
        # SimuMax pads every expert's input to capacity factor 1 unless told otherwise
        d.setdefault("moe_pad_expert_input_to_capacity", True)
        if d["moe_pad_expert_input_to_capacity"]:
            d.setdefault("capacity", 1)
    orig = d.pop("orig_vocab_size", None)
    if orig is not None:  # a file SimuMax saved: vocab_size was padded, orig_vocab_size is the tokenizer's
        d["vocab_size"] = orig
    d.pop("group_linear_mode", None)  # SimuMax's grouped-GEMM mode switch: experts run as one grouped GEMM here
    return d


# system keys SimuMax's analysis() writes beside the configured ones (derived bookkeeping)
SYSTEM_BOOKKEEPING = ("real_comm_bw", "hit_efficiency", "miss_efficiency", "fixed_latency")


def system_input(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    d = {k: v for k, v in data.items() if k not in SYSTEM_BOOKKEEPING}
    acc = d.get("accelerator")
    if isinstance(acc, dict) and isinstance(acc.get("op"), dict):
        ops = {}
        for name, spec in acc["op"].items():
            if isinstance(spec, dict) and "accurate_efficient_factor" in spec and spec["accurate_efficient_factor"] is None:
                spec = {**spec, "accurate_efficient_factor": {}}
            ops[name] = spec
        d["accelerator"] = {**acc, "op": ops}
    return d
