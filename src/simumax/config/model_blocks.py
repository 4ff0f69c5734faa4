"""What block each layer of a model is — a hybrid stack's symbol, a Gated DeltaNet or softmax
attention layer — and the rules megatron-core asserts on those patterns: a mixin of
ModelConfig (config/model.py), which holds the fields."""

from __future__ import annotations

from typing import TYPE_CHECKING

from simumax.errors import ConfigError

# Megatron hybrid-stack symbols modelled, and what each block is
HYBRID_BLOCKS = {"M": "Mamba-2", "G": "Gated DeltaNet", "*": "attention", "+": "MLA attention",
                 "D": "DeepSeek sparse attention", "-": "MLP", "E": "MoE"}
LATENT_BLOCKS = "+D"  # MLA and DSA blocks: the model's MLA attention (megatron-core's mla_layer / dsa_layer)
HYBRID_SYMBOLS = "".join(HYBRID_BLOCKS)


class LayerBlocks:
    """Per-layer block kinds of a ModelConfig (its fields are read through ``self``)."""

    if TYPE_CHECKING:  # ModelConfig's fields and helpers these methods read
        layer_num: int
        hybrid_layer_pattern: str | None
        experimental_attention_variant: str | None
        linear_attention_freq: int | list[int] | None
        linear_num_key_heads: int
        linear_num_value_heads: int
        linear_key_head_dim: int
        linear_value_head_dim: int
        attention_type: str
        mtp_num_layers: int
        post_sublayer_norm: bool
        mamba_head_dim: int
        mamba_num_groups: int
        mamba_num_heads: int | None
        hidden_size: int
        is_moe: bool
        add_bias_linear: bool
        dsa_indexer_n_heads: int | None
        dsa_indexer_head_dim: int | None
        dsa_indexer_topk: int | None
        dsa_indexer_topk_freq: int
        dsa_indexer_skip_topk_offset: int
        dsa_indexer_loss_coeff: float | None
        dsa_indexer_use_sparse_loss: bool
        qk_pos_emb_head_dim: int | None
        q_lora_rank: int | None

        def _check_layer_list(self, field: str, value: object) -> None: ...

    def _check_linear_attention(self) -> None:
        """Gated DeltaNet's sizes and layer pattern as megatron-core asserts them
        (transformer_config.py; experimental_attention_variant_module_specs.py)."""
        freq = self.linear_attention_freq
        if self.experimental_attention_variant == "gated_delta_net":
            if self.hybrid_layer_pattern is not None:
                raise ConfigError("experimental_attention_variant", "a hybrid stack marks its Gated DeltaNet blocks G "
                                  "in hybrid_layer_pattern")
            if freq is None:
                raise ConfigError("linear_attention_freq", "must be set for gated_delta_net, as Megatron asserts")
            self._check_layer_list("linear_attention_freq", freq)
            if isinstance(freq, int) and freq < 1:
                raise ConfigError("linear_attention_freq", f"must be >= 1 (got {freq})")
            if self.attention_type == "mla":
                raise ConfigError("experimental_attention_variant", "Gated DeltaNet beside MLA attention is not modelled")
        elif freq is not None:
            raise ConfigError("linear_attention_freq", "needs experimental_attention_variant gated_delta_net")
        if self.experimental_attention_variant == "dsa":
            self._check_dsa()
        if self.has_linear_attention and self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError("linear_num_value_heads", f"must be a multiple of linear_num_key_heads "
                              f"({self.linear_num_key_heads}), as Megatron asserts")

    def _check_dsa(self) -> None:
        """DeepSeek sparse attention's model rules as megatron-core asserts them
        (transformer_config.py; experimental_attention_variant_module_specs.py: MLA only, on
        AbsorbedMLASelfAttention, which takes no linear biases); what is not modelled is named."""
        if self.attention_type != "mla":
            raise ConfigError("experimental_attention_variant", "dsa needs MLA attention (attention_type mla), as "
                              "Megatron asserts")
        for name in ("dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk"):
            if getattr(self, name) is None:
                raise ConfigError(name, "required with experimental_attention_variant dsa")
        if self.q_lora_rank is None:
            raise ConfigError("q_lora_rank", "required with dsa: megatron-core refuses DSA with a full-rank query "
                              "(its indexer reads the normed q latent; mla_qk_norm_config)")
        if self.add_bias_linear:
            raise ConfigError("add_bias_linear", "dsa runs AbsorbedMLASelfAttention, which takes no linear biases, as "
                              "Megatron asserts")
        if self.dsa_indexer_head_dim < (self.qk_pos_emb_head_dim or 0):  # type: ignore[operator]
            raise ConfigError("dsa_indexer_head_dim", f"must be at least qk_pos_emb_head_dim ({self.qk_pos_emb_head_dim}): "
                              "the indexer's RoPE part is that wide")
        if self.dsa_indexer_loss_coeff and not self.dsa_indexer_use_sparse_loss:
            raise ConfigError("dsa_indexer_use_sparse_loss", "the dense indexer loss (the attention distribution over "
                              "every key, megatron-core's reference path) is not modelled; the sparse loss over the "
                              "top-k keys is (true)")
        for depth in range(self.mtp_num_layers):
            # MultiTokenPredictionLayer numbers its inner layer by depth (1, 2, ...): a depth that
            # would reuse a top-k finds the decoder's holder, not one of its own
            if not self._dsa_computes(depth + 1):
                raise ConfigError("dsa_indexer_topk_freq", f"MTP depth {depth + 1} would reuse another layer's top-k "
                                  "(megatron-core numbers MTP layers by depth); not modelled")

    def _dsa_since_source(self, number: int) -> int:
        """Layers between 1-based layer ``number`` and the one whose top-k it uses (megatron-core
        ``is_dsa_skip_topk_layer`` / ``source_dsa_compute_layer``: max(number - max(offset, 1), 0)
        modulo the frequency); 0 for a layer that runs its indexer."""
        return max(number - max(self.dsa_indexer_skip_topk_offset, 1), 0) % self.dsa_indexer_topk_freq

    def _dsa_computes(self, number: int) -> bool:
        return self._dsa_since_source(number) == 0

    def dsa_computes_topk(self, layer: int) -> bool:
        """Whether DSA layer ``layer`` (0-based) runs its own indexer, not reusing an earlier
        layer's top-k keys. MTP layers compute (ModelConfig's check refuses a depth that would not)."""
        return layer >= self.layer_num or self._dsa_computes(layer + 1)

    def dsa_source_layer(self, layer: int) -> int:
        """The 0-based layer whose top-k keys DSA layer ``layer`` uses (itself when it computes;
        megatron-core ``source_dsa_compute_layer``)."""
        return layer if layer >= self.layer_num else layer - self._dsa_since_source(layer + 1)

    def _check_hybrid(self) -> None:
        """The hybrid stack's pattern and Mamba sizes as megatron-core asserts them
        (hybrid_layer_allocation.py, mamba_mixer.py); what the model does not cover is named."""
        raw = self.hybrid_layer_pattern or ""
        main, *mtp = raw.split("/")
        pattern = self.hybrid_symbols
        every = pattern + "".join(mtp)
        unknown = sorted(set(every) - set(HYBRID_SYMBOLS + "|"))
        if not pattern or unknown:
            why = "symbols are M, G, *, +, D, - and E, | between pipeline segments, / before each MTP depth's blocks"
            raise ConfigError("hybrid_layer_pattern", f"{why} (got {''.join(unknown) or 'an empty pattern'})")
        if "|" in main and not all(main.split("|")):
            raise ConfigError("hybrid_layer_pattern", "an empty pipeline segment between '|' (every virtual stage "
                              "holds a block here)")
        if mtp and (not mtp[0] or "|" in mtp[0] or any(part != mtp[0] for part in mtp)):
            raise ConfigError("hybrid_layer_pattern", "the MTP depths after '/' must be one and the same non-empty "
                              "block pattern without '|', as Megatron asserts (parse_hybrid_pattern)")
        if len(pattern) != self.layer_num:
            raise ConfigError("layer_num", f"must be the hybrid pattern's block count ({len(pattern)}; got {self.layer_num})")
        if mtp and self.mtp_num_layers in (0, len(mtp)):
            self.__dict__["mtp_num_layers"] = len(mtp)  # Megatron infers the MTP depths from the pattern
        elif self.mtp_num_layers:
            raise ConfigError("mtp_num_layers", f"must be the hybrid pattern's MTP depths ({len(mtp)}): a hybrid stack "
                              "states its MTP blocks after '/' (Megatron's unified --hybrid-layer-pattern 'main/mtp/mtp')")
        if "E" in every and not self.is_moe:
            raise ConfigError("hybrid_layer_pattern", "E layers need a MoE model (model_type moe, expert_num, topk)")
        if self.is_moe and "E" not in every:
            raise ConfigError("model_type", "a hybrid MoE model has E layers in its pattern")
        latent = set(every) & set(LATENT_BLOCKS)
        if latent and "*" in every:
            raise ConfigError("hybrid_layer_pattern", "attention (*) beside MLA / DSA blocks (+, D) in one model, which "
                              "Megatron refuses")
        if (self.attention_type == "mla") != bool(latent) and ("*" in every or latent):
            raise ConfigError("attention_type", "a hybrid stack's attention blocks are * with attention_type mha, "
                              "+ (MLA) or D (DSA) with attention_type mla")
        if ("D" in every) != (self.experimental_attention_variant == "dsa"):
            raise ConfigError("experimental_attention_variant", "a hybrid stack's D blocks are DeepSeek sparse "
                              "attention: experimental_attention_variant dsa, with D blocks only (Megatron sets it "
                              "from the pattern)")
        if self.post_sublayer_norm:
            raise ConfigError("hybrid_layer_pattern", "hybrid layers with sandwich norms are not modelled")
        if self.mamba_inner % self.mamba_head_dim:
            raise ConfigError("mamba_head_dim", f"must divide the mixer's inner width ({self.mamba_inner})")
        if self.mamba_heads % self.mamba_num_groups:
            raise ConfigError("mamba_num_groups", f"must divide the Mamba heads ({self.mamba_heads}), as Megatron asserts")

    @property
    def hybrid_symbols(self) -> str:
        """The hybrid pattern's decoder blocks, one symbol per layer (its '|' segment marks and its
        MTP part after '/' left out)."""
        return (self.hybrid_layer_pattern or "").split("/")[0].replace("|", "")

    @property
    def hybrid_mtp_pattern(self) -> str:
        """The blocks of each MTP depth of a hybrid stack (after '/'), "" without."""
        parts = (self.hybrid_layer_pattern or "").split("/")
        return parts[1] if len(parts) > 1 else ""

    @property
    def mtp_blocks(self) -> int:
        """Layer indices one MTP depth takes: its hybrid blocks, or one transformer layer."""
        return len(self.hybrid_mtp_pattern) or 1

    @property
    def hybrid_segments(self) -> list[int] | None:
        """Blocks per pipeline segment of a pattern with '|' (Megatron's virtual stages in
        forward order), else None."""
        main = (self.hybrid_layer_pattern or "").split("/")[0]
        return [len(seg) for seg in main.split("|")] if "|" in main else None

    @property
    def mamba_heads(self) -> int:
        """Mamba-2 heads H: ``mamba_num_heads``, else the mixer's 2 x hidden over the head dim."""
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    @property
    def mamba_inner(self) -> int:
        """The mixer's inner width d_inner (H x P with mamba_num_heads, else 2 x hidden)."""
        return self.mamba_num_heads * self.mamba_head_dim if self.mamba_num_heads else 2 * self.hidden_size

    @property
    def has_linear_attention(self) -> bool:
        """Some layer is a Gated DeltaNet (G blocks of a hybrid stack, or gated_delta_net layers)."""
        if self.hybrid_layer_pattern is not None:
            return "G" in self.hybrid_layer_pattern
        return self.experimental_attention_variant == "gated_delta_net"

    @property
    def gdn_in_proj_width(self) -> int:
        """A Gated DeltaNet's in_proj output over all TP ranks: q and k (key heads x dk), v and the
        gate z (value heads x dv), β and α (one per value head)."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + 2 * self.linear_num_value_heads * self.linear_value_head_dim + 2 * self.linear_num_value_heads)

    @property
    def softmax_attention_layers(self) -> int:
        """Layers with softmax attention: all but Gated DeltaNet layers, or a hybrid stack's *, + and D blocks."""
        if self.hybrid_layer_pattern is not None:
            return sum(self.hybrid_symbols.count(c) for c in "*" + LATENT_BLOCKS)
        return sum(not self.linear_attention(i) for i in range(self.layer_num))

    def linear_attention(self, layer: int) -> bool:
        """Whether transformer layer ``layer`` (0-based) runs a Gated DeltaNet instead of softmax
        attention (megatron-core ``get_linear_attention_pattern``: N means (i + 1) % N != 0);
        an MTP layer takes the last layer's kind. A hybrid stack's G blocks are their own symbol."""
        if self.experimental_attention_variant != "gated_delta_net" or self.hybrid_layer_pattern is not None:
            return False
        layer = min(layer, self.layer_num - 1)
        freq = self.linear_attention_freq
        return bool(freq[layer]) if isinstance(freq, list) else (layer + 1) % freq != 0  # type: ignore[operator]

    def layer_symbol(self, layer: int) -> str:
        """What layer ``layer`` is: its hybrid pattern symbol (M, G, *, -, E), or "T" for a
        transformer layer (attention and MLP) of a model without a pattern. Past the decoder,
        MTP depths' blocks (their pattern after '/'; without one, the last block's kind)."""
        if self.hybrid_layer_pattern is None:
            return "T"
        mtp = self.hybrid_mtp_pattern
        if layer >= self.layer_num and mtp:
            return mtp[(layer - self.layer_num) % len(mtp)]
        return self.hybrid_symbols[min(layer, self.layer_num - 1)]
