"""The configurations compared with Megatron-Core (small sizes: a run is milliseconds)."""

from __future__ import annotations

GPT = dict(hidden=128, heads=4, kv_heads=4, ffn=512, vocab=512, swiglu=False, norm="layernorm", bias=True)
LLAMA = dict(hidden=128, heads=8, kv_heads=2, ffn=320, vocab=512, swiglu=True, norm="rmsnorm", bias=False)
LLAMA_MHA = dict(LLAMA, kv_heads=8)
MOE = dict(LLAMA, experts=4, topk=2, moe_ffn=96)
# DeepSeek's multi-latent attention (a compressed q; the local backend builds no full-rank q)
MLA = dict(LLAMA, heads=4, kv_heads=4, mla=True, q_lora_rank=96, kv_lora_rank=64, qk_head_dim=32, qk_pos_emb_head_dim=16,
           v_head_dim=32)
# Korthikanti et al. 2022's assumptions: GPT layer, 4h MLP, dropout on, learned positions
PAPER = dict(GPT, dropout=0.1, rope=False)


def _spec(id: str, base: dict, world: int = 1, tp: int = 1, **kw) -> dict:
    return dict(base, id=id, world=world, tp=tp, seq=kw.pop("seq", 64), batch=kw.pop("batch", 2), layers=kw.pop("layers", 2), **kw)


def world1() -> list[dict]:
    out = []
    for name, base in (("gpt", GPT), ("llama", LLAMA), ("llama_mha", LLAMA_MHA)):
        for rec in ("none", "selective", "full"):
            out.append(_spec(f"{name}_{rec}", base, recompute=rec))
    out += [
        _spec("llama_swiglu_fused", LLAMA, act_fusion=True),
        _spec("llama_swiglu_fused_selective", LLAMA, act_fusion=True, recompute="selective"),
        _spec("gpt_nobias_rms", dict(GPT, bias=False, norm="rmsnorm")),
        _spec("llama_tied", LLAMA, untie=False),
        _spec("llama_seq128_b1", LLAMA, seq=128, batch=1),
        _spec("llama_3layers", LLAMA, layers=3),
        _spec("moe_top2", MOE),
        _spec("moe_top1", dict(MOE, topk=1)),
        _spec("moe_selective", MOE, recompute="selective"),
        _spec("gpt_paper", PAPER),
        _spec("llama_uniform2", LLAMA, layers=3, recompute="full", recompute_group=2),
        *(_spec(f"mla_{rec}", MLA, recompute=rec) for rec in ("none", "selective", "full")),
        _spec("moe_shared", dict(MOE, shared_ffn=64)),
        _spec("moe_shared_gate", dict(MOE, shared_ffn=64, shared_gate=True)),
        _spec("moe_shared_gate_selective", dict(MOE, shared_ffn=64, shared_gate=True), recompute="selective"),
        # multi-token prediction: one or two depths after the decoder (uniform full recompute
        # checkpoints each depth; the block method would skip it)
        _spec("llama_mtp", dict(LLAMA, mtp=1)),
        _spec("moe_mtp2", dict(MOE, mtp=2)),
        _spec("llama_mtp_selective", dict(LLAMA, mtp=1), recompute="selective"),
        _spec("llama_mtp_full", dict(LLAMA, mtp=1), recompute="full"),
        # routing options: sigmoid scores with expert bias and group-limited top-k, the load-
        # balancing losses, z-loss; and q / k norms
        _spec("moe_sigmoid_groups", dict(MOE, score="sigmoid", groups=2, group_topk=1)),
        _spec("moe_sigmoid_top1", dict(MOE, score="sigmoid", topk=1)),
        _spec("moe_aux", dict(MOE, balance="aux_loss")),
        _spec("moe_sigmoid_aux", dict(MOE, score="sigmoid", balance="aux_loss")),
        _spec("moe_seq_aux", dict(MOE, balance="seq_aux_loss")),
        _spec("moe_z_loss", dict(MOE, z_loss=True)),
        _spec("llama_qk_norm", dict(LLAMA, qk_norm=True)),
        _spec("llama_qkv_bias", dict(LLAMA, qkv_bias=True)),
        _spec("llama_output_gate", dict(LLAMA, output_gate=True)),
        _spec("llama_output_gate_selective", dict(LLAMA, output_gate=True), recompute="selective"),
        # --recompute-modules (layernorm: CheckpointWithoutOutput, which also frees the norm's output)
        _spec("llama_modules_layernorm", LLAMA, modules=["layernorm"]),
        _spec("llama_modules_mlp", LLAMA, modules=["mlp"]),
        _spec("llama_modules_layernorm_mlp", LLAMA, modules=["layernorm", "mlp"]),
        _spec("llama_modules_layernorm_core_attn", LLAMA, modules=["layernorm", "core_attn"]),
        _spec("moe_modules_moe", MOE, modules=["moe"]),
        _spec("moe_modules_layernorm_moe", MOE, modules=["layernorm", "moe"]),
        _spec("moe_shared_modules_shared_experts", dict(MOE, shared_ffn=64), modules=["shared_experts"]),
        # gpt-oss's attention: sliding windows and sinks (a learnable softmax offset per head)
        _spec("llama_window", dict(LLAMA, window=16)),
        _spec("llama_sinks", dict(LLAMA, sinks=True)),
        _spec("llama_window_sinks_selective", dict(LLAMA, window=16, sinks=True), recompute="selective"),
        # MLA's up-projection recompute (CheckpointWithoutOutput over the up-projections and RoPE)
        _spec("mla_modules_mla_up_proj", MLA, modules=["mla_up_proj"]),
        _spec("mla_modules_layernorm_mla_up_proj", MLA, modules=["layernorm", "mla_up_proj"]),
        _spec("mla_modules_mla_up_proj_core_attn", MLA, modules=["mla_up_proj", "core_attn"]),
        _spec("moe_allgather", dict(MOE, dispatcher="allgather")),
        _spec("moe_router_fp32", dict(MOE, router_fp32=True)),
        _spec("moe_router_fp32_z_aux", dict(MOE, router_fp32=True, z_loss=True, balance="aux_loss")),
        _spec("moe_allgather_router_fp32", dict(MOE, dispatcher="allgather", router_fp32=True)),
    ]
    return out


def world2() -> list[dict]:
    out = []
    for name, base in (("gpt", GPT), ("llama", LLAMA)):
        for sp in (False, True):
            for rec in ("none", "selective", "full"):
                out.append(_spec(f"{name}_tp2{'_sp' if sp else ''}_{rec}", base, world=2, tp=2, sp=sp, recompute=rec))
    out += [
        _spec("llama_mha_tp2_sp", LLAMA_MHA, world=2, tp=2, sp=True),
        _spec("llama_tp2_sp_fused", LLAMA, world=2, tp=2, sp=True, act_fusion=True),
        _spec("moe_ep2", MOE, world=2, ep=2),
        _spec("moe_ep2_top1", dict(MOE, topk=1), world=2, ep=2),
        _spec("moe_tp2_sp", MOE, world=2, tp=2, sp=True),
        _spec("gpt_paper_tp2_sp_selective", PAPER, world=2, tp=2, sp=True, recompute="selective"),
        _spec("gpt_tp2_sp_uniform3", GPT, world=2, tp=2, sp=True, layers=4, recompute="full", recompute_group=3),
        _spec("mla_tp2_sp", MLA, world=2, tp=2, sp=True),
        _spec("mla_tp2", MLA, world=2, tp=2),
        _spec("moe_shared_gate_tp2_sp", dict(MOE, shared_ffn=64, shared_gate=True), world=2, tp=2, sp=True),
        _spec("moe_shared_gate_ep2", dict(MOE, shared_ffn=64, shared_gate=True), world=2, ep=2),
        _spec("llama_mtp_tp2_sp", dict(LLAMA, mtp=1), world=2, tp=2, sp=True),
        _spec("llama_mtp_tp2", dict(LLAMA, mtp=1), world=2, tp=2),
        _spec("moe_seq_aux_tp2_sp", dict(MOE, balance="seq_aux_loss"), world=2, tp=2, sp=True),
        _spec("llama_qk_norm_tp2_sp", dict(LLAMA, qk_norm=True), world=2, tp=2, sp=True),
        _spec("llama_output_gate_tp2_sp", dict(LLAMA, output_gate=True), world=2, tp=2, sp=True),
        _spec("llama_modules_layernorm_mlp_tp2_sp", LLAMA, world=2, tp=2, sp=True, modules=["layernorm", "mlp"]),
        _spec("llama_window_sinks_tp2_sp", dict(LLAMA, window=16, sinks=True), world=2, tp=2, sp=True),
        _spec("moe_tp2_sp_ep2_etp1", MOE, world=2, tp=2, sp=True, ep=2, etp=1),
        _spec("mla_modules_layernorm_mla_up_proj_tp2_sp", MLA, world=2, tp=2, sp=True, modules=["layernorm", "mla_up_proj"]),
        _spec("moe_allgather_ep2", dict(MOE, dispatcher="allgather"), world=2, ep=2),
        _spec("moe_allgather_tp2_sp", dict(MOE, dispatcher="allgather"), world=2, tp=2, sp=True),
        _spec("moe_router_fp32_ep2", dict(MOE, router_fp32=True), world=2, ep=2),
    ]
    return out


def pipeline() -> list[dict]:
    """Two pipeline stages (world 2): each rank's parameters only (the model is built on the meta
    device and not run): the embedding on the first, the head on the last, a tied head's copy,
    learned positions, the MTP block and its embedding copy."""
    return [
        _spec("llama_pp2", LLAMA, world=2, pp=2, layers=4),
        _spec("llama_tied_pp2", dict(LLAMA, untie=False), world=2, pp=2, layers=4),
        _spec("gpt_learned_positions_pp2", dict(GPT, rope=False), world=2, pp=2, layers=4),
        _spec("llama_mtp_pp2", dict(LLAMA, mtp=1), world=2, pp=2, layers=4),
        _spec("moe_pp2", MOE, world=2, pp=2, layers=4),
        _spec("mla_pp2", MLA, world=2, pp=2, layers=4),
    ]
