"""Megatron-Core 0.19's DeepSeek-sparse-attention layers, built on the meta device on CPU:
parameters per decoder layer.

megatron-core builds DSA only from its TransformerEngine spec
(``experimental_attention_variant_module_specs.get_dsa_module_spec_for_backend``), whose
modules need TE; here the same modules (AbsorbedMLASelfAttention, DSAttention, DSAIndexer)
get the local spec's linears at TP1 — ColumnParallelLinear keeps the whole weight there, as
TE's duplicated linear does — and the indexer's "duplicated" linears a stand-in that only
allocates the [out, in] weight megatron-core asks for. Parameters are what is compared: the
modules decide every shape (absorbed MLA's, the indexer's and its key LayerNorm's, and which
layers share an earlier layer's top-k and build no indexer).

Usage: python -m tests.reference.mcore_dsa SPECS.json OUT.json (one process, gloo world 1)."""

from __future__ import annotations

import json
import os
import sys
import warnings


def build(spec: dict):
    import torch
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.experimental_attention_variant.absorbed_mla import (
        AbsorbedMLASelfAttention, AbsorbedMLASelfAttentionSubmodules)
    from megatron.core.transformer.experimental_attention_variant.dsa import (
        DSAIndexer, DSAIndexerSubmodules, DSAttention, DSAttentionSubmodules)
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    class Duplicated(torch.nn.Module):
        """TE's Linear in "duplicated" mode as far as its parameters go: the whole weight."""

        def __init__(self, input_size, output_size, *, config, bias, parallel_mode, **_):
            super().__init__()
            assert parallel_mode == "duplicated" and not bias
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))

    cfg = MLATransformerConfig(
        num_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        ffn_hidden_size=spec["ffn"], gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
        add_bias_linear=False, tensor_model_parallel_size=1, bf16=True, params_dtype=torch.bfloat16,
        q_lora_rank=spec["q_lora_rank"], kv_lora_rank=spec["kv_lora_rank"], qk_head_dim=spec["qk_head_dim"],
        qk_pos_emb_head_dim=spec["rope"], v_head_dim=spec["v_head_dim"], rope_type="rope", qk_layernorm=True,
        kv_channels=spec["v_head_dim"], experimental_attention_variant="dsa", dsa_indexer_n_heads=spec["index_heads"],
        dsa_indexer_head_dim=spec["index_dim"], dsa_indexer_topk=spec["topk"], dsa_indexer_topk_freq=spec.get("freq", 1),
        dsa_indexer_skip_topk_offset=spec.get("offset", 0), init_model_with_meta_device=True,
        use_cpu_initialization=True, gradient_accumulation_fusion=False, persist_layer_norm=False,
        masked_softmax_fusion=False, apply_rope_fusion=False,
    )
    layer = get_gpt_layer_local_spec(normalization="RMSNorm", multi_latent_attention=True, qk_layernorm=True)
    norms = layer.submodules.self_attention.submodules
    indexer = ModuleSpec(module=DSAIndexer, submodules=DSAIndexerSubmodules(
        linear_wq_b=Duplicated, linear_wk=Duplicated, k_norm=WrappedTorchNorm, linear_weights_proj=Duplicated))
    layer.submodules.self_attention = ModuleSpec(
        module=AbsorbedMLASelfAttention, params={"attn_mask_type": AttnMaskType.causal},
        submodules=AbsorbedMLASelfAttentionSubmodules(
            linear_q_proj=ColumnParallelLinear, linear_q_down_proj=ColumnParallelLinear,
            linear_q_up_proj=ColumnParallelLinear, linear_kv_down_proj=ColumnParallelLinear,
            linear_kv_up_proj=ColumnParallelLinear, linear_proj=RowParallelLinear,
            core_attention=ModuleSpec(module=DSAttention, submodules=DSAttentionSubmodules(indexer=indexer)),
            q_layernorm=norms.q_layernorm, kv_layernorm=norms.kv_layernorm,
        ),
    )
    return GPTModel(cfg, layer, vocab_size=spec["vocab"], max_sequence_length=spec["seq"],
                    position_embedding_type="rope", share_embeddings_and_output_weights=False)


def main() -> None:
    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    from tests.reference.mcore_harness import _cpu_patches

    _cpu_patches()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    out = []
    for spec in json.load(open(sys.argv[1])):
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
        model_parallel_cuda_manual_seed(1234)
        model = build(spec)
        out.append({"id": spec["id"], "params": sum(p.numel() for p in model.parameters()),
                    "layer_params": [sum(p.numel() for p in layer.parameters()) for layer in model.decoder.layers]})
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
