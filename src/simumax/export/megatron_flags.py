"""A strategy (and model) as Megatron-LM command-line flags."""

from __future__ import annotations

from simumax.config.checks import stage_layer_counts
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig


def megatron_flags(st: StrategyConfig, model: ModelConfig | None = None) -> list[str]:
    f = [
        f"--tensor-model-parallel-size {st.tp_size}",
        f"--pipeline-model-parallel-size {st.pp_size}",
        f"--context-parallel-size {st.cp_size}",
        f"--micro-batch-size {st.micro_batch_size}",
        f"--global-batch-size {st.global_batch_size}",
        f"--seq-length {st.seq_len}",
    ]
    if st.sp:
        f.append("--sequence-parallel")
    uneven = st.num_layers_in_first_pipeline_stage or st.num_layers_in_last_pipeline_stage
    if st.interleaving_size > 1:
        if uneven or model is None:
            f.append(f"--num-virtual-stages-per-pipeline-rank {st.interleaving_size}")
        else:
            f.append(f"--num-layers-per-virtual-pipeline-stage {_max_chunk_layers(st, model)}")
    if st.num_layers_in_first_pipeline_stage:
        f.append(f"--decoder-first-pipeline-num-layers {st.num_layers_in_first_pipeline_stage}")
    if st.num_layers_in_last_pipeline_stage:
        f.append(f"--decoder-last-pipeline-num-layers {st.num_layers_in_last_pipeline_stage}")
    if st.cp_size > 1:
        f.append(f"--cp-comm-type {st.cp_comm_type}")
    if model is not None and model.is_moe:
        f += [f"--expert-model-parallel-size {st.ep_size}", f"--expert-tensor-parallel-size {st.etp_size}"]
        f.append(f"--moe-token-dispatcher-type {'alltoall' if st.moe_dispatcher_policy == 'all2all' else 'allgather'}")
        if st.group_linear_mode == "grouped":
            f.append("--moe-grouped-gemm")
        if st.moe_permute_fusion:
            f.append("--moe-permute-fusion")
        if model.capacity is not None:
            f.append(f"--moe-expert-capacity-factor {model.capacity:g}")
            if model.moe_pad_expert_input_to_capacity:
                f.append("--moe-pad-expert-input-to-capacity")
    if st.zero_state >= 1:
        f.append("--use-distributed-optimizer")
    if st.use_fp32_accum_grad and not st.grad_reduce_in_bf16:
        f.append("--accumulate-allreduce-grads-in-fp32")
    if st.dtype == "bf16":
        f.append("--bf16")
    elif st.dtype == "fp16":
        f.append("--fp16")
    if st.fp8:
        f.append("--fp8-format hybrid")
    if st.use_flash_sdp:
        f.append("--use-flash-attn")
    if st.cross_entropy_loss_fusion:
        f.append("--cross-entropy-loss-fusion")
    mode = st.recompute_mode
    if mode == "full_block":
        f += ["--recompute-granularity full", "--recompute-method block"]
        n = st.recompute_layer_num
        f.append(f"--recompute-num-layers {n if n is not None else _max_chunk_layers(st, model)}")
    elif mode == "selective":
        f.append("--recompute-granularity selective")
        mods = [m for flag, m in (("attn_recompute", "core_attn"), ("mlp_recompute", "mlp"), ("mlp_rms_recompute", "layernorm")) if getattr(st, flag)]
        if mods and mods != ["core_attn"]:
            f.append("--recompute-modules " + " ".join(mods))
    elif mode == "megatron":
        f += ["--recompute-granularity selective", "--recompute-modules " + " ".join(st.megatron_recompute_modules)]
    for field, flag in OVERLAP_FLAGS:
        if getattr(st, field):
            f.append(flag)
    return f


OVERLAP_FLAGS = (
    ("overlap_grad_reduce", "--overlap-grad-reduce"),
    ("overlap_param_gather", "--overlap-param-gather"),
    ("tp_comm_overlap", "--tp-comm-overlap"),
    ("overlap_moe_expert_parallel_comm", "--overlap-moe-expert-parallel-comm"),
    ("delay_wgrad_compute", "--delay-wgrad-compute"),
    ("defer_embedding_wgrad_compute", "--defer-embedding-wgrad-compute"),
)


def _max_chunk_layers(st: StrategyConfig, model: ModelConfig | None) -> int:
    """Layers of the largest model chunk (Megatron counts --recompute-num-layers per chunk)."""
    if model is None:
        return 1
    return max(max(stage_layer_counts(model, st)) // st.chunks_per_rank, 1)


def model_flags(model: ModelConfig) -> list[str]:
    """The model as Megatron-LM architecture flags (simumax import megatron reads them back)."""
    f = [
        f"--num-layers {model.layer_num}", f"--hidden-size {model.hidden_size}", f"--ffn-hidden-size {model.intermediate_size}",
        f"--num-attention-heads {model.head_num}", f"--kv-channels {model.head_size}", f"--vocab-size {model.vocab_size}",
        f"--make-vocab-size-divisible-by {model.make_vocab_size_divisible_by}",
        f"--normalization {'RMSNorm' if model.norm_type == 'rmsnorm' else 'LayerNorm'}",
        f"--position-embedding-type {model.position_embedding_type}",
    ]
    if model.kv_head_num != model.head_num:
        f += ["--group-query-attention", f"--num-query-groups {model.kv_head_num}"]
    if model.max_position_embeddings:
        f.append(f"--max-position-embeddings {model.max_position_embeddings}")
    if model.use_swiglu:
        f.append("--swiglu")
    if model.untie_embeddings_and_output_weights:
        f.append("--untie-embeddings-and-output-weights")
    f.append("--add-bias-linear" if model.add_bias_linear else "--disable-bias-linear")
    if model.is_moe:
        f += [f"--num-experts {model.expert_num}", f"--moe-router-topk {model.topk}", f"--moe-ffn-hidden-size {model.moe_ffn}"]
        if model.moe_shared_expert_intermediate_size:
            f.append(f"--moe-shared-expert-intermediate-size {model.moe_shared_expert_intermediate_size}")
        if model.dense_layers:
            pattern = "[" + ",".join(["0"] * model.dense_layers + ["1"] * (model.layer_num - model.dense_layers)) + "]"
            f.append(f"--moe-layer-freq {pattern}")
    if model.attention_type == "mla":
        f.append("--multi-latent-attention")
        if model.q_lora_rank:
            f.append(f"--q-lora-rank {model.q_lora_rank}")
        f += [f"--kv-lora-rank {model.kv_lora_rank}", f"--qk-head-dim {model.qk_head_dim}",
              f"--qk-pos-emb-head-dim {model.qk_pos_emb_head_dim}", f"--v-head-dim {model.v_head_dim}"]
    return f
