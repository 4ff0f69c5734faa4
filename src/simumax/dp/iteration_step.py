"""The end of an iteration on each rank: Megatron's DDP gradient buckets and their reduces,
the tied-embedding gradient all-reduce, the optimizer step around the gradient-norm barrier,
and the ZeRO-1 parameter gathers. A part of ``Estimate`` (it mixes this in), kept here with
the buckets and the step's passes it costs (dp/buckets.py, dp/optimizer_step.py).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from simumax.dp.buckets import GradBucket, ParamOrder, bucket_key, bucket_size, grad_buckets
from simumax.dp.optimizer_step import step_passes
from simumax.memory.model_states import fp8_weight_params, stored_param_bytes
from simumax.graph.kernels import Collective
from simumax.graph.mtp import MODULE_EMBEDDING
from simumax.graph.ops import Stage

if TYPE_CHECKING:
    from simumax.config.model import ModelConfig
    from simumax.config.strategy import StrategyConfig
    from simumax.config.system import SystemConfig
    from simumax.cost.efficiency import ComputeModel
    from simumax.cost.network import NetworkModel
    from simumax.profiles import LayerProfiles, ProfileCache


class DataParallelStep:
    """Estimate's data-parallel sync and optimizer step (what it reads of the estimate is
    declared below for type checkers)."""

    if TYPE_CHECKING:
        model: ModelConfig
        strategy: StrategyConfig
        system: SystemConfig
        profiles: ProfileCache
        _bucket_cache: dict[int, tuple[tuple[ParamOrder, ParamOrder], list[GradBucket]]]

        @property
        def chunks(self) -> list[Stage]: ...
        @property
        def stages(self) -> list[Stage]: ...
        @property
        def network(self) -> NetworkModel: ...
        @property
        def compute_model(self) -> ComputeModel: ...
        @property
        def layer_profiles(self) -> LayerProfiles: ...

    def grad_buckets(self, chunk: Stage) -> list[GradBucket]:
        """Megatron's DDP buckets of one model chunk (each chunk has its own buffers):
        dense gradients reduce over DP x CP, expert gradients over the expert-data-parallel
        group; reduce-scatter + ZeRO-1 all-gather, or all-reduce without ZeRO."""
        return self._chunk_buckets(chunk)[1]

    def param_orders(self, chunk: Stage) -> tuple[ParamOrder, ParamOrder]:
        """(dense, expert) parameters of a chunk in backward's order: its ops after the
        layers, its layers, its ops before them (dp/buckets.py)."""
        return self._chunk_buckets(chunk)[0]

    def _chunk_buckets(self, chunk: Stage) -> tuple[tuple[ParamOrder, ParamOrder], list[GradBucket]]:
        got = self._bucket_cache.get(chunk.vstage)
        if got is None:
            pre, _, post = chunk.sections()
            head = sum(o.params - o.expert_params for o in post)
            embedding = sum(o.params - o.expert_params for o in pre)
            experts = chunk.expert_params
            dense = ParamOrder(head, chunk.params - experts - head - embedding, embedding)
            expert = ParamOrder(0, experts, 0)
            st = self.strategy
            dense_bytes = expert_bytes = float(st.dtype_bytes)
            if st.fp8_param_gather:  # the fp8 linears' parameters are gathered in fp8: the chunk's mean
                dense_bytes = stored_param_bytes(st, dense.total, fp8_weight_params(chunk, experts=False)) / max(dense.total, 1)
                expert_bytes = stored_param_bytes(st, experts, fp8_weight_params(chunk, experts=True)) / max(experts, 1)
            got = self._bucket_cache[chunk.vstage] = (
                (dense, expert),
                self._buckets(chunk, dense, "dp", dense_bytes) + self._buckets(chunk, expert, "edp", expert_bytes))
        return got

    def _buckets(self, chunk: Stage, order: ParamOrder, group: str, param_bytes: float) -> list[GradBucket]:
        # shared through the profile cache: a search asks the same chunk sizes of the same
        # groups for many layouts
        size = bucket_size(self.strategy, self.network, group, chunk.index, chunk.chunk)
        key = (*bucket_key(self.strategy, self.network, order, group, size), param_bytes)
        hit = self.profiles.grad_buckets.get(key)
        if hit is None:
            hit = self.profiles.grad_buckets[key] = grad_buckets(self.strategy, self.network, order, group, size, param_bytes)
        return hit

    def dp_comm_time(self, stage: Stage) -> float:
        """All gradient buckets (and ZeRO-1 parameter gathers) of one rank's chunks."""
        return self.dp_reduce_time(stage) + self.dp_gather_time(stage)

    @cached_property
    def embedding_grad_sync(self) -> list[float]:
        """Per rank: the all-reduce of the tied word-embedding gradient between the first and
        the last pipeline stage (Megatron ``finalize_model_grads`` ->
        ``_allreduce_word_embedding_grads``: the fp32 main grad of the rank's vocab shard,
        after the data-parallel reduce), and the MTP block's embedding copy on its stage. 0
        elsewhere, untied without MTP, or without PP."""
        out = [0.0] * len(self.stages)
        holders = {self.chunks[0].index}  # the word embedding, and the copies of it other ranks hold
        if not self.model.untie_embeddings_and_output_weights:
            holders.add(self.chunks[-1].index)  # the tied output layer
        if self.model.mtp_num_layers:  # MTP's copy, on its (standalone or last) stage
            holders.add(next(c.index for c in self.chunks if any(o.module == MODULE_EMBEDDING for o in c.ops)))
        if len(holders) < 2:
            return out
        d = self.layer_profiles.source.dims
        t = self.network.time(Collective("all_reduce", float(d.vocab * d.h * self.strategy.main_grad_bytes), "pp"))
        for r in holders:
            out[r] = t
        return out

    @cached_property
    def _dp_times(self) -> list[tuple[float, float]]:
        """Per rank: (gradient reduces, ZeRO-1 parameter gathers) of all its chunks; the
        reduces include the tied-embedding gradient all-reduce."""
        out = [[e, 0.0] for e in self.embedding_grad_sync]
        for c in self.chunks:
            rank = out[c.index]
            red, gat = rank
            for _, _, r, g in self.grad_buckets(c):  # (group, position, reduce, gather)
                red += r
                gat += g
            rank[0], rank[1] = red, gat
        return [(r, g) for r, g in out]

    def dp_reduce_time(self, stage: Stage) -> float:
        """Gradient reduce-scatters (ZeRO-1) or all-reduces of one rank, before its step."""
        return self._dp_times[stage.index][0]

    def dp_gather_time(self, stage: Stage) -> float:
        """ZeRO-1 parameter all-gathers of one rank, after its step."""
        return self._dp_times[stage.index][1]

    @cached_property
    def optimizer_passes(self) -> list[tuple[float, float]]:
        """Per rank: the optimizer step over its shard, (before, after) the gradient-norm
        all-reduce in seconds (dp/optimizer_step.py)."""
        cost = self.layer_profiles.coster.kernel  # memory-bound passes, and Muon's GEMMs
        return [step_passes(self.strategy, self.system, stage, cost, self.model) for stage in self.stages]

    def optimizer_time(self, stage: Stage) -> float:
        return sum(self.optimizer_passes[stage.index])

    def step_ends(self, grads_done: list[float]) -> tuple[list[float], list[float]]:
        """(ready for the gradient-norm all-reduce, end of the iteration) per rank, from
        when each rank's gradients are reduced.

        The gradient norm (for clipping) is all-reduced over every rank, data- and
        model-parallel alike, so no rank clips and steps before the slowest one has its
        norm: a barrier. Ranks that end their backward early (a pipeline's last stage)
        wait there, then each runs the rest of its step and its parameter all-gathers."""
        passes = self.optimizer_passes
        ready = [g + before for g, (before, _) in zip(grads_done, passes)]
        barrier = max(ready)
        return ready, [barrier + after + self.dp_gather_time(s) for s, (_, after) in zip(self.stages, passes)]

    def step_ends_after(self, end_bwd: list[float]) -> tuple[list[float], list[float]]:
        """``step_ends`` with nothing overlapped: each rank reduces its gradients after its last pass."""
        return self.step_ends([e + self.dp_reduce_time(s) for e, s in zip(end_bwd, self.stages)])
