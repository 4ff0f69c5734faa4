"""Which ops of a layer are checkpointed, from the strategy's recompute fields.

Groups (module tags of graph.dense_layer):
* full_block: the whole layer, for the first ``recompute_layer_num`` layers of each chunk
  (``recompute_method`` block); with the uniform method every layer, checkpointed in groups
  of ``recompute_layer_num`` consecutive layers of the chunk (``uniform_groups``);
* selective (SimuMax flags): attn_recompute -> core attention;
  mlp_recompute -> the MLP (FC1, activation, FC2; on MoE layers the routed experts' FC1,
  activation and FC2, not the dispatch); mlp_rms_recompute -> the pre-MLP norm;
  mla_rms_recompute -> MLA's q and kv norms;
* megatron (--recompute-modules): core_attn, mlp, layernorm (both norms), moe_act, moe,
  shared_experts, mla_up_proj, gdn_norm_out (a Gated DeltaNet's gated output norm);
* SimuMax's sub-block granularities: attn_only -> the attention sub-block (norm to output
  projection), mlp_only -> the MLP sub-block (norm to FC2; routing, dispatch and experts on
  MoE layers), sdp_only -> core attention; they honour ``recompute_layer_num``.
"""

from __future__ import annotations

from simumax.config.strategy import StrategyConfig
from simumax.graph.gdn_layer import MODULES as GDN_MODULES
from simumax.graph.linears import keep_original_input
from simumax.graph.ops import Op
from simumax.graph.shared_experts import SHARED_EXPERT_MODULES

SELECTIVE_FLAGS = {
    "attn_recompute": [("attn", {"core_attn"})],
    "mlp_recompute": [("mlp", {"fc1", "act", "fc2", "expert_fc1", "moe_act", "expert_fc2"})],
    "mlp_rms_recompute": [("mlp_norm", {"mlp_norm"})],
    "mla_rms_recompute": [("mla_q_norm", {"mla_q_norm"}), ("mla_kv_norm", {"mla_kv_norm"})],
}
MEGATRON_MODULES = {
    "core_attn": [("attn", {"core_attn"})],
    "mlp": [("mlp", {"fc1", "act", "fc2"})],
    "layernorm": [("attn_norm", {"attn_norm"}), ("mlp_norm", {"mlp_norm"})],
    "moe_act": [("moe_act", {"moe_act"})],
    "moe": [("moe", {"router", "moe_latent_proj", "dispatch", "expert_fc1", "moe_act", "expert_fc2", "combine", "moe_sum",
                     *SHARED_EXPERT_MODULES})],
    "shared_experts": [("shared", set(SHARED_EXPERT_MODULES))],
    "mla_up_proj": [("mla_up", {"mla_up_proj", "mla_rope"})],
    "gdn_norm_out": [("gdn_norm_out", {"gdn_out_norm", "gdn_cp_out"})],  # the norm and (CP) its all-to-all back
}

SUB_BLOCKS = {
    "attn_only": [("attn", {"attn_norm", "qkv", "q_down", "mla_q_norm", "kv_down", "mla_kv_norm", "mla_kv_gather",
                            "mla_up_proj", "mla_rope", "qkv_split", "rope", "core_attn", "attn_proj", "attn_post_norm",
                            *GDN_MODULES[:-1]})],  # a Gated DeltaNet's, but for its residual add
    "mlp_only": [("mlp", {"mlp_norm", "fc1", "act", "fc2", "mlp_post_norm", "router", "moe_latent_proj", "dispatch", "expert_fc1",
                          "moe_act", "expert_fc2", "combine", "moe_sum", *SHARED_EXPERT_MODULES})],
    "sdp_only": [("attn", {"core_attn"})],
}


def _groups(st: StrategyConfig) -> list[tuple[str, set[str]]]:
    mode = st.recompute_mode
    out: list[tuple[str, set[str]]] = []
    if mode == "selective" and st.recompute_granularity in SUB_BLOCKS:
        return list(SUB_BLOCKS[st.recompute_granularity])
    if mode == "selective":
        for flag, groups in SELECTIVE_FLAGS.items():
            if getattr(st, flag):
                out += groups
    elif mode == "megatron":
        for m in st.megatron_recompute_modules:
            out += MEGATRON_MODULES[m]
    return out


def is_recomputed(st: StrategyConfig, position_in_chunk: int) -> bool:
    """Whether the layer at this position of its model chunk has checkpointed ops
    (full_block / selective honour ``recompute_layer_num``; Megatron modules apply to all)."""
    mode = st.recompute_mode
    if mode == "none":
        return False
    limit = st.recompute_layer_num
    uniform = mode == "full_block" and st.recompute_method == "uniform"  # every layer, in groups
    return mode == "megatron" or uniform or limit is None or position_in_chunk < limit


def uniform_groups(ops: list[Op], first: int) -> list[Op]:
    """A recomputed layer's ops in the checkpoint of the group that starts at layer
    ``first`` (Megatron's uniform method, ``transformer_block._checkpointed_forward``: one
    ``checkpoint`` over layers [first, first + n)): the walk then keeps only what enters the
    group and brings all of its layers' tensors back before its last layer's backward."""
    gid = f"L{first}.block"
    return [o.with_(recompute_group=gid) if o.recompute_group and o.recompute_group != gid else o for o in ops]


# the modules whose presence in a layer says its norm is a module of its own under
# TransformerEngine (gpt_layer_specs.py): MLA's input norm (its down-projections are plain
# TELinears), a MoE layer's pre-MLP norm; elsewhere TE fuses the norm into the next linear
# (TELayerNormColumnParallelLinear / TELayerNormMLP) and Megatron's "layernorm" recompute finds
# an IdentityOp, which it leaves alone
SEPARATE_NORM = {"attn_norm": {"q_down", "kv_down"}, "mlp_norm": {"router"}}
# what takes a recomputed norm's output and, under fp8 / fp4, keeps it rather than an FP8 copy
# (the copy would outlive the discarded output): MLA's down-projections
# (set_for_recompute_input_layernorm), the shared experts' FC1 (set_for_recompute_pre_mlp_layernorm)
KEEPS_NORM_OUTPUT = {"attn_norm": {"q_down", "kv_down"}, "mlp_norm": {"shared_fc1"}}


def _norm_groups(st: StrategyConfig, layer_ops: list[Op], groups: list[tuple[str, set[str]]]) -> list[tuple[str, set[str]]]:
    """Megatron's recompute modules where TransformerEngine fuses a norm into the next linear
    (the local spec's norms are all modules): "layernorm" recomputes only the norms
    SEPARATE_NORM names, "mlp" on a dense layer checkpoints TELayerNormMLP, its norm inside
    (the checkpoint keeps the norm's input, not its output), and "mla_up_proj" MLA's up-
    projections with their q / kv norms."""
    if st.transformer_impl != "transformer_engine":
        return groups
    present = {o.module for o in layer_ops}
    out = []
    for g, mods in groups:
        if g in SEPARATE_NORM and not SEPARATE_NORM[g] & present:
            continue  # an IdentityOp
        if g == "mlp" and not SEPARATE_NORM["mlp_norm"] & present:
            mods = mods | {"mlp_norm"}
        if g == "mla_up" and not any(o.name.endswith(".q_absorb") for o in layer_ops):
            # MLA's q / kv norms are fused into its up-projections (TELayerNormColumnParallelLinear):
            # the checkpoint keeps the un-normed latents and recomputes the norms (DSA's absorbed
            # MLA keeps them as modules of their own, outside it)
            mods = mods | {"mla_q_norm", "mla_kv_norm"}
        out.append((g, mods))
    return out


def _keep_recomputed_norm_outputs(st: StrategyConfig, layer_ops: list[Op], recomputed: set[str]) -> list[Op]:
    """Under fp8 / fp4, the linears KEEPS_NORM_OUTPUT names for a recomputed norm keep its BF16
    output instead of their FP8 copies (but the shared experts' FC1 under its own checkpoint,
    which keeps the original input anyway)."""
    keep = set().union(*(mods for g, mods in KEEPS_NORM_OUTPUT.items() if g in recomputed))
    if "shared_experts" in st.recomputed_modules:
        keep.discard("shared_fc1")
    return [keep_original_input(o, st.lp_recipe, st.dtype_bytes) if o.module in keep else o for o in layer_ops]


def tag_recompute(st: StrategyConfig, layer_ops: list[Op]) -> list[Op]:
    """The layer's ops with their recompute groups (for a layer that is recomputed)."""
    mode = st.recompute_mode
    if mode == "none":
        return layer_ops
    layer = layer_ops[0].layer
    if mode == "full_block":
        return [o.with_(recompute_group=f"L{layer}.block") for o in layer_ops]
    groups = _groups(st)
    if mode == "megatron":
        groups = _norm_groups(st, layer_ops, groups)
        if st.low_precision:
            layer_ops = _keep_recomputed_norm_outputs(st, layer_ops, {g for g, _ in groups})
    tagged = []
    for o in layer_ops:
        gid = next((f"L{layer}.{g}" for g, mods in groups if o.module in mods), None)
        tagged.append(o.with_(recompute_group=gid) if gid else o)
    return tagged

