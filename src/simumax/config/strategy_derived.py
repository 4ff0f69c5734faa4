"""What a strategy's fields imply (sizes, the schedule, the recipes and modes in effect,
byte widths): read-only properties StrategyConfig inherits, kept apart from its field
declarations."""

from __future__ import annotations

from typing import TYPE_CHECKING

FSDP2_IMPLS = ("torch_fsdp2", "megatron_torch_fsdp2")  # PyTorch's fully_shard: torchtitan's or Megatron's wrapper


class StrategyDerived:
    """Properties over StrategyConfig's fields (declared below for type checkers)."""

    if TYPE_CHECKING:
        world_size: int
        tp_size: int
        cp_size: int
        pp_size: int
        ep_size: int
        etp_size: int
        cp_comm_type: str
        hierarchical_context_parallel_sizes: list[int] | None
        pp_schedule: str | None
        interleaving_size: int
        overlap_p2p_comm: bool
        pp_comm_async: bool
        overlap_p2p_comm_warmup_flush: bool
        fsdp_replicate_size: int
        micro_batch_size: int
        micro_batch_num: int
        enable_sequence_parallel: bool
        fp8: bool
        fp8_recipe: str
        fp8_weight_caching: bool
        fp8_param_gather: bool
        fp4: bool
        fp4_recipe: str | None
        recompute_method: str
        recompute_layer_num: int | None
        megatron_recompute: bool
        enable_recompute: bool
        recompute_granularity: str | None
        zero_state: int
        ds_overlap_comm: bool | None
        fsdp_impl: str
        grad_reduce_in_bf16: bool
        use_fp32_accum_grad: bool
        dtype: str
        te_version: str | None
        seq_len: int
        document_lengths: int | list[int] | None

    @property
    def dp_size(self) -> int:
        return self.world_size // (self.tp_size * self.cp_size * self.pp_size)

    @property
    def schedule(self) -> str:
        """The pipeline schedule in effect."""
        if self.pp_schedule:
            return self.pp_schedule
        return "interleaved" if self.interleaving_size > 1 else "1f1b"

    @property
    def chunks_per_rank(self) -> int:
        """Model chunks (virtual stages) each pipeline rank holds."""
        return {"interleaved": self.interleaving_size, "dualpipev": 2}.get(self.schedule, 1)

    @property
    def p2p_overlapped(self) -> bool:
        return self.overlap_p2p_comm or self.pp_comm_async

    @property
    def p2p_blocks_warmup_flush(self) -> bool:
        """Megatron's interleaved schedule overlaps P2P in its steady state only: the warm-up
        forwards and the flush backwards send blocking (pipeline_parallel/schedules.py, 0.8
        and 0.19) unless --overlap-p2p-communication-warmup-flush."""
        return self.p2p_overlapped and self.schedule == "interleaved" and not self.overlap_p2p_comm_warmup_flush

    @property
    def dp_shard_size(self) -> int:
        """Ranks one dense state is sharded over: dp x cp, or one HSDP replica of them."""
        return self.dp_size * self.cp_size // self.fsdp_replicate_size

    @property
    def cp_a2a_size(self) -> int:
        """CP ranks of one all-to-all group: all of CP with a2a, the first hierarchical
        level with a2a+p2p, none (1) with the ring or all-gather schemes."""
        if self.cp_comm_type == "a2a":
            return self.cp_size
        if self.cp_comm_type == "a2a+p2p" and self.hierarchical_context_parallel_sizes:
            return self.hierarchical_context_parallel_sizes[0]
        return 1

    @property
    def cp_p2p_size(self) -> int:
        """CP ranks of one ring (p2p, and a2a+p2p's second level)."""
        if self.cp_comm_type == "p2p":
            return self.cp_size
        return self.cp_size // self.cp_a2a_size if self.cp_comm_type == "a2a+p2p" else 1

    @property
    def document_groups(self) -> tuple[tuple[int, int], ...]:
        """(document length, documents of that length in one sequence), longest first, of
        the documents packed into a sequence; () for one document per sequence (no
        ``document_lengths``, or one of seq_len)."""
        lengths = self.document_lengths
        if lengths is None:
            return ()
        if isinstance(lengths, int):
            full, rest = divmod(self.seq_len, lengths)
            counts = {lengths: full} if full else {}
            if rest:
                counts[rest] = counts.get(rest, 0) + 1
        else:
            counts = {}
            for n in lengths:
                counts[n] = counts.get(n, 0) + 1
        groups = tuple(sorted(counts.items(), reverse=True))
        return () if groups == ((self.seq_len, 1),) else groups

    @property
    def edp_size(self) -> int:
        """Expert-data-parallel size: ranks holding the same expert shard within a stage."""
        return self.world_size // (self.pp_size * self.ep_size * self.etp_size)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.micro_batch_num * self.dp_size

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (it is a no-op at tp == 1)."""
        return self.enable_sequence_parallel and self.tp_size > 1

    @property
    def low_precision(self) -> bool:
        """TE linears run low-precision GEMMs (fp8 or fp4)."""
        return self.fp8_on or self.fp4_on

    @property
    def fp8_on(self) -> bool:
        """FP8 linears: ``fp8`` set, or a recipe other than the default named (``--set
        fp8_recipe=mxfp8`` means FP8 with that recipe)."""
        return self.fp8 or self.fp8_recipe != "delayed"

    @property
    def fp4_on(self) -> bool:
        """FP4 linears: ``fp4`` set, or an fp4 recipe named."""
        return self.fp4 or self.fp4_recipe is not None

    @property
    def fp8_wgrad_on(self) -> bool:
        """Weight-gradient GEMMs in low precision: off only for fp8's delayed recipe with
        ``fp8_wgrad`` false (megatron-core fp8_utils.get_fp8_recipe)."""
        return not (self.fp8_on and not self.fp4_on and self.fp8_recipe == "delayed" and not self.fp8_wgrad)

    @property
    def fp8_weights_kept(self) -> bool:
        """The linears' fp8 weights outlive a micro-batch: TE's cached casts
        (``fp8_weight_caching``), or the fp8 parameters themselves (``fp8_param_gather``:
        nothing to cast per micro-batch)."""
        return self.fp8_weight_caching or self.fp8_param_gather

    @property
    def lp_recipe(self) -> str:
        """The low-precision recipe in effect (graph/fp8.RECIPES)."""
        return (self.fp4_recipe or "nvfp4") if self.fp4_on else self.fp8_recipe

    @property
    def recompute_group_layers(self) -> int:
        """Layers per checkpoint: ``recompute_layer_num`` under full_block's uniform method
        (null: 1), else 1 (one checkpoint per recomputed layer)."""
        if self.recompute_method == "uniform" and self.recompute_mode == "full_block":
            return self.recompute_layer_num or 1
        return 1

    @property
    def recompute_mode(self) -> str:
        """'none', 'full_block', 'selective' or 'megatron' — what the IR acts on."""
        if self.megatron_recompute:
            return "megatron"
        if not self.enable_recompute or self.recompute_granularity is None:
            return "none"
        if self.recompute_layer_num == 0 and self.recompute_granularity in ("full_block", "attn_only", "mlp_only"):
            return "none"  # SimuMax's default layer count: no layer recomputes
        return "full_block" if self.recompute_granularity == "full_block" else "selective"

    @property
    def recomputed_modules(self) -> frozenset[str]:
        """Megatron's recompute modules in force (``--recompute-modules``; none unless
        megatron_recompute)."""
        return frozenset(self.megatron_recompute_modules) if self.recompute_mode == "megatron" else frozenset()

    @property
    def ds_overlap(self) -> bool:
        """DeepSpeed's overlap_comm as it resolves: true at stage 3 unless set."""
        return self.zero_state == 3 if self.ds_overlap_comm is None else self.ds_overlap_comm

    @property
    def fsdp2(self) -> bool:
        """PyTorch FSDP2 (``fully_shard``) shards the data-parallel state: torchtitan's or
        Megatron-LM's wrapper of it."""
        return self.fsdp_impl in FSDP2_IMPLS

    @property
    def main_grad_bytes(self) -> int:
        # DeepSpeed keeps and reduces gradients in the model dtype, as Megatron's FSDP2 wrapper
        # does (no main_grad: fully_shard without a mixed-precision policy over the bf16 model)
        if self.fsdp_impl in ("deepspeed", "megatron_torch_fsdp2"):
            return self.dtype_bytes
        if self.grad_reduce_in_bf16 or not self.use_fp32_accum_grad:
            return 2
        return 4

    @property
    def dtype_bytes(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    def te_at_least(self, version: str) -> bool:
        if not self.te_version:
            return False
        def parts(v: str) -> tuple[int, ...]:
            out = []
            for p in v.split(".")[:3]:
                digits = "".join(ch for ch in p if ch.isdigit())
                out.append(int(digits or 0))
            return tuple(out)
        return parts(self.te_version) >= parts(version)
