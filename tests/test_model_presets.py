"""Model presets of public benchmark models (issue 22 part 6): parameter counts against the
totals their authors published, to the published rounding."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.estimate import Estimate

SYSTEM = load_system("h100-sxm-80gb")


def _params(name: str):
    m = load_model(name)
    ep = 8 if m.is_moe else 1
    return m, Estimate(m, load_strategy({"seq_len": 4096, "world_size": 8, "ep_size": ep}), SYSTEM).params


@pytest.mark.parametrize("preset, total, digits", [
    ("llama3.1-8b", 8.03, 2),      # Meta: 8.03 B (Hugging Face model card)
    ("llama3.1-70b", 70.55, 2),    # 70.55 B
    ("llama3.1-405b", 405.85, 2),  # 405.85 B; 126 layers, 128256 vocabulary
    ("qwen3-8b", 8.2, 1),          # Qwen3 report: 8.2 B total
    ("qwen3-14b", 14.8, 1),        # 14.8 B total
    ("nemotron-4-340b", 341.0, 1), # NVIDIA: 9.4 B embedding + 331.6 B non-embedding
    ("kimi-k2", 1.03e3, -1),       # Moonshot: "1 T total" (1.03 T by its config)
    ("qwen3-235b-a22b", 235, 0),   # Qwen3 report: 235 B total (22 B activated, below)
    ("qwen3-32b", 32.8, 1),        # 32.8 B (SimuMax's file)
    ("llama4-maverick", 401, 0),   # Meta: 400 B total (400.7 by its text config), 17 B active (below)
    ("qwen3-next-80b-a3b", 80, 0),  # Qwen: 80 B total (79.67 by its config: tests/test_gated_deltanet.py)
    ("nemotron-h-8b", 8.1, 1),     # NVIDIA's Nemotron-H 8B (8.10 B by its config: tests/test_hybrid.py)
    # Qwen2.5 (q / k / v biases): the checkpoints' safetensors totals on Hugging Face (the model
    # cards print 7.61 / 14.7 / 32.5 / 72.7 B, truncated or rounded differently)
    ("qwen2.5-7b", 7.62, 2), ("qwen2.5-14b", 14.8, 1), ("qwen2.5-32b", 32.8, 1), ("qwen2.5-72b", 72.7, 1),
    # Gemma 2 (four norms per layer: the sandwich norms): the checkpoints' safetensors totals,
    # 9,241,705,984 and 27,227,128,320; Gemma 3 27B's text model (the checkpoint's 27.4 B adds
    # its ~0.4 B SigLIP vision tower)
    ("gemma-2-9b", 9.24, 2), ("gemma-2-27b", 27.2, 1), ("gemma-3-27b", 27.0, 1),
])
def test_totals(preset: str, total: float, digits: int) -> None:
    _, p = _params(preset)
    assert round(p.total / 1e9, digits) == total


@pytest.mark.parametrize("preset, non_embedding", [
    ("qwen3-8b", 6.95), ("qwen3-14b", 13.2),      # Qwen3 report, non-embedding
    ("qwen2.5-7b", 6.53),                          # Qwen2.5-7B model card, non-embedding
    ("nemotron-4-15b", 12.5), ("nemotron-4-340b", 331.6),  # Nemotron-4 reports, non-embedding
])
def test_non_embedding_counts(preset: str, non_embedding: float) -> None:
    m, p = _params(preset)
    digits = len(str(non_embedding).split(".")[1])
    assert round((p.total - 2 * m.vocab_size * m.hidden_size) / 1e9, digits) == non_embedding


def test_kimi_k2_active() -> None:
    """Moonshot: 32 B activated (the input embedding, a lookup, left out)."""
    m, p = _params("kimi-k2")
    assert round((p.active - m.vocab_size * m.hidden_size) / 1e9) == 32


def test_qwen3_moe_active() -> None:
    """Qwen3 report: 235B-A22B activates 22 B per token, 30B-A3B "3.3 B" (3.35 truncated)."""
    assert round(_params("qwen3-235b-a22b")[1].active / 1e9) == 22
    assert 3.3 <= _params("qwen3-30b-a3b")[1].active / 1e9 < 3.4


def test_llama4_active_and_layer_pattern() -> None:
    """Meta's Llama 4: 17 B active in both; Maverick's MoE layers alternate with dense ones,
    Scout's are every layer (its published 109 B counts the vision encoder too)."""
    for name in ("llama4-maverick", "llama4-scout"):
        m, p = _params(name)
        assert round(p.active / 1e9) == 17 and m.topk == 1 and not m.moe_pad_expert_input_to_capacity
    assert load_model("llama4-maverick").moe_layer_freq[:4] == [0, 1, 0, 1]
    assert 105 < _params("llama4-scout")[1].total / 1e9 < 109
