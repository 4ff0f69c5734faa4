"""simumax's prediction for a harness spec (tests/reference/mcore_harness.py): the same
model and strategy, read per transformer layer from the op IR."""

from __future__ import annotations

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.loader import load_system
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention, Gemm, GroupGemm
from simumax.memory.activation_walk import walk


def configs(spec: dict) -> tuple[ModelConfig, StrategyConfig]:
    model = {
        "model_name": spec["id"], "hidden_size": spec["hidden"], "head_num": spec["heads"],
        "kv_head_num": spec.get("kv_heads") or spec["heads"], "intermediate_size": spec["ffn"],
        "layer_num": spec["layers"], "vocab_size": spec["vocab"], "use_swiglu": spec.get("swiglu", True),
        "norm_type": spec.get("norm", "rmsnorm"), "add_bias_linear": spec.get("bias", False),
        "untie_embeddings_and_output_weights": spec.get("untie", True), "make_vocab_size_divisible_by": 128,
        "position_embedding_type": "rope" if spec.get("rope", True) else "learned_absolute",
        "max_position_embeddings": spec["seq"],
    }
    if spec.get("mtp"):
        model.update(mtp_num_layers=spec["mtp"])
    if spec.get("qk_norm"):
        model.update(qk_layernorm=True)
    if spec.get("qkv_bias"):
        model.update(add_qkv_bias=True)
    if spec.get("output_gate"):
        model.update(attention_output_gate=True)
    if spec.get("window"):
        model.update(window_size=spec["window"])
    if spec.get("sinks"):
        model.update(attention_sinks=True)
    if spec.get("latent"):
        model.update(moe_latent_size=spec["latent"])
    if spec.get("mla"):
        model.update(attention_type="mla", **{k: spec[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")})
    if spec.get("experts"):
        # dropless, as the harness runs it; with EP the test compares the mean over ranks, which
        # padding to capacity 1 gives the busiest rank (dropless, it is the expected maximum
        # over the ranks of a random routing: moe_rows.busiest_rank_factor)
        ep = spec.get("ep", 1) > 1
        model.update(model_type="moe", expert_num=spec["experts"], topk=spec["topk"], moe_ffn_hidden_size=spec.get("moe_ffn") or spec["ffn"],
                     moe_pad_expert_input_to_capacity=ep, capacity=1.0 if ep else None)
        if spec.get("score") == "sigmoid":
            model.update(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_num_groups=spec.get("groups"),
                         moe_router_group_topk=spec.get("group_topk"), moe_router_topk_scaling_factor=2.5)
        model.update(moe_router_load_balancing_type=spec.get("balance", "none"),
                     moe_router_pre_softmax=spec["topk"] == 1 and spec.get("score", "softmax") == "softmax")
        if spec.get("z_loss"):
            model.update(moe_z_loss_coeff=1e-3)
        if spec.get("shared_ffn"):
            model.update(moe_shared_expert_intermediate_size=spec["shared_ffn"], moe_shared_expert_gate=bool(spec.get("shared_gate")))
    rec = spec.get("recompute", "none")
    strategy = {
        "seq_len": spec["seq"], "micro_batch_size": spec["batch"], "micro_batch_num": 1, "world_size": spec["world"],
        "tp_size": spec["tp"], "pp_size": spec.get("pp", 1), "ep_size": spec.get("ep", 1), "etp_size": spec.get("etp", spec["tp"]) if spec.get("experts") else 1, "enable_sequence_parallel": bool(spec.get("sp")),
        "zero_state": 0, "enable_dropout": bool(spec.get("dropout")), "use_flash_sdp": False, "use_math_sdp": True,
        "use_fused_norm": False, "use_fused_swiglu": bool(spec.get("act_fusion")), "cross_entropy_loss_fusion": False,
        "transformer_impl": "local", "masked_softmax_fusion": False, "apply_rope_fusion": False,
        "moe_dispatcher_policy": {"alltoall": "all2all", "allgather": "all_gather"}[spec.get("dispatcher", "alltoall")],
        "moe_router_dtype": "fp32" if spec.get("router_fp32") else None,
    }
    if spec.get("modules"):
        strategy.update(enable_recompute=True, megatron_recompute=True, megatron_recompute_modules=list(spec["modules"]))
    elif rec == "selective":
        strategy.update(enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True)
    elif rec == "full" and spec.get("recompute_group", 1) > 1:  # Megatron's uniform groups of layers
        strategy.update(enable_recompute=True, recompute_granularity="full_block", recompute_method="uniform",
                        recompute_layer_num=spec["recompute_group"])
    elif rec == "full":  # the harness's: uniform, one layer per checkpoint (the block method skips MTP's)
        strategy.update(enable_recompute=True, recompute_granularity="full_block", recompute_method="uniform", recompute_layer_num=1)
    return ModelConfig.init_from_dict(model), StrategyConfig.init_from_dict(strategy)


def cpu_adjustment(spec: dict, mtp: bool = False) -> int:
    """Bytes one layer's forward saves on CPU beyond the GPU kernels the op IR describes,
    stated explicitly (each found with the harness's saved-tensor log):

    * RMSNorm: torch's CPU rms_norm is a composite that upcasts; it keeps x in fp32 and the
      normalised x in fp32 (8 B per element) besides the fp32 rstd, where the fused GPU
      kernel (torch's and TransformerEngine's) keeps the bf16 input (2 B per element).
    * LayerNorm: the CPU kernel keeps mean and rstd in the input dtype (bf16), the GPU
      kernels in fp32: 2 x 2 B per token less.
    * Dropout masks: the input dtype (2 B) on CPU, bool (1 B) on GPU: the two hidden
      (residual) dropouts, and attention's unless selective recompute re-creates it.
    * MLA's q and kv norms (on the compressed q and kv, RMSNorm): as the layer's two norms,
      over their widths (q_lora_rank, kv_lora_rank).
    * ``mtp``: a multi-token-prediction depth also normalises the embedding and the hidden
      state and its output (enorm, hnorm, final_layernorm): three more norms.
    * q / k norms (``qk_layernorm``, RMSNorm per head): the CPU composite keeps fp32 copies of
      q and k and their normalised values (8 B per element); the GPU kernel keeps its input,
      a view of the fused QKV buffer, so the buffer (q, k and v at 2 B) — the op IR's
      assumption for the GPU, which this CPU run cannot check. The rstd (fp32 per token and
      head) is the same on both.

    Nothing is saved inside a fully recomputed layer, so it has no adjustment; nor inside the
    norms ``--recompute-modules layernorm`` recomputes.
    """
    if spec.get("recompute") == "full":
        return 0
    tokens = spec["seq"] * spec["batch"] // (spec["tp"] if spec.get("sp") else 1)
    if spec.get("norm", "rmsnorm") == "rmsnorm":
        per_norm = tokens * spec["hidden"] * (4 + 4 - 2)
    else:
        per_norm = -tokens * 2 * (4 - 2)
    norms = 0 if "layernorm" in spec.get("modules", ()) else 2  # recomputed norms keep nothing
    extra = (norms + 3 if mtp else norms) * per_norm
    if spec.get("qk_norm"):  # on the gathered tokens
        full = spec["seq"] * spec["batch"]
        hd = spec["hidden"] // spec["heads"]
        q_w, kv_w = spec["heads"] // spec["tp"] * hd, (spec.get("kv_heads") or spec["heads"]) // spec["tp"] * hd
        extra += full * (q_w + kv_w) * 8 - full * (q_w + 2 * kv_w) * 2
    if spec.get("mla"):  # (the MLA specs use RMSNorm)
        extra += tokens * (spec["q_lora_rank"] + spec["kv_lora_rank"]) * (4 + 4 - 2)
    if spec.get("dropout"):
        extra += (3 if mtp else 2) * tokens * spec["hidden"]  # an MTP depth's embedding drops out too
        if spec.get("recompute") != "selective":
            extra += spec["batch"] * (spec["heads"] // spec["tp"]) * spec["seq"] ** 2
    return extra


def cpu_adjustment_outside_layers(spec: dict) -> int:
    """The same CPU differences in what the embedding, the final norm and the loss keep (the
    harness's ``other_saved``): the final norm (as the layers'; sequence-sharded under SP) and
    the embedding's dropout mask."""
    tokens = spec["seq"] * spec["batch"] // (spec["tp"] if spec.get("sp") else 1)
    h = spec["hidden"]
    extra = tokens * h * (4 + 4 - 2) if spec.get("norm", "rmsnorm") == "rmsnorm" else -tokens * 2 * (4 - 2)
    if spec.get("dropout"):
        extra += tokens * h
    return extra


def _flops(k) -> float:
    """FLOPs as FlopCounterMode counts them: GEMMs, and the unfused attention's products over
    the whole score matrix (Attention.table_flops)."""
    if isinstance(k, Attention):
        return k.table_flops()
    return k.flops if isinstance(k, (Gemm, GroupGemm)) else 0.0


def predict(spec: dict) -> dict:
    model, strategy = configs(spec)
    est = Estimate(model, strategy, load_system("a100_pcie"))
    ops = [o for chunk in est.chunks for o in chunk.ops]
    out = {"layer_saved": [], "layer_fwd_flops": [], "layer_params": []}
    for i in range(model.layer_num + model.mtp_num_layers):  # an MTP depth's block is layer layer_num + depth
        mine = [o for o in ops if o.layer == i]
        out["layer_saved"].append(walk(mine).stored)
        out["layer_fwd_flops"].append(sum(_flops(k) for o in mine for k in o.fwd))
        out["layer_params"].append(sum(o.params for o in mine))
    n = spec.get("recompute_group", 1)
    if n > 1:  # what each checkpoint keeps, by checkpoint (the harness counts them so): a group's input
        layers = model.layer_num
        out["layer_saved"] = [walk([o for o in ops if k * n <= o.layer < (k + 1) * n]).stored if k * n < layers else 0
                              for k in range(layers)]
    out["params"] = sum(o.params for o in ops)
    # the whole model's products, forward and backward (recomputed forwards included)
    out["fwd_flops"] = sum(_flops(k) for o in ops for k in o.fwd)
    out["bwd_flops"] = sum(_flops(k) for o in ops for ph in ("bwd_input", "bwd_weight", "recompute") for k in o.kernels(ph))
    # the embedding, the final norm, the output head and the losses (MTP's too)
    out["other_saved"] = walk([o for o in ops if o.layer < 0 or o.layer >= model.layer_num + model.mtp_num_layers]).stored
    out["total_saved"] = sum(walk(chunk.ops).stored for chunk in est.chunks)
    return out
