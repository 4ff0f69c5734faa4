"""Per-rank tensor sizes one strategy implies, computed once and shared by all builders."""

from __future__ import annotations

from dataclasses import dataclass

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig


@dataclass(frozen=True, slots=True)
class Dims:
    b: int  # micro-batch size
    s: int  # sequence per CP rank
    tokens: int  # b * s: rows of every GEMM
    local_tokens: int  # rows of a sequence-parallel activation (tokens / tp with SP)
    tp: int
    sp: bool
    cp: int
    cp_comm: str  # a2a | all_gather | p2p | a2a+p2p
    h: int
    heads: int  # query heads per TP rank
    kv_heads: int  # kv heads per TP rank (replicated when tp > kv_head_num)
    head_dim: int
    ffn: int  # dense MLP hidden per TP rank
    vocab: int  # padded vocab per TP rank
    act_bytes: int  # bytes of one activation element (bf16: 2)
    fp8: bool  # TE linears run fp8 GEMMs
    local: bool = False  # Megatron-Core's own modules (transformer_impl local), not TransformerEngine
    fp8_recipe: str = "delayed"  # graph/fp8.RECIPES
    fp8_weight_caching: bool = True  # weights cast once per iteration, not per micro-batch
    fp8_wgrad: bool = True  # weight-gradient GEMMs in fp8 too (else BF16 on the kept BF16 input)
    main_grad_bytes: int = 4  # bytes of one main-gradient element (fp32; 2 with bf16 main grads)
    wgrad_fused: bool = True  # weight-gradient GEMMs accumulate into the main grad (gradient_accumulation_fusion)
    grad_hook: bool = True  # DDP's hook adds written weight gradients to the main grad (not under FSDP2)
    cp_a2a: int = 1  # CP ranks of one all-to-all (a2a: cp; a2a+p2p: its first level)
    cp_p2p: int = 1  # CP ranks of one ring (p2p: cp; a2a+p2p: its second level)
    # documents packed into one sequence, attention within each (THD): (length, count), longest
    # first; () for one document per sequence (StrategyConfig.document_groups)
    docs: tuple[tuple[int, int], ...] = ()
    # attention's output projection and the shared experts' FC1 keep their BF16 input, which
    # attention / the router keep anyway, not an FP8 copy (megatron-core's
    # set_save_original_input: fp8 recipes but delayed with TransformerEngine >= 2.6, fp4 with
    # >= 2.7; Attention / MLA / AbsorbedMLA / SharedExpertMLP.__init__)
    keeps_original_input: bool = False

    @classmethod
    def of(cls, model: ModelConfig, st: StrategyConfig) -> "Dims":
        tp, cp = st.tp_size, st.cp_size
        s = st.seq_len // cp
        tokens = st.micro_batch_size * s
        sp = st.sp
        return cls(
            b=st.micro_batch_size,
            s=s,
            tokens=tokens,
            local_tokens=tokens // tp if sp else tokens,
            tp=tp,
            sp=sp,
            cp=cp,
            cp_comm=st.cp_comm_type,
            cp_a2a=st.cp_a2a_size,
            cp_p2p=st.cp_p2p_size,
            h=model.hidden_size,
            heads=model.head_num // tp,
            kv_heads=max(model.kv_head_num // tp, 1),
            head_dim=model.head_size,
            ffn=model.intermediate_size // tp,
            vocab=model.padded_vocab(tp) // tp,
            act_bytes=st.dtype_bytes,
            fp8=st.low_precision,
            local=st.transformer_impl == "local",
            fp8_recipe=st.lp_recipe,
            fp8_weight_caching=st.fp8_weights_kept,
            fp8_wgrad=st.fp8_wgrad_on,
            main_grad_bytes=st.main_grad_bytes,
            wgrad_fused=st.gradient_accumulation_fusion,
            grad_hook=not st.fsdp2,
            docs=st.document_groups,
            keeps_original_input=(st.fp4_on and st.te_at_least("2.7")) or (
                st.fp8_on and not st.fp4_on and st.fp8_recipe != "delayed" and st.te_at_least("2.6")),
        )

    def act(self, width: int, local: bool = False) -> float:
        """Bytes of a [tokens, width] activation (sequence-sharded when ``local`` and SP)."""
        return float((self.local_tokens if local else self.tokens) * width * self.act_bytes)
