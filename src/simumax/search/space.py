"""The legal strategies of a search space (Megatron's divisibility rules via the config checks).

Dimensions: tp, pp (uneven first/last stages where the layers do not divide), vp, cp,
ep, etp, micro-batch size (the micro-batch count follows from the global batch), the
recompute variant, the ZeRO stage, the pipeline schedule, what is offloaded to the host
(OFFLOAD_VARIANTS) and the HSDP replica count (by default the base strategy's offload and
replica settings are kept). Each candidate is a full
``StrategyConfig``; full_block candidates leave ``recompute_layer_num`` to the evaluator,
which finds the fewest layers that fit.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

from simumax.config.checks import check_compatible, te_cp_refusal
from simumax.config.megatron_rules import fsdp_impl_fields
from simumax.config.model import ModelConfig
from simumax.config.strategy import FSDP_IMPLS, PipelineSchedule, StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError

NO_RECOMPUTE = {
    "megatron_recompute": False, "megatron_recompute_modules": [], "attn_recompute": False, "mlp_recompute": False,
    "mlp_rms_recompute": False, "mla_rms_recompute": False, "recompute_layer_num": None, "recompute_method": "block",
}
# name -> strategy fields (SimuMax's selective flags); "selective" is Megatron's default
# (core attention only); full_block's layer count is searched by the evaluator
RECOMPUTE_VARIANTS: dict[str, dict[str, Any]] = {
    "none": {"enable_recompute": False, "recompute_granularity": None},
    "selective": {"enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True},
    "selective_norm": {
        "enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True,
        "mlp_rms_recompute": True, "mla_rms_recompute": True,
    },
    "selective_mlp": {
        "enable_recompute": True, "recompute_granularity": "selective_recompute", "attn_recompute": True,
        "mlp_recompute": True, "mlp_rms_recompute": True, "mla_rms_recompute": True,
    },
    "full_block": {"enable_recompute": True, "recompute_granularity": "full_block"},
}
RECOMPUTE_TYPES = ("none", "selective", "full_block")  # the default: SimuMax's three modes
# SimuMax's names in recompute_search_type: its selective search tries its three flag sets
SIMUMAX_RECOMPUTE_NAMES = {
    "no_recompute": ("none",), "layer_only": ("full_block",),
    "selective_recompute": ("selective", "selective_norm", "selective_mlp"),
}


def expand_recompute(names: tuple[str, ...]) -> tuple[str, ...]:
    """Recompute variants of a search list, SimuMax's names mapped onto ours (order kept, once each)."""
    out: list[str] = []
    for n in names:
        for v in SIMUMAX_RECOMPUTE_NAMES.get(n, (n,)):
            if v not in out:
                out.append(v)
    return tuple(out)


# name -> strategy fields: offloading the optimizer states (Megatron --optimizer-cpu-offload)
# and / or the activations attention and the experts save (--fine-grained-activation-offloading)
NO_OFFLOAD = {"optimizer_cpu_offload": False, "optimizer_offload_fraction": 1.0,
              "fine_grained_activation_offloading": False, "offload_modules": [],
              "cpu_offloading": False, "cpu_offloading_num_layers": 0}
ACTIVATIONS_OFFLOADED = {"fine_grained_activation_offloading": True,
                         "offload_modules": ["core_attn", "attn_proj", "expert_fc1", "moe_act"]}
OFFLOAD_VARIANTS: dict[str, dict[str, Any]] = {
    "none": {},
    "optimizer": {"optimizer_cpu_offload": True},
    "activations": ACTIVATIONS_OFFLOADED,
    "both": {"optimizer_cpu_offload": True, **ACTIVATIONS_OFFLOADED},
}
ZERO_STAGES = (0, 1, 2, 3)
SCHEDULES = (None, *get_args(PipelineSchedule))  # None: 1F1B, or interleaved with vp > 1
ALL_RECOMPUTE = tuple(RECOMPUTE_VARIANTS)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True, slots=True)
class SearchSpace:
    world_size: int
    global_batch_size: int
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] | None = None  # None: every pp in 1..layers that divides the world
    vp: tuple[int, ...] = (1,)  # interleaving sizes (chunks per rank), used with pp > 1
    ep: tuple[int, ...] = (1,)
    etp: tuple[int, ...] = (1,)
    cp: tuple[int, ...] = (1,)
    mbs: tuple[int, ...] = (1,)
    recompute: tuple[str, ...] = RECOMPUTE_TYPES
    zero: tuple[int, ...] = (1,)
    schedule: tuple[str | None, ...] = (None,)  # None: 1F1B, or interleaved when vp > 1
    offload: tuple[str, ...] = ("none",)  # OFFLOAD_VARIANTS
    replicas: tuple[int, ...] = (1,)  # HSDP: fsdp_replicate_size (shard inside, replicate across; ZeRO >= 1)
    fsdp: tuple[str | None, ...] = (None,)  # sharded-DP implementations (fsdp_impl); None: the base strategy's
    extra: dict = field(default_factory=dict)  # fixed strategy fields (seq_len, dtype, ...)

    def __post_init__(self) -> None:
        for name in ("tp", "vp", "ep", "etp", "cp", "mbs", "zero", "replicas"):
            values = getattr(self, name)
            if not values or any(v < (0 if name == "zero" else 1) for v in values):
                raise ConfigError(f"search.{name}", f"needs at least one value, all >= {0 if name == 'zero' else 1}; got {values}")
        for o in self.offload:
            if o not in OFFLOAD_VARIANTS:
                raise ConfigError("search.offload", f"unknown offload {o!r}; allowed {', '.join(OFFLOAD_VARIANTS)}")
        if not self.offload:
            raise ConfigError("search.offload", "needs at least one value")
        if self.pp is not None and (not self.pp or min(self.pp) < 1):
            raise ConfigError("search.pp", f"needs at least one value, all >= 1; got {self.pp}")
        if self.world_size < 1 or self.global_batch_size < 1:
            raise ConfigError("search.world_size", "world_size and global_batch_size must be >= 1")
        object.__setattr__(self, "recompute", expand_recompute(self.recompute))
        for r in self.recompute:
            if r not in RECOMPUTE_VARIANTS:
                raise ConfigError("recompute_search_type", f"unknown recompute type {r!r}; allowed {ALL_RECOMPUTE} "
                                  f"or SimuMax's {tuple(SIMUMAX_RECOMPUTE_NAMES)}")
        if any(z not in ZERO_STAGES for z in self.zero):
            raise ConfigError("search.zero", f"ZeRO stages {self.zero}: allowed {ZERO_STAGES}")
        for impl in self.fsdp:
            if impl is not None and impl not in FSDP_IMPLS:
                raise ConfigError("search.fsdp", f"unknown implementation {impl!r}; allowed {', '.join(FSDP_IMPLS)}")
        for sched in self.schedule:
            if sched not in SCHEDULES:
                raise ConfigError("search.schedule", f"unknown schedule {sched!r}; allowed auto, {', '.join(s for s in SCHEDULES if s)}")

    def pp_sizes(self, layers: int) -> tuple[int, ...]:
        """The PP sizes to try: the given ones, else every pp up to the layers dividing the world."""
        return self.pp or tuple(p for p in range(1, layers + 1) if self.world_size % p == 0)

    def batch_splits(self, layers: int) -> bool:
        """Whether some tp x pp x cp layout and micro-batch size divide the global batch."""
        return any(
            self.world_size % (tp * pp * cp) == 0 and self.global_batch_size % (mbs * (self.world_size // (tp * pp * cp))) == 0
            for tp, pp, cp, mbs in itertools.product(self.tp, self.pp_sizes(layers), self.cp, self.mbs)
        )


def pp_layouts(layers: int, pp: int) -> list[tuple[int | None, int | None]]:
    """(first, last) stage layer counts to try: even when the layers divide; otherwise
    middle stages of floor or ceil(layers / pp) layers and the rest split over the first
    and last stage (each at least 1 and at most twice a middle stage)."""
    if pp == 1 or layers % pp == 0:
        return [(None, None)]
    if pp == 2:
        return [(layers // 2, layers - layers // 2)]
    out = []
    for mid in sorted({layers // pp, -(-layers // pp)}):
        rest = layers - (pp - 2) * mid
        first, last = rest // 2, rest - rest // 2
        if mid >= 1 and first >= 1 and last <= 2 * mid:
            out.append((first, last))
    return out


def candidates(model: ModelConfig, system: SystemConfig, base: StrategyConfig, space: SearchSpace,
               refused: Counter[str] | None = None) -> Iterator[tuple[str, StrategyConfig]]:
    """(recompute variant, strategy) for every legal strategy of the space, in a
    deterministic order (candidates of one layer family come together); ``refused``
    counts the rules the others break ("field: rule")."""
    L = model.layer_num
    pp_list = space.pp_sizes(L)
    ep_list, etp_list = (space.ep, space.etp) if model.is_moe else ((1,), (1,))
    base_fields = {**base.to_dict(), **space.extra}
    for tp, cp, mbs, rc, pp in itertools.product(space.tp, space.cp, space.mbs, space.recompute, pp_list):
        denom = tp * pp * cp
        if space.world_size % denom:
            continue
        dp = space.world_size // denom
        for vp, ep, etp, sched, zero, off, rep, impl in itertools.product(space.vp, ep_list, etp_list, space.schedule, space.zero,
                                                                          space.offload, space.replicas, space.fsdp):
            if (vp > 1 and pp == 1) or space.global_batch_size % (mbs * dp) or (rep > 1 and (zero < 1 or (dp * cp) % rep)):
                continue
            splits = [_split_fields(first=f, last=la) for f, la in pp_layouts(L, pp)]
            splits += [_split_fields(emb=e == "E", loss=lo == "L") for e, lo in accounting_layouts(L, pp, vp)]
            offload = _offload_fields(off, impl or base_fields.get("fsdp_impl")) if space.offload != ("none",) else {}
            for split in splits:
                st = _candidate(model, system, refused, {
                    **base_fields, "world_size": space.world_size, "tp_size": tp, "pp_size": pp, "cp_size": cp,
                    "ep_size": ep, "etp_size": etp, "micro_batch_size": mbs, "micro_batch_num": space.global_batch_size // (mbs * dp),
                    "zero_state": zero, "enable_sequence_parallel": tp > 1, "interleaving_size": vp, "pp_schedule": sched,
                    "microbatch_group_size_per_vp_stage": None, **split, **NO_RECOMPUTE, **RECOMPUTE_VARIANTS[rc], **offload,
                    **({"fsdp_replicate_size": rep} if space.replicas != (1,) else {}),
                    **({"fsdp_impl": impl} if impl else {}), **fsdp_impl_fields(impl),
                    # the base's overlaps where Megatron allows them: TP's with TP (and SP), the
                    # parameter gather's with a sharded optimizer; an interleaved pipeline over
                    # two stages runs only with its P2P overlapped
                    "tp_comm_overlap": bool(base_fields.get("tp_comm_overlap")) and tp > 1,
                    "overlap_param_gather": bool(base_fields.get("overlap_param_gather")) and zero >= 1,
                    "overlap_p2p_comm": bool(base_fields.get("overlap_p2p_comm")) or (vp > 1 and pp == 2),
                    **_hierarchical_cp(base_fields, cp),
                    **_cp_scheme(model, base_fields, cp),
                })
                if st is not None:
                    yield rc, st


def _offload_fields(name: str, impl: str | None) -> dict[str, Any]:
    """An offload variant's strategy fields. Megatron offloads the optimizer on the
    precision-aware optimizer's path (its HybridDeviceOptimizer keeps fp32 states), DeepSpeed
    with its own engine (the precision-aware optimizer is Megatron's)."""
    fields = {**NO_OFFLOAD, **OFFLOAD_VARIANTS[name]}
    if fields["optimizer_cpu_offload"] and impl != "deepspeed":
        fields.update(use_precision_aware_optimizer=True, main_params_dtype="fp32", exp_avg_dtype="fp32",
                      exp_avg_sq_dtype="fp32")
    return fields


def _cp_scheme(model: ModelConfig, base: dict[str, Any], cp: int) -> dict[str, Any]:
    """a2a, which TransformerEngine runs for every model, where it refuses the base's CP
    scheme for this one (``te_cp_refusal``: a sliding window, attention sinks), so
    long-sequence candidates of GPT-OSS-like models are not all lost to the default ring."""
    if cp > 1 and te_cp_refusal(model, base["seq_len"], base["cp_comm_type"]):
        return {"cp_comm_type": "a2a", "hierarchical_context_parallel_sizes": None}
    return {}


def _hierarchical_cp(base: dict[str, Any], cp: int) -> dict[str, Any]:
    """a2a+p2p bases keep their all-to-all level where it divides the candidate's CP size
    (the largest common part of it otherwise) and ring over the rest."""
    sizes = base.get("hierarchical_context_parallel_sizes")
    if base.get("cp_comm_type") != "a2a+p2p" or not sizes:
        return {}
    a = math.gcd(sizes[0], cp)
    return {"hierarchical_context_parallel_sizes": [a, cp // a]}


def accounting_layouts(layers: int, pp: int, vp: int) -> list[tuple[str, str]]:
    """Megatron's embedding / loss counted as a pipeline layer, proposed where the layers
    alone do not divide over the p x v virtual stages but with them they do (Llama 3.1
    405B: 126 + 2 over PP8 x VP8)."""
    stages = pp * vp
    if pp == 1 or layers % stages == 0:
        return []
    out = []
    for emb, loss in ((True, True), (True, False), (False, True)):
        total = layers + emb + loss
        if total % stages == 0 and total // stages >= 2:
            out.append(("E" if emb else "", "L" if loss else ""))
    return out


def _split_fields(first: int | None = None, last: int | None = None, emb: bool = False, loss: bool = False) -> dict[str, Any]:
    """The strategy fields of one pipeline split: uneven first / last stages, or the
    embedding / loss counted as layers."""
    return {"num_layers_in_first_pipeline_stage": first, "num_layers_in_last_pipeline_stage": last,
            "account_for_embedding_in_pipeline_split": emb, "account_for_loss_in_pipeline_split": loss}


def _candidate(model: ModelConfig, system: SystemConfig, refused: Counter[str] | None, fields: dict[str, Any]) -> StrategyConfig | None:
    try:
        st = StrategyConfig.init_from_dict(fields, source="search")
        check_compatible(model, st, system)
    except ConfigError as exc:
        if refused is not None:
            refused[f"{exc.field}: {exc.rule}"] += 1
        return None
    return st


def empty_space_error(model: ModelConfig, system: SystemConfig, base: StrategyConfig, space: SearchSpace) -> ConfigError:
    """Why a space has no legal candidate, as the error to raise: no layout divides the
    world size; no layout splits the global batch; or the rule the candidates broke most."""
    layouts = itertools.product(space.tp, space.pp_sizes(model.layer_num), space.cp)
    if not any(space.world_size % (t * p * c) == 0 for t, p, c in layouts):
        return ConfigError("--world-size", f"{space.world_size} is not a multiple of tp x pp x cp for any sizes of the space "
                           f"(tp {list(space.tp)}, cp {list(space.cp)})")
    if not space.batch_splits(model.layer_num):
        return ConfigError("--gbs", f"{space.global_batch_size} is not a multiple of mbs x dp for any layout of the space "
                           f"on {space.world_size} GPUs")
    refused: Counter[str] = Counter()
    for _ in candidates(model, system, base, space, refused):
        pass
    common = "; ".join(f"{rule} ({n}x)" for rule, n in refused.most_common(2))
    return ConfigError("search", "no legal strategy in the space: every candidate breaks a rule"
                       + (f", most often {common}" if common else "") + "; widen --tp/--pp/--cp/--ep or change the base strategy")
