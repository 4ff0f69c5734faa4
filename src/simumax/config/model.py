"""Model architecture config (SimuMax ``models/*.json`` format)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt, model_validator

from simumax.compat.config_methods import SimuMaxModelMethods
from simumax.config.base import ConfigBase
from simumax.config.model_blocks import LayerBlocks
from simumax.config.simumax_fields import model_input
from simumax.errors import ConfigError


class ModelConfig(SimuMaxModelMethods, LayerBlocks, ConfigBase):
    """A decoder-only transformer: dense GPT/Llama, MoE, or MLA attention (or Megatron's hybrid
    stack of Mamba-2, attention, MLP and MoE blocks: ``hybrid_layer_pattern``).

    Field names follow SimuMax so its JSON files load unchanged; fields SimuMax lacks
    (``norm_type``, ``add_bias_linear`` ...) default to the Llama/Megatron choices used by
    the validation runs.
    """

    model_name: str = Field("model", description="Free-form name shown in reports.")
    model_type: Literal["dense", "moe"] = Field("dense", description="dense or moe.")
    attention_type: Literal["mha", "mla"] = Field(
        "mha", description="mha covers MHA and GQA (kv_head_num < head_num); mla is DeepSeek latent attention."
    )
    hidden_size: PositiveInt = Field(le=2**20, description="Model width h.")
    head_num: PositiveInt = Field(le=65536, description="Number of query heads.")
    kv_head_num: PositiveInt | None = Field(None, description="Key/value heads (GQA); default head_num.")
    head_size: PositiveInt | None = Field(None, description="Per-head dim; default hidden_size / head_num.")
    intermediate_size: PositiveInt = Field(le=2**24, description="Dense MLP hidden size (per branch for SwiGLU).")
    layer_num: PositiveInt = Field(le=100_000, description="Number of transformer layers.")
    vocab_size: PositiveInt = Field(le=10**8, description="Tokenizer vocabulary size before padding.")
    use_swiglu: bool = Field(False, description="SwiGLU MLP (3 matrices) instead of GeLU (2 matrices).")
    padded_vocab_size: bool = Field(
        True, description="Pad the vocab as Megatron does: ceil(V / (divisor * tp)) * divisor * tp."
    )
    make_vocab_size_divisible_by: PositiveInt = Field(128, description="Megatron's vocab padding divisor.")
    norm_type: Literal["rmsnorm", "layernorm"] = Field("rmsnorm", description="Normalisation layer.")
    add_bias_linear: bool = Field(False, description="Linear layers carry biases (Megatron's default; --disable-bias-linear turns them off).")
    add_qkv_bias: bool = Field(
        False, description="The QKV projection carries biases even without add_bias_linear (Megatron --add-qkv-bias; "
        "Qwen2 / Qwen2.5's q / k / v biases). Megatron's MLA does not read it.",
    )
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = Field(
        "rope", description="RoPE (Llama) or learned absolute position embeddings (GPT-3)."
    )
    max_position_embeddings: PositiveInt | None = Field(
        None, description="Rows of the learned position table; default the strategy's seq_len."
    )
    rotary_base: float | None = Field(
        None, gt=0, le=1e12, description="RoPE base (Megatron --rotary-base; HF rope_theta): Llama 3 500000, Qwen3 1000000; "
        "null is Megatron's 10000. It changes no cost; exported with the Megatron flags.",
    )
    untie_embeddings_and_output_weights: bool = Field(
        True, description="Separate LM-head weight (Llama); false ties it to the input embedding."
    )
    # MoE (SimuMax names)
    expert_num: PositiveInt | None = Field(None, le=65536, description="Routed experts per MoE layer.")
    topk: PositiveInt | None = Field(None, description="Experts per token.")
    moe_ffn_hidden_size: PositiveInt | None = Field(None, description="Hidden size of one routed expert.")
    moe_shared_expert_intermediate_size: PositiveInt | None = Field(
        None, description="Hidden size of the shared expert(s) in total; absent means none."
    )
    moe_latent_size: PositiveInt | None = Field(
        None, description="Latent MoE (Megatron --moe-latent-size): the routed experts work in this width, the tokens "
        "projected down to it before the dispatch and back up after the combine (duplicated TE linears); null: hidden.",
    )
    moe_shared_expert_gate: bool = Field(
        False, description="The shared expert's output scaled by a per-token sigmoid gate of the layer input "
        "(Megatron --moe-shared-expert-gate; Qwen2-MoE's shared_expert_gate).",
    )
    dense_layers: int = Field(0, ge=0, description="The first k layers of a MoE model use a dense MLP.")
    moe_layer_freq: int | list[int] = Field(
        1, description="Which layers of a MoE model have a MoE MLP (Megatron --moe-layer-freq): N, layer i when "
        "i % N == 0; or a 0/1 list, one entry per layer. dense_layers applies on top; MTP layers take the last "
        "layer's kind.",
    )
    moe_pad_expert_input_to_capacity: bool = Field(False, description="Pad each expert's tokens to capacity.")
    capacity: float | None = Field(None, gt=0, le=1000, description="MoE capacity factor (with padding).")
    moe_load_imbalance: float = Field(
        1.0, ge=1.0, le=1000, description="Dropless routing's skew: the busiest EP rank's rows over what routing "
        "tokens uniformly at random gives it (whose spread over the ranks is modelled); 1: as even as random.",
    )
    # MoE routing (Megatron's names and defaults: they choose the router's kernel chain)
    moe_router_score_function: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="Router score function (Megatron --moe-router-score-function)."
    )
    moe_router_pre_softmax: bool = Field(
        False, description="Softmax over all experts before top-k (else over the top-k scores)."
    )
    moe_router_num_groups: PositiveInt | None = Field(
        None, description="Group-limited routing: expert groups (DeepSeek's device/node groups)."
    )
    moe_router_group_topk: PositiveInt | None = Field(
        None, description="Group-limited routing: groups each token may pick."
    )
    moe_router_topk_scaling_factor: float | None = Field(
        None, gt=0, description="Scale of the top-k routing probabilities (DeepSeek-V2: 16, V3: 2.5)."
    )
    moe_router_load_balancing_type: Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "none"] = Field(
        "aux_loss", description="Load-balancing loss (Megatron --moe-router-load-balancing-type)."
    )
    moe_router_enable_expert_bias: bool = Field(
        False, description="Aux-loss-free balancing: a per-expert bias on the routing scores (DeepSeek-V3)."
    )
    moe_z_loss_coeff: float | None = Field(None, gt=0, description="Router z-loss coefficient; absent means none.")
    moe_router_force_load_balancing: bool = Field(
        False, description="Megatron --moe-router-force-load-balancing (benchmarks): the router's logits replaced by "
        "random ones, so tokens spread over the experts uniformly at random (moe_load_imbalance 1).",
    )
    no_rope_freq: int | list[int] | None = Field(
        None, description="Layers without RoPE (NoPE; Megatron --no-rope-freq, Llama 4): N, every N-th layer (layer i "
        "when (i + 1) % N == 0, N dividing layer_num); or a 0/1 list, 1 for NoPE. Null: RoPE on every layer.",
    )
    window_size: PositiveInt | None = Field(
        None, le=2**27, description="Sliding-window attention: keys each query attends at most, itself included "
        "(GPT-OSS 128); flash attention skips the rest. Null: full causal attention.",
    )
    window_attn_skip_freq: PositiveInt | None = Field(
        None, description="With window_size: every N-th layer (1-based) attends the whole sequence (Megatron's "
        "window_attn_skip_freq; GPT-OSS alternates: 2). Null: every layer is windowed.",
    )
    qk_layernorm: bool = Field(
        False, description="Megatron --qk-layernorm (Qwen3, OLMo 2): RMSNorm over each head's q and k before RoPE "
        "(2 x head_size parameters per layer; memory-bound passes over q and k).",
    )
    post_sublayer_norm: bool = Field(
        False, description="Gemma 2 / 3's sandwich norms: one more norm on the attention output and one on the MLP output, "
        "each before its residual add (HF post_attention_layernorm / post_feedforward_layernorm); dense layers with "
        "GQA / MHA attention.",
    )
    attention_output_gate: bool = Field(
        False, description="Megatron --attention-output-gate (gated attention, Qwen3-Next): the QKV projection also "
        "makes a per-head gate; the attention output is multiplied by its sigmoid before the output projection.",
    )
    attention_sinks: bool = Field(
        False, description="GPT-OSS learned attention sinks: one logit per head added to the softmax (head_num parameters per layer)."
    )
    mtp_num_layers: int = Field(
        0, ge=0, le=16, description="Multi-token prediction depths (DeepSeek-V3: 1; Megatron --mtp-num-layers), on the "
        "last pipeline stage: embedding copy, two norms, 2h->h projection, one transformer layer, shared head, own loss.",
    )
    # Megatron's hybrid stack (megatron/core/models/hybrid, pretrain_mamba.py)
    hybrid_layer_pattern: str | None = Field(
        None, max_length=100_000, description="Megatron --hybrid-layer-pattern (--hybrid-override-pattern): one symbol "
        "per layer, each its own residual block — M a Mamba-2 mixer, G a Gated DeltaNet, * self-attention, + MLA "
        "attention, D DeepSeek sparse attention (+ and D with attention_type mla, not beside *), - an MLP, "
        "E a MoE MLP (Nemotron-H: 'M-M-M-M*-...'); '|' between pipeline segments sets each virtual stage's blocks "
        "(interleaving_size: segments / pp_size); '/' then each MTP depth's blocks ('...M*-/*E/*E': two depths; "
        "mtp_num_layers follows); layer_num is the decoder's block count. Null: transformer layers.",
    )
    mamba_state_dim: PositiveInt = Field(128, le=4096, description="Mamba-2 SSM state size N (Megatron --mamba-state-dim).")
    mamba_head_dim: PositiveInt = Field(64, le=4096, description="Mamba-2 head dim P (Megatron --mamba-head-dim).")
    mamba_num_groups: PositiveInt = Field(8, le=4096, description="Mamba-2 B / C groups G (Megatron --mamba-num-groups).")
    mamba_num_heads: PositiveInt | None = Field(
        None, description="Mamba-2 heads H (Megatron --mamba-num-heads); null: 2 x hidden_size / mamba_head_dim "
        "(the mixer's expand 2).",
    )
    # Gated DeltaNet linear attention (megatron-core ssm/gated_delta_net; Qwen3-Next, Qwen3.5)
    experimental_attention_variant: Literal["gated_delta_net", "dsa"] | None = Field(
        None, description="Megatron --experimental-attention-variant: gated_delta_net replaces the attention of the "
        "layers linear_attention_freq marks by a Gated DeltaNet (Qwen3-Next); dsa makes every MLA layer DeepSeek "
        "sparse attention (DeepSeek-V3.2: a lightning indexer picks dsa_indexer_topk keys per query, absorbed MLA "
        "attends to them); null: every layer's attention as usual.",
    )
    # DeepSeek sparse attention (megatron-core transformer/experimental_attention_variant/dsa.py)
    dsa_indexer_n_heads: PositiveInt | None = Field(None, le=4096, description="DSA indexer heads (Megatron "
                                                    "--dsa-indexer-n-heads; DeepSeek-V3.2: 64).")
    dsa_indexer_head_dim: PositiveInt | None = Field(None, le=4096, description="DSA indexer head dim (Megatron "
                                                     "--dsa-indexer-head-dim; DeepSeek-V3.2: 128).")
    dsa_indexer_topk: PositiveInt | None = Field(None, description="Keys each query attends under DSA (Megatron "
                                                 "--dsa-indexer-topk; DeepSeek-V3.2: 2048).")
    dsa_indexer_topk_freq: PositiveInt = Field(1, le=100_000, description="DSA index sharing (Megatron "
                                               "--dsa-indexer-topk-freq): one layer in N runs the indexer and the "
                                               "next N - 1 reuse its top-k keys.")
    dsa_indexer_skip_topk_offset: int = Field(0, ge=0, description="DSA index sharing: the first layers that all run "
                                              "the indexer before sharing starts (Megatron --dsa-indexer-skip-topk-offset).")
    dsa_indexer_loss_coeff: float | None = Field(None, ge=0, description="DSA indexer KL loss coefficient (Megatron "
                                                 "--dsa-indexer-loss-coeff): the indexer trains towards attention's "
                                                 "distribution; null or 0: no indexer loss, it runs without gradients.")
    dsa_indexer_use_sparse_loss: bool = Field(False, description="DSA indexer loss over the top-k keys only (Megatron "
                                              "--dsa-indexer-use-sparse-loss: TileLang's fused streaming KL, modelled); "
                                              "false: the dense loss over every key (not modelled).")
    dsa_indexer_rotate_activation: bool = Field(True, description="DSA indexer: Hadamard transform of its q and k "
                                                "before scoring (Megatron --dsa-indexer-rotate-activation).")
    linear_attention_freq: int | list[int] | None = Field(
        None, description="Megatron --linear-attention-freq: N, every N-th layer (layer i when (i + 1) % N == 0) keeps "
        "softmax attention and the others are Gated DeltaNet (Qwen3-Next: 4); or a 0/1 list, 1 for Gated DeltaNet.",
    )
    linear_conv_kernel_dim: PositiveInt = Field(4, le=64, description="Gated DeltaNet's causal conv1d width "
                                                "(Megatron --linear-conv-kernel-dim).")
    linear_key_head_dim: PositiveInt = Field(128, le=4096, description="Gated DeltaNet q / k head dim "
                                             "(Megatron --linear-key-head-dim).")
    linear_value_head_dim: PositiveInt = Field(128, le=4096, description="Gated DeltaNet value / gate head dim "
                                               "(Megatron --linear-value-head-dim).")
    linear_num_key_heads: PositiveInt = Field(16, le=65536, description="Gated DeltaNet q / k heads "
                                              "(Megatron --linear-num-key-heads).")
    linear_num_value_heads: PositiveInt = Field(32, le=65536, description="Gated DeltaNet value heads, a multiple of "
                                                "the key heads (Megatron --linear-num-value-heads).")
    # MLA (SimuMax names)
    q_lora_rank: PositiveInt | None = Field(None, description="MLA query low-rank dim; null means full-rank Q.")
    kv_lora_rank: PositiveInt | None = Field(None, description="MLA compressed KV dim.")
    qk_head_dim: PositiveInt | None = Field(None, description="MLA per-head q/k dim without the rope part.")
    qk_pos_emb_head_dim: PositiveInt | None = Field(None, description="MLA per-head rope dim.")
    v_head_dim: PositiveInt | None = Field(None, description="MLA per-head value dim.")

    @model_validator(mode="before")
    @classmethod
    def _simumax_input(cls, data: Any) -> Any:
        return model_input(data, cls.model_fields)

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.kv_head_num is None:
            self.__dict__["kv_head_num"] = self.head_num
        if self.head_size is None:
            if self.hidden_size % self.head_num:
                raise ConfigError("head_size", "required when hidden_size is not divisible by head_num")
            self.__dict__["head_size"] = self.hidden_size // self.head_num
        if self.attention_type == "mha" and self.head_num % self.kv_head_num:
            raise ConfigError("kv_head_num", f"head_num ({self.head_num}) must be a multiple of kv_head_num ({self.kv_head_num})")
        nope = self.no_rope_freq
        self._check_layer_list("no_rope_freq", nope)
        if isinstance(nope, int) and (nope < 1 or self.layer_num % nope):
            raise ConfigError("no_rope_freq", f"must be >= 1 and divide layer_num ({self.layer_num}; got {nope}), as Megatron asserts")
        if self.model_type == "moe":
            for name in ("expert_num", "topk"):
                if getattr(self, name) is None:
                    raise ConfigError(name, "required when model_type is 'moe'")
            if self.moe_router_force_load_balancing and self.moe_load_imbalance != 1:
                raise ConfigError("moe_load_imbalance", "must be 1 with moe_router_force_load_balancing: its random "
                                  "logits route tokens uniformly at random, the spread the model takes")
            if self.topk > self.expert_num:
                raise ConfigError("topk", f"must be <= expert_num ({self.expert_num})")
            if self.dense_layers > self.layer_num:
                raise ConfigError("dense_layers", f"must be <= layer_num ({self.layer_num})")
            freq = self.moe_layer_freq
            self._check_layer_list("moe_layer_freq", freq)
            if isinstance(freq, int) and freq < 1:
                raise ConfigError("moe_layer_freq", f"must be >= 1 (got {freq})")
            groups, group_topk = self.moe_router_num_groups, self.moe_router_group_topk
            if (groups is None) != (group_topk is None):
                raise ConfigError("moe_router_group_topk", "group-limited routing needs moe_router_num_groups and moe_router_group_topk together")
            if groups is not None:
                if self.expert_num % groups:
                    raise ConfigError("moe_router_num_groups", f"must divide expert_num ({self.expert_num})")
                if group_topk > groups:
                    raise ConfigError("moe_router_group_topk", f"must be <= moe_router_num_groups ({groups})")
                if self.topk > group_topk * (self.expert_num // groups):
                    raise ConfigError("topk", "must fit in the experts of the selected groups")
        if self.mtp_num_layers and self.position_embedding_type == "learned_absolute":
            raise ConfigError("position_embedding_type", "Multi-Token Prediction needs rope or none (Megatron: 'MTP is "
                              "not supported with learned_absolute position embedding type')")
        if self.post_sublayer_norm and (self.is_moe or self.attention_type == "mla"):
            raise ConfigError("post_sublayer_norm", "is modelled for dense layers with GQA / MHA attention (Gemma 2 / 3), "
                              "not with MoE or MLA")
        if self.attention_type == "mla":
            for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
                if getattr(self, name) is None:
                    raise ConfigError(name, "required when attention_type is 'mla'")
        if self.hybrid_layer_pattern is not None:
            self._check_hybrid()
        self._check_linear_attention()
        return self

    # ---- derived sizes -------------------------------------------------------------
    def attention_window(self, layer: int) -> int | None:
        """The sliding window of global layer ``layer`` (0-based), None where it attends everything."""
        if self.window_size is None:
            return None
        if self.window_attn_skip_freq and (layer + 1) % self.window_attn_skip_freq == 0:
            return None
        return self.window_size

    @property
    def is_moe(self) -> bool:
        return self.model_type == "moe"

    @property
    def moe_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.intermediate_size

    def position_rows(self, seq_len: int) -> int:
        """Rows of the learned position table (0 without one); default the sequence length."""
        if self.position_embedding_type != "learned_absolute":
            return 0
        return self.max_position_embeddings or seq_len

    def padded_vocab(self, tp: int) -> int:
        """Vocab rows of the embedding / LM head over all TP ranks (Megatron padding)."""
        if not self.padded_vocab_size:
            return self.vocab_size
        mult = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // mult) * mult

    def _check_layer_list(self, field: str, value: object) -> None:
        """A per-layer 0/1 list (moe_layer_freq, no_rope_freq): one entry per layer, as Megatron asserts."""
        if isinstance(value, list) and (len(value) != self.layer_num or set(value) - {0, 1}):
            raise ConfigError(field, f"a list needs one 0 or 1 per layer ({self.layer_num}; got {len(value)} entries)")

    def uses_rope(self, layer: int) -> bool:
        """Whether global layer ``layer`` applies RoPE: rotary embeddings, and not a NoPE layer
        of ``no_rope_freq`` (megatron-core ``attention.py``: ``no_rope_freq[layer_number - 1]``)."""
        if self.position_embedding_type != "rope":
            return False
        nope = self.no_rope_freq
        if nope is None:
            return True
        layer = min(layer, self.layer_num - 1)
        return not (nope[layer] if isinstance(nope, list) else (layer + 1) % nope == 0)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer index ``layer`` (0-based) has a MoE MLP: not among the first
        ``dense_layers``, and MoE in ``moe_layer_freq`` (megatron-core ``gpt_layer_specs``:
        N means i % N == 0). An MTP layer (index >= layer_num) takes the last decoder layer's
        kind, as Megatron's MTP block takes that layer's spec."""
        if not self.is_moe:
            return False
        if self.hybrid_layer_pattern is not None:
            return self.layer_symbol(layer) == "E"
        layer = min(layer, self.layer_num - 1)
        if layer < self.dense_layers:
            return False
        freq = self.moe_layer_freq
        return bool(freq[layer]) if isinstance(freq, list) else layer % freq == 0
