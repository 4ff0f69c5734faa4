"""DeepSeek sparse attention with a strategy: what megatron-core asserts, and where it would
leave the fused TileLang kernels the model costs for its dense fp32 reference path (which
is not modelled), each named as a ConfigError.

Sources: megatron-core 0.19 ``transformer/experimental_attention_variant/`` (dsa.py,
dsa_kernels.py, ops/tilelang_dsa.py, absorbed_mla.py) and
``models/gpt/experimental_attention_variant_module_specs.py``.
"""

from __future__ import annotations

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError

# ops/tilelang_dsa.py fused_sparse_mla_absorbed: the SparseMLA kernels take the absorbed query
# and latent key of DeepSeek's widths only, and top-k in whole blocks of 64 keys
SPARSE_MLA_QK_DIM, SPARSE_MLA_V_DIM, SPARSE_MLA_TOPK_BLOCK = 576, 512, 64
SPARSE_MLA_MIN_HEADS = 16  # query heads per rank are padded to 16 (kernel_heads = max(heads, 16))


def sparse_mla_heads(heads_per_rank: int) -> int:
    """Heads the SparseMLA kernels run per rank: the rank's query heads, padded to 16."""
    return max(heads_per_rank, SPARSE_MLA_MIN_HEADS)


def dsa_topk(model: ModelConfig, seq_len: int) -> int:
    """Keys per query: the indexer's top-k, or every key of a shorter sequence
    (``topk_k = min(index_topk, sk)``)."""
    return min(model.dsa_indexer_topk or 0, seq_len)


def check_dsa(model: ModelConfig, st: StrategyConfig, chunk_layers: list[list[int]]) -> None:
    """Raise ConfigError for the first DSA rule the model and strategy break together;
    ``chunk_layers``: the 0-based layers of each model chunk (virtual stage)."""
    if st.dsa_kernel_backend != "tilelang":
        why = ("is Megatron's default: the dense reference path (an fp32 score matrix over every key per layer)"
               if st.dsa_kernel_backend == "none" else "fuses the indexer and attention in kernels not described here")
        raise ConfigError("dsa_kernel_backend", f"{st.dsa_kernel_backend} {why}, which is not modelled; tilelang is")
    if st.apply_rope_fusion:
        raise ConfigError("apply_rope_fusion", "RoPE fusion is not supported for DSAttention (Megatron asserts it): "
                          "set it false (--no-rope-fusion)")
    if st.transformer_impl == "local" or st.use_math_sdp:
        raise ConfigError("use_math_sdp" if st.use_math_sdp else "transformer_impl",
                          "DSA runs the TransformerEngine spec with fused attention (the unfused attention backend "
                          "turns its fused kernels off, dsa_kernels.use_fused_dsa_kernels)")
    if st.cp_size > 1 and st.cp_comm_type != "all_gather":
        raise ConfigError("cp_comm_type", "DSA's context parallelism is the all-gather scheme (DSAttention asserts "
                          f"cp_comm_type allgather; got {st.cp_comm_type})")
    if st.document_groups and st.cp_size > 1:
        raise ConfigError("document_lengths", "DSA over packed documents (THD) with context parallelism is not modelled")
    if st.tp_size > 1 and not st.sp:
        raise ConfigError("enable_sequence_parallel", "AbsorbedMLASelfAttention needs sequence parallelism with tp > 1, "
                          "as Megatron asserts")
    if st.low_precision and "mla_up_proj" in st.recomputed_modules:
        raise ConfigError("megatron_recompute_modules", "mla_up_proj recompute with fp8 / fp4 is refused by "
                          "AbsorbedMLASelfAttention, as Megatron asserts")
    _check_kernel_shapes(model, st)
    heads = model.dsa_indexer_n_heads or 0
    if model.dsa_indexer_loss_coeff and (heads > 64 or heads % 8):
        # ops/tilelang_indexer_bwd.is_supported_indexer_bwd_head_count
        raise ConfigError("dsa_indexer_n_heads", f"the indexer loss's TileLang backward takes at most 64 heads, a "
                          f"multiple of 8 (got {heads}); others run the dense reference path, not modelled")
    if model.dsa_indexer_topk_freq > 1:
        hybrid = model.hybrid_layer_pattern is not None
        for layers in chunk_layers:
            for layer in layers:
                if hybrid and model.layer_symbol(layer) != "D":
                    continue
                if hybrid and model.layer_symbol(model.dsa_source_layer(layer)) != "D":
                    raise ConfigError("dsa_indexer_topk_freq", f"block {layer + 1} reuses the top-k keys of block "
                                      f"{model.dsa_source_layer(layer) + 1}, which is no D block (Megatron would find "
                                      "no top-k to reuse)")
                if model.dsa_source_layer(layer) not in layers:
                    raise ConfigError("dsa_indexer_topk_freq", f"layer {layer + 1} reuses the top-k keys of layer "
                                      f"{model.dsa_source_layer(layer) + 1}, which is not earlier in its pipeline "
                                      "stage; each stage must start on a layer that runs the indexer, as Megatron "
                                      "asserts")


def _check_kernel_shapes(model: ModelConfig, st: StrategyConfig) -> None:
    """The TileLang kernels' shape limits (ops/tilelang_dsa.py): outside them Megatron falls
    back to the dense reference path without a word, which is not modelled."""
    qk = (model.kv_lora_rank or 0) + (model.qk_pos_emb_head_dim or 0)
    if qk != SPARSE_MLA_QK_DIM or model.kv_lora_rank != SPARSE_MLA_V_DIM:
        raise ConfigError("kv_lora_rank", f"the SparseMLA kernels take kv_lora_rank {SPARSE_MLA_V_DIM} + "
                          f"qk_pos_emb_head_dim {SPARSE_MLA_QK_DIM - SPARSE_MLA_V_DIM} (got {model.kv_lora_rank} + "
                          f"{model.qk_pos_emb_head_dim}); other widths run the dense reference path, not modelled")
    heads = sparse_mla_heads(model.head_num // st.tp_size)
    if heads & (heads - 1):
        raise ConfigError("tp_size", f"the SparseMLA kernels need a power of two of query heads per TP rank "
                          f"(got {model.head_num // st.tp_size}); others run the dense reference path, not modelled")
    if dsa_topk(model, st.seq_len) % SPARSE_MLA_TOPK_BLOCK:
        raise ConfigError("dsa_indexer_topk", f"the SparseMLA kernels take top-k in blocks of {SPARSE_MLA_TOPK_BLOCK} "
                          f"(got {dsa_topk(model, st.seq_len)}); others run the dense reference path, not modelled")
