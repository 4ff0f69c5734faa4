"""Megatron-Core 0.19's DeepSeek-sparse-attention layers on CPU: parameters per decoder layer
(built on the meta device), and for a spec with ``run`` one micro-batch's matmul FLOPs.

megatron-core builds DSA only from its TransformerEngine spec
(``experimental_attention_variant_module_specs.get_dsa_module_spec_for_backend``), whose
modules need TE; here the same modules (AbsorbedMLASelfAttention, DSAttention, DSAIndexer)
get the local spec's linears at TP1 — ColumnParallelLinear keeps the whole weight there, as
TE's duplicated linear does — and the indexer's "duplicated" linears a stand-in that only
allocates the [out, in] weight megatron-core asks for (and runs it as ``F.linear``). The
modules decide every shape (absorbed MLA's, the indexer's and its key LayerNorm's, and which
layers share an earlier layer's top-k and build no indexer). A run takes DSAttention's dense
reference path (the TileLang kernels need a GPU) without the Hadamard rotation
(fast_hadamard_transform needs CUDA): its FLOPs differ from the fused kernels' only in the
indexer's scores (every key, not the causal ones) and the attention (every key, not the
top-k), which the test accounts for.

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
            if not config.init_model_with_meta_device:
                torch.nn.init.normal_(self.weight, std=0.02)

        def forward(self, x):
            return F.linear(x, self.weight), None

    cfg = MLATransformerConfig(
        num_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        ffn_hidden_size=spec["ffn"], gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm",
        add_bias_linear=False, tensor_model_parallel_size=1, bf16=True, params_dtype=torch.bfloat16,
        q_lora_rank=spec["q_lora_rank"], kv_lora_rank=spec["kv_lora_rank"], qk_head_dim=spec["qk_head_dim"],
        qk_pos_emb_head_dim=spec["rope"], v_head_dim=spec["v_head_dim"], rope_type="rope", qk_layernorm=True,
        kv_channels=spec["v_head_dim"], experimental_attention_variant="dsa", dsa_indexer_n_heads=spec["index_heads"],
        dsa_indexer_head_dim=spec["index_dim"], dsa_indexer_topk=spec["topk"], dsa_indexer_topk_freq=spec.get("freq", 1),
        dsa_indexer_skip_topk_offset=spec.get("offset", 0), init_model_with_meta_device=not spec.get("run"),
        dsa_indexer_rotate_activation=spec.get("rotate", True),
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


def run(model, spec: dict) -> dict:
    """One micro-batch forward and backward under FlopCounterMode: matmul FLOPs per decoder
    layer in forward, and the whole model's forward and backward. On the CPU DSAttention takes
    its dense reference path (kernel backend none): the indexer's scores over every key and
    attention over every key, masked to the top-k."""
    from megatron.core.transformer.module import Float16Module
    from torch.utils.flop_counter import FlopCounterMode

    from tests.reference.mcore_harness import batch

    net = Float16Module(model.config, model)
    tokens, pos, mask, labels = batch(spec)
    fwd = FlopCounterMode(display=False)
    with fwd:
        loss = net(tokens, pos, mask, labels=labels)
    counts = fwd.get_flop_counts()
    layers = []
    for i in range(spec["layers"]):
        key = next(k for k in counts if k.endswith(f"decoder.layers.{i}"))
        layers.append(int(sum(counts[key].values())))
    bwd = FlopCounterMode(display=False)
    with bwd:
        loss.sum().backward()
    return {"layer_fwd_flops": layers, "fwd_flops": int(sum(counts["Global"].values())),
            "bwd_flops": int(sum(bwd.get_flop_counts()["Global"].values()))}


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
        res = {"id": spec["id"], "params": sum(p.numel() for p in model.parameters()),
               "layer_params": [sum(p.numel() for p in layer.parameters()) for layer in model.decoder.layers]}
        if spec.get("run"):
            res.update(run(model, spec))
        out.append(res)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
