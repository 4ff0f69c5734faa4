"""Run Megatron-Core's GPTModel (local, non-TransformerEngine layer spec) for one
micro-batch forward + backward on CPU and measure, per transformer layer: bytes saved for
backward, forward matmul FLOPs, and parameters per rank.

Usage: python -m tests.reference.mcore_harness SPECS.json OUT.json
SPECS.json is a list of specs that share one world size; the script spawns that many gloo
processes, builds each spec's model in turn (imports paid once) and rank 0 writes the list
of results. A spec: {"id", "world", "tp", "sp", "ep", "seq", "batch", "hidden", "heads",
"kv_heads", "ffn", "layers", "vocab", "swiglu", "norm", "bias", "recompute": none |
selective | full, "experts", "topk", "moe_ffn", "act_fusion"}.

What is measured is exact and repeatable: saved-for-backward bytes are unique storages seen
by ``torch.autograd.graph.saved_tensors_hooks`` while a layer's forward runs (parameters
excluded), at their size when forward ends (a checkpoint that discards its output resizes its
storage to 0); FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
import weakref


def _cpu_patches() -> None:
    """CPU stand-ins for the CUDA calls Megatron-Core makes while building and running."""
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)

    class _Noop:
        def __init__(self, *a, **k) -> None: ...
        def __enter__(self): return self
        def __exit__(self, *a) -> None: ...
        def wait_stream(self, *a) -> None: ...
        def record(self, *a) -> None: ...
        def synchronize(self) -> None: ...
        def wait(self, *a) -> None: ...
        def record_event(self, *a) -> "_Noop": return self
        def query(self) -> bool: return True

    torch.cuda.Stream = _Noop  # type: ignore[assignment,misc]
    torch.cuda.Event = _Noop  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: _Noop()  # type: ignore[assignment]
    torch.cuda.stream = lambda *a, **k: _Noop()  # type: ignore[assignment]
    # torch 2.13 with gloo wants split sizes as Python lists in all_to_all_single
    import torch.distributed as dist

    orig = dist.all_to_all_single

    def a2a(output, input, output_split_sizes=None, input_split_sizes=None, *a, **k):
        tolist = lambda s: s.tolist() if isinstance(s, torch.Tensor) else s  # noqa: E731
        return orig(output, input, tolist(output_split_sizes), tolist(input_split_sizes), *a, **k)

    dist.all_to_all_single = a2a
    # Without apex the local norm refuses sequence_parallel: build it from a copy of the
    # config with the flag off and mark its weights sequence-parallel (their gradients
    # are then all-reduced over TP like Megatron's SP norms)
    import dataclasses

    from megatron.core.transformer import torch_norm

    orig_new = torch_norm.WrappedTorchNorm.__new__

    def norm_new(cls, config, *a, **k):
        sp = config.sequence_parallel
        if sp:
            config = dataclasses.replace(config, sequence_parallel=False)
        mod = orig_new(cls, config, *a, **k)
        for p in mod.parameters():
            p.sequence_parallel = sp
        return mod

    torch_norm.WrappedTorchNorm.__new__ = norm_new
    # CheckpointWithoutOutput (--recompute-modules layernorm / moe_act / ...) takes three
    # TransformerEngine helpers: whether fp8 is on (it is not), its fp8 context and the context TE's own
    # modules read while a forward is recomputed (none here)
    if not hasattr(mrandom, "FP8GlobalStateManager"):
        import contextlib

        class _NoFp8:
            @staticmethod
            def is_fp8_enabled() -> bool:
                return False

        mrandom.FP8GlobalStateManager = _NoFp8
        mrandom.activation_recompute_forward = lambda **kw: contextlib.nullcontext()
        mrandom.fp8_autocast = lambda **kw: contextlib.nullcontext()
    # the sliding-window mask is built on "cuda" (transformer/utils.py): the same on the CPU
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as tutils

    def sliding_window_mask(sq, skv, window_size):
        m = torch.ones(sq, skv, dtype=torch.bool)
        return ~torch.tril(torch.triu(m, diagonal=skv - sq - window_size[0]), diagonal=skv - sq + window_size[1])

    tutils.get_sliding_window_causal_mask = fused_softmax.get_sliding_window_causal_mask = sliding_window_mask
    from megatron.core.tensor_parallel import mappings

    if hasattr(mappings, "dist"):
        mappings.dist = dist


def _config(spec: dict):
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    rec = spec.get("recompute", "none")
    kw = dict(
        num_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        num_query_groups=spec.get("kv_heads") or spec["heads"], ffn_hidden_size=spec["ffn"],
        gated_linear_unit=spec.get("swiglu", True), activation_func=F.silu if spec.get("swiglu", True) else F.gelu,
        normalization="RMSNorm" if spec.get("norm", "rmsnorm") == "rmsnorm" else "LayerNorm",
        add_bias_linear=spec.get("bias", False), tensor_model_parallel_size=spec["tp"],
        sequence_parallel=bool(spec.get("sp")),
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        hidden_dropout=spec.get("dropout", 0.0), attention_dropout=spec.get("dropout", 0.0), bias_activation_fusion=spec.get("act_fusion", False),
        masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, use_cpu_initialization=True,
        init_method_std=0.02,
    )
    if spec.get("mtp"):
        kw.update(mtp_num_layers=spec["mtp"])
    if spec.get("pp", 1) > 1:
        # built on the meta device: only its parameter counts are read (the tied copy is not synced)
        kw.update(pipeline_model_parallel_size=spec["pp"], pipeline_dtype=torch.bfloat16, init_model_with_meta_device=True)
    if spec.get("qk_norm"):
        kw.update(qk_layernorm=True)
    if spec.get("qkv_bias"):
        kw.update(add_qkv_bias=True)
    if spec.get("window"):  # sliding-window attention (every layer)
        kw.update(window_size=(spec["window"], 0))
    if spec.get("sinks"):  # a learnable softmax offset per head (gpt-oss's attention sinks)
        kw.update(softmax_type="learnable")
    if spec.get("output_gate"):
        kw.update(attention_output_gate=True)
    if spec.get("modules"):  # --recompute-modules
        kw.update(recompute_granularity="selective", recompute_modules=list(spec["modules"]))
    elif rec == "selective":
        kw.update(recompute_granularity="selective")
    elif rec == "full":
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=spec.get("recompute_group", 1))
    if spec.get("mla"):  # DeepSeek's multi-latent attention (MLASelfAttention), RoPE on the rope dims
        kw.update(q_lora_rank=spec.get("q_lora_rank"), kv_lora_rank=spec["kv_lora_rank"],
                  qk_head_dim=spec["qk_head_dim"], qk_pos_emb_head_dim=spec["qk_pos_emb_head_dim"],
                  v_head_dim=spec["v_head_dim"], rope_type="rope", qk_layernorm=True, kv_channels=spec["v_head_dim"])
    if spec.get("experts"):
        kw.update(num_moe_experts=spec["experts"], moe_router_topk=spec["topk"], moe_ffn_hidden_size=spec.get("moe_ffn") or spec["ffn"],
                  moe_token_dispatcher_type=spec.get("dispatcher", "alltoall"), expert_model_parallel_size=spec.get("ep", 1),
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, moe_grouped_gemm=False,
                  moe_router_pre_softmax=spec["topk"] == 1 and spec.get("score", "softmax") == "softmax",
                  moe_shared_expert_intermediate_size=spec.get("shared_ffn"), moe_shared_expert_gate=bool(spec.get("shared_gate")),
                  expert_tensor_parallel_size=spec.get("etp", spec["tp"]), moe_latent_size=spec.get("latent"))
        if spec.get("score") == "sigmoid":  # DeepSeek-V3's router: sigmoid scores, expert bias, groups
            kw.update(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3,
                      moe_router_num_groups=spec.get("groups"), moe_router_group_topk=spec.get("group_topk"),
                      moe_router_topk_scaling_factor=2.5)
        if spec.get("router_fp32"):  # --moe-router-dtype fp32
            kw.update(moe_router_dtype="fp32")
        if spec.get("balance"):  # the auxiliary load-balancing loss
            kw.update(moe_router_load_balancing_type=spec["balance"], moe_aux_loss_coeff=1e-3)
        if spec.get("z_loss"):
            kw.update(moe_z_loss_coeff=1e-3)
    if spec.get("mla"):
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def _mla_core_attention(layer_spec) -> None:
    """Megatron-Core 0.19's local MLA spec pairs MLASelfAttention with DotProductAttention,
    which does not take the k_channels / v_channels MLASelfAttention passes (TE's attention
    does): a subclass that drops them (the config's kv_channels is the value head dim, which
    sizes the output; q and k keep their own width through the batched products).
    (A full-rank q, q_lora_rank None, does not build with the local backend: MLASelfAttention
    then asks the backend for a fused norm + linear, which only TransformerEngine has.)"""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class LocalMLACoreAttention(DotProductAttention):
        def __init__(self, *a, k_channels=None, v_channels=None, **k):
            super().__init__(*a, **k)

    layer_spec.submodules.self_attention.submodules.core_attention = LocalMLACoreAttention


def batch(spec: dict) -> tuple:
    """(tokens, position ids, causal mask, labels) of one micro-batch, the same every run."""
    import torch

    s, b = spec["seq"], spec["batch"]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec["vocab"], (b, s), generator=g)
    labels = torch.randint(0, spec["vocab"], (b, s), generator=g)
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    return tokens, pos, torch.triu(torch.ones(1, 1, s, s, dtype=torch.bool), diagonal=1), labels


def measure(spec: dict) -> dict:
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()  # sized by the first MTP model's depth: each spec starts it afresh
    parallel_state.destroy_model_parallel()
    pp = spec.get("pp", 1)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=spec["tp"], expert_model_parallel_size=spec.get("ep", 1),
                                             expert_tensor_parallel_size=spec.get("etp", spec["tp"]) if spec.get("experts") else None,
                                             pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(1234)
    cfg = _config(spec)
    layer_spec = get_gpt_layer_local_spec(num_experts=spec.get("experts"), normalization=cfg.normalization,
                                          multi_latent_attention=bool(spec.get("mla")),
                                          qk_layernorm=bool(spec.get("mla") or spec.get("qk_norm")))
    if spec.get("mla"):
        _mla_core_attention(layer_spec)
    first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
    mtp_spec = get_gpt_mtp_block_spec(cfg, layer_spec, use_transformer_engine=False) if spec.get("mtp") and last else None
    model = GPTModel(cfg, layer_spec, vocab_size=spec["vocab"], max_sequence_length=spec["seq"],
                     position_embedding_type="rope" if spec.get("rope", True) else "learned_absolute", share_embeddings_and_output_weights=not spec.get("untie", True),
                     mtp_block_spec=mtp_spec, pre_process=first, post_process=last)
    if pp > 1:  # a pipeline stage's parameters (the embedding on the first, the head on the last)
        return {"id": spec["id"], "rank": torch.distributed.get_rank(), "params": sum(p.numel() for p in model.parameters())}
    # the decoder's layers, then the multi-token-prediction depths' (each one "layer" here)
    layers = list(model.decoder.layers) + (list(model.mtp.layers) if mtp_spec is not None else [])
    names = [f"decoder.layers.{i}" for i in range(len(model.decoder.layers))] + [f"mtp.layers.{j}" for j in range(len(layers) - len(model.decoder.layers))]
    params = sum(p.numel() for p in model.parameters())
    layer_params = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    net = Float16Module(cfg, model)
    tokens, pos, mask, labels = batch(spec)

    # storages are told apart by their StorageImpl (``_cdata``), not their address: a
    # storage a discarding checkpoint resized to 0 stays alive while its address is reused
    exclude = {p.untyped_storage()._cdata for p in model.parameters()}
    current: list[int] = []  # stack of the layers whose forward is running
    # storage -> (owner layer, bytes, weak references to every tensor saved on it). A
    # storage counts if a saved tensor on it is still alive when forward ends: tensors
    # saved by graph pieces that were dropped (e.g. bias-dropout-add, which Megatron runs
    # under enable_grad inside a no-grad full-recompute forward) are not kept for backward
    kept: dict[int, tuple[int | None, int, list]] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st._cdata
        if ptr in exclude:
            return t
        entry = kept.get(ptr)
        if entry is None or not any(r() is not None for r in entry[2]):  # new, or a freed StorageImpl's reused address
            entry = kept[ptr] = (current[-1] if current else None, st.nbytes(), [])
        entry[2].append(weakref.ref(t))
        return t

    def pre(idx):
        def hook(mod, args):
            current.append(idx)
        return hook

    def post(mod, args, out):
        current.pop()

    # full recompute checkpoints each layer from the block, outside the layer's own
    # forward: attribute what a block-level checkpoint saves to the layer it wraps
    from megatron.core import tensor_parallel

    orig_checkpoint = tensor_parallel.checkpoint
    next_layer = [0]

    def checkpoint(fn, *args, **kwargs):
        if current:  # a checkpoint inside a layer (selective recompute)
            return orig_checkpoint(fn, *args, **kwargs)
        current.append(next_layer[0])
        next_layer[0] += 1
        try:
            return orig_checkpoint(fn, *args, **kwargs)
        finally:
            current.pop()

    tensor_parallel.checkpoint = checkpoint
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(pre(i)))
        handles.append(layer.register_forward_hook(post))
    flops = FlopCounterMode(display=False)
    with flops, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = net(tokens, pos, mask, labels=labels)
    for h in handles:
        h.remove()
    tensor_parallel.checkpoint = orig_checkpoint
    gc.collect()  # dropped graph pieces can sit in reference cycles
    per_layer = [0] * len(layers)
    other = 0
    for owner, _, refs in kept.values():
        alive = [t for t in (r() for r in refs) if t is not None]
        if not alive:
            continue
        # its size now: a checkpoint that discards its output (CheckpointWithoutOutput,
        # --recompute-modules layernorm / mlp ...) frees the storage by resizing it to 0
        nbytes = alive[0].untyped_storage().nbytes()
        if owner is None:
            other += nbytes
        else:
            per_layer[owner] += nbytes
    counts = flops.get_flop_counts()
    layer_flops = []
    for name in names:
        key = next((k for k in counts if k.endswith(name)), None)
        layer_flops.append(int(sum(counts[key].values())) if key else 0)
    total_fwd = int(sum(counts.get("Global", {}).values()))
    bwd_flops = FlopCounterMode(display=False)
    with bwd_flops:  # the step must run: saved tensors are valid, recompute works
        loss.sum().backward()
    kept.clear()
    total_bwd = int(sum(bwd_flops.get_flop_counts().get("Global", {}).values()))  # recomputed forwards included
    return {"id": spec["id"], "rank": torch.distributed.get_rank(), "params": params, "layer_params": layer_params,
            "layer_saved": per_layer, "other_saved": other, "layer_fwd_flops": layer_flops, "fwd_flops": total_fwd,
            "bwd_flops": total_bwd}


def _worker(rank: int, world: int, specs: list[dict], out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _cpu_patches()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for spec in specs:
        r = measure(spec)
        gathered = [None] * world
        dist.all_gather_object(gathered, r)
        results.append(gathered)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    specs = json.load(open(sys.argv[1]))
    world = specs[0]["world"]
    port = 29600 + os.getpid() % 1000
    if world == 1:
        _worker(0, 1, specs, sys.argv[2], port)
    else:
        mp.spawn(_worker, args=(world, specs, sys.argv[2], port), nprocs=world, join=True)


if __name__ == "__main__":
    main()
