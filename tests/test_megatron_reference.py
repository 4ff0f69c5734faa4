"""simumax against Megatron-Core itself, layer by layer, on CPU.

tests/reference/mcore_harness.py builds Megatron-Core's GPTModel with the local layer spec
for each configuration of tests/reference/specs.py (92 + 6 pipeline-stage: GPT/Llama, MHA/GQA, SwiGLU/GeLU,
RMSNorm/LayerNorm, TP 1/2 with and without SP, recompute none/selective/full (per layer or
in uniform groups), dropout,
MoE top-1/top-2 with EP 1/2 and TP 2, the all-to-all and all-gather dispatchers, routing options (fp32 router, sigmoid, expert bias, groups, aux,
seq-aux and z losses), shared experts with and without their gate, q / k norms, QKV bias,
the attention output gate, sliding windows and sinks, --recompute-modules (layernorm, mlp,
core_attn, moe, shared_experts, mla_up_proj), expert TP 1 under TP 2,
multi-latent attention with TP 1/2, multi-token prediction with one or two depths), runs one micro-batch forward and backward under
gloo and measures per transformer layer what autograd saves for backward, the forward
matmul FLOPs and the parameters per rank. simumax predicts the same with
``transformer_impl: local`` (tests/reference/compare.py).

Tolerances: parameters and FLOPs exact; saved bytes exact after the CPU-vs-GPU kernel
differences stated in ``compare.cpu_adjustment``, except the one residual explained in
``SELECTIVE_RESIDUAL``. Comparisons use the last layer (layer 0 also holds tensors all
layers share: the causal mask, and under full recompute the RoPE table passed to each
checkpoint) and, with EP, the mean over ranks (routing by a random-initialised router is
not balanced per rank; the mean of any per-rank quantity linear in routed tokens is).
Needs megatron-core (see docs/validation.md for the install); skipped without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from tests.reference.compare import cpu_adjustment, cpu_adjustment_outside_layers, predict  # noqa: E402
from tests.reference.specs import pipeline, world1, world2  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPECS = {s["id"]: s for s in world1() + world2()}
# Megatron's selective recompute passes attn_mask_type through the checkpoint as a
# one-element int32 tensor, which the checkpoint saves: 4 bytes per layer
SELECTIVE_RESIDUAL = 4


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, list[dict]]:
    """Run the harness once per world size; results per spec id (one entry per rank)."""
    tmp = tmp_path_factory.mktemp("mcore")
    out: dict[str, list[dict]] = {}
    for name, specs in (("world1", world1()), ("world2", world2()), ("pipeline", pipeline())):
        (tmp / f"{name}.json").write_text(json.dumps(specs))
        r = subprocess.run(
            [sys.executable, "-m", "tests.reference.mcore_harness", str(tmp / f"{name}.json"), str(tmp / f"{name}_out.json")],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        for spec, ranks in zip(specs, json.loads((tmp / f"{name}_out.json").read_text())):
            out[spec["id"]] = ranks
    return out


def _mean(ranks: list[dict], key: str, layer: int) -> float:
    return sum(r[key][layer] for r in ranks) / len(ranks)


def test_matrix_size() -> None:
    assert len(SPECS) >= 30
    kinds = {(s.get("experts") is not None, s["tp"], bool(s.get("sp")), s.get("recompute", "none")) for s in SPECS.values()}
    assert len(kinds) >= 12


@pytest.mark.parametrize("sid", sorted(SPECS))
def test_parameters_per_rank_exact(measured, sid: str) -> None:
    spec, ranks = SPECS[sid], measured[sid]
    pred = predict(spec)
    for r in ranks if not spec.get("ep", 1) > 1 else ranks[:1]:
        assert r["params"] == pred["params"], f"{sid}: rank {r['rank']} holds {r['params']}, simumax {pred['params']}"
        assert r["layer_params"] == pred["layer_params"]


@pytest.mark.parametrize("sid", sorted(SPECS))
def test_layer_forward_flops_exact(measured, sid: str) -> None:
    """GEMM FLOPs plus the unfused attention's two batched products (the full score
    matrix: Attention.table_flops); softmax, norms and element-wise ops are not counted by
    FlopCounterMode nor by this sum."""
    spec, ranks = SPECS[sid], measured[sid]
    pred = predict(spec)
    for layer in range(spec["layers"] + spec.get("mtp", 0)):  # the MTP depths after the decoder's layers
        assert _mean(ranks, "layer_fwd_flops", layer) == pred["layer_fwd_flops"][layer], f"{sid} layer {layer}"


@pytest.mark.parametrize("sid", sorted(SPECS))
def test_model_forward_and_backward_flops_exact(measured, sid: str) -> None:
    """The whole model's products (embedding to loss), forward, and backward with every
    recomputed forward (full, selective, --recompute-modules, MTP's), as FlopCounterMode counts
    them (with EP, the mean over ranks)."""
    spec, ranks = SPECS[sid], measured[sid]
    pred = predict(spec)
    assert sum(r["fwd_flops"] for r in ranks) / len(ranks) == pred["fwd_flops"], sid
    assert sum(r["bwd_flops"] for r in ranks) / len(ranks) == pred["bwd_flops"], sid


@pytest.mark.parametrize("sid", sorted(SPECS))
def test_layer_saved_bytes(measured, sid: str) -> None:
    spec, ranks = SPECS[sid], measured[sid]
    pred = predict(spec)
    # the last checkpoint's (uniform recompute in groups of n layers: one per group, the
    # harness counts them in order; no layer inside a group keeps anything)
    last = -(-spec["layers"] // spec.get("recompute_group", 1)) - 1
    for k in range(last + 1, spec["layers"]):
        assert _mean(ranks, "layer_saved", k) == pred["layer_saved"][k] == 0, f"{sid}: checkpoint {k}"
    real = _mean(ranks, "layer_saved", last)
    expected = pred["layer_saved"][last] + cpu_adjustment(spec)
    recomputes_core = spec.get("recompute") == "selective" or "core_attn" in spec.get("modules", ())
    residual = SELECTIVE_RESIDUAL if recomputes_core else 0
    err = (expected - real) / real
    print(f"{sid}: real {real:.0f} B, simumax {expected:.0f} B, error {err:+.4%}")
    assert real - expected == residual, f"{sid}: real {real:.0f} B vs simumax {expected:.0f} B ({err:+.3%})"
    assert abs(err) < 0.01
    for k in range(spec["layers"], spec["layers"] + spec.get("mtp", 0)):  # each MTP depth (its own checkpoint)
        real = _mean(ranks, "layer_saved", k)
        expected = pred["layer_saved"][k] + cpu_adjustment(spec, mtp=True)
        print(f"{sid} MTP depth {k - spec['layers']}: real {real:.0f} B, simumax {expected:.0f} B")
        assert real - expected == residual, f"{sid} MTP depth {k - spec['layers']}: real {real:.0f} B vs simumax {expected:.0f} B"


@pytest.mark.parametrize("sid", sorted(SPECS))
def test_bytes_saved_outside_the_layers(measured, sid: str) -> None:
    """What the embedding (ids, the out-of-shard mask, position ids, dropout mask), the final
    norm, the output head and each loss (Megatron's vocab-parallel cross-entropy: the fp32
    softmax, the target mask and targets; MTP's rolled labels, loss mask and token count)
    keep, exact on every configuration (the causal mask, which layer 0 keeps for every layer,
    aside: it is in the layers' count)."""
    spec, ranks = SPECS[sid], measured[sid]
    real = ranks[0]["other_saved"]
    expected = predict(spec)["other_saved"] + cpu_adjustment_outside_layers(spec)
    print(f"{sid}: outside the layers real {real} B, simumax {expected:.0f} B")
    assert all(r["other_saved"] == real for r in ranks)
    assert real == expected


@pytest.mark.parametrize("sid", [s["id"] for s in pipeline()])
def test_pipeline_stage_parameters_exact(measured, sid: str) -> None:
    """Per pipeline stage, what Megatron-Core builds on each rank: the first the embedding (and
    learned positions), the last the head (its own copy of a tied embedding), the MTP block
    and the embedding copy it looks its tokens up in."""
    from simumax.config.loader import load_system
    from simumax.estimate import Estimate
    from tests.reference.compare import configs

    spec = next(s for s in pipeline() if s["id"] == sid)
    model, strategy = configs(spec)
    stages = Estimate(model, strategy, load_system("a100_pcie")).memory().stages
    assert [r["params"] for r in measured[sid]] == [s.params for s in stages]


def test_korthikanti_formula_vs_measured(measured) -> None:
    """Korthikanti et al. 2022, sbh(34 + 5as/h) bytes per layer (fp16 activations,
    dropout, GeLU 4h MLP, no RoPE), against what Megatron-Core's local GPT layer saves on a
    GPU (the CPU measurement less the CPU adjustment). The paper's count is 2 B for the
    softmax output; Megatron-Core keeps it in fp32 (attention_softmax_in_fp32, its default)
    when the fused masked-softmax kernel is off: + 2as²b. The paper also ignores the norm
    statistics (2 norms x mean and rstd in fp32 per token): + 16sb. That is all."""
    spec = SPECS["gpt_paper"]
    s, b, h, a = spec["seq"], spec["batch"], spec["hidden"], spec["heads"]
    gpu = measured["gpt_paper"][0]["layer_saved"][-1] - cpu_adjustment(spec)
    paper = s * b * h * (34 + 5 * a * s / h)
    assert gpu == paper + 2 * a * s * s * b + 16 * s * b
    # and with TP + SP + selective recompute: sbh * 34 / t, plus the norms' statistics
    # (per sequence-sharded token) and the checkpoint's int32
    spec = SPECS["gpt_paper_tp2_sp_selective"]
    t = spec["tp"]
    gpu = _mean(measured["gpt_paper_tp2_sp_selective"], "layer_saved", -1) - cpu_adjustment(spec)
    assert gpu == s * b * h * 34 / t + 16 * s * b / t + SELECTIVE_RESIDUAL
