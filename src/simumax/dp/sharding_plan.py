"""What a strategy's data-parallel sharding does, read once from it: the one place the
ZeRO level, the implementation (Megatron-FSDP, PyTorch FSDP2, DeepSpeed), HSDP replicas,
FSDP2's reshard policy and torch's pipelining turn into mechanisms. The IR pass
(graph/sharding.py), the model states (memory/model_states.py), the per-step gradient sync
(dp/buckets.py, simulate/iteration.py) and the profile cache's key all read this plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simumax.config.strategy_derived import FSDP2_IMPLS

if TYPE_CHECKING:
    from simumax.config.strategy import StrategyConfig

# FSDP units by what they hold: "layer", "embedding", "head" (the final norm with the output
# layer), "tied_embedding" / "tied_head" (the embedding and final norm of a tied output layer:
# one unit in torchtitan)
HEAD_UNITS = frozenset({"head", "tied_head", "tied_embedding"})
ALL_UNITS = frozenset({"layer", "embedding"}) | HEAD_UNITS


@dataclass(frozen=True, slots=True)
class ShardingPlan:
    level: int  # ZeRO stage: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters
    impl: str  # megatron_fsdp, torch_fsdp2, megatron_torch_fsdp2, deepspeed
    group: str  # where dense states shard: "dp", or "dp_shard" (one HSDP replica)
    per_micro_batch: bool  # ZeRO-2/3 collectives in every micro-batch, as ops of the IR
    gathers: bool  # ZeRO-3: each unit's parameters gathered before they are used
    reduce_bytes: int  # per gradient element reduce-scattered
    kept_units: frozenset[str]  # units gathered in forward and kept for backward (not resharded)
    reduce_on_compute_stream: bool  # DeepSpeed without overlap_comm: the reduce is exposed
    # HSDP's all-reduce of each gradient shard across replicas in every backward (FSDP2's
    # foreach_reduce, which torchtitan never defers) rather than once per step (Megatron's
    # distributed-optimizer instances)
    replicas_per_micro_batch: bool
    # FSDP2 under torch.distributed.pipelining (torchtitan with pp_size > 1): every backward
    # runs with set_requires_gradient_sync(False) and set_reshard_after_backward(False)
    # (pipelining/stage.py, backward_maybe_with_nosync), so a unit is gathered once per step
    # and its gradients accumulate unsharded in fp32 until perform_reduce_grad reduce-scatters
    # them after the last backward
    pipelined: bool

    @classmethod
    def of(cls, st: "StrategyConfig") -> "ShardingPlan":
        """The plan of ``st``, kept with it while the fields it reads stay the same (the
        estimate asks for it per gradient bucket)."""
        contents = (st.zero_state, st.fsdp_impl, st.fsdp_reshard_after_forward, st.pp_size, st.fsdp_replicate_size,
                    st.grad_reduce_in_bf16, st.use_fp32_accum_grad, st.ds_overlap_comm)
        return st.derived("sharding plan", contents, lambda: cls._build(st))

    @classmethod
    def _build(cls, st: "StrategyConfig") -> "ShardingPlan":
        titan = st.fsdp_impl == "torch_fsdp2"
        policy = st.fsdp_reshard_after_forward
        if st.fsdp_impl == "deepspeed":
            # a ZeRO-3 parameter stays gathered when its next use is within stage3_max_reuse_distance
            # (partitioned_param_coordinator.py, __params_to_release): the output layer's backward
            # follows its forward with no parameter between (trailing layers: memory/model_states.py)
            kept: frozenset[str] = frozenset({"head", "tied_head"})
        elif not st.fsdp2 or policy == "always":
            kept = frozenset()  # Megatron-FSDP reshards every unit
        elif policy == "never":
            kept = ALL_UNITS
        elif titan:  # torchtitan's apply_fsdp_to_decoder: the output unit is not resharded after forward
            kept = HEAD_UNITS
        else:  # Megatron's TorchFullyShardedDataParallel: every unit (the root keeps the final norm: h elements)
            kept = frozenset()
        pipelined = titan and st.pp_size > 1
        return cls(
            level=st.zero_state, impl=st.fsdp_impl, group="dp_shard" if st.fsdp_replicate_size > 1 else "dp",
            per_micro_batch=st.zero_state >= 2 and not pipelined, gathers=st.zero_state >= 3,
            # torchtitan's MixedPrecisionPolicy reduces in fp32; Megatron's fully_shard has no
            # policy and reduces in the bf16 of its parameters (main_grad_bytes)
            reduce_bytes=4 if titan else st.main_grad_bytes,
            kept_units=kept, reduce_on_compute_stream=st.fsdp_impl == "deepspeed" and not st.ds_overlap,
            replicas_per_micro_batch=titan and st.fsdp_replicate_size > 1 and not pipelined, pipelined=pipelined,
        )

    @property
    def fsdp2(self) -> bool:
        """PyTorch's fully_shard (torchtitan's or Megatron's wrapper)."""
        return self.impl in FSDP2_IMPLS

    def reshards(self, unit: str) -> bool:
        """Whether ``unit`` frees its gathered parameters after forward and gathers them
        again for backward."""
        return unit not in self.kept_units

    @property
    def key(self) -> tuple[object, ...]:
        """What of the plan the layer ops depend on (the profile cache's family key)."""
        return (self.level, self.per_micro_batch, self.kept_units, self.replicas_per_micro_batch)
