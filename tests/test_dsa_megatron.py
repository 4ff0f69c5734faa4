"""DeepSeek sparse attention against Megatron itself and the files users bring: megatron-core
0.19's own DSA modules on CPU (parameters, GEMM FLOPs), Megatron-LM flags and Hugging Face
config.json import, the deepseek-v3.2 preset, and the hybrid stack's MLA and DSA blocks."""

from __future__ import annotations

import json

import pytest

from simumax.config.loader import load_model, load_strategy
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.dims import Dims
from simumax.graph.kernels import Attention, Gemm
from simumax.graph.model_graph import layer_ops
from simumax.importers.hf import load_hf_config
from simumax.importers.megatron_args import parse_megatron_args
from tests.test_dsa import SYSTEM, V32, _strategy


def test_megatron_and_hf_imports(tmp_path) -> None:
    base = ("--num-layers 4 --hidden-size 7168 --num-attention-heads 128 --ffn-hidden-size 18432 --seq-length 4096 "
            "--micro-batch-size 1 --global-batch-size 8 --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 "
            "--qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --disable-bias-linear --vocab-size 129280 "
            "--experimental-attention-variant dsa --dsa-indexer-n-heads 64 --dsa-indexer-head-dim 128 "
            "--dsa-indexer-topk 2048 --dsa-indexer-topk-freq 2 --dsa-kernel-backend tilelang --bf16 --no-rope-fusion")
    m, s, notes = parse_megatron_args(base + " --dsa-indexer-k-norm-fp32", world_size=8)
    assert (m.experimental_attention_variant, m.dsa_indexer_topk, m.dsa_indexer_topk_freq) == ("dsa", 2048, 2)
    assert s.dsa_kernel_backend == "tilelang"
    assert any("k-norm-fp32" in n for n in notes)
    Estimate(m, s, SYSTEM).cost()
    with pytest.raises(ConfigError, match="experimental-attention-variant"):
        parse_megatron_args(base.replace("variant dsa", "variant sparse"), world_size=8)
    cfg = {"architectures": ["DeepseekV32ForCausalLM"], "hidden_size": 7168, "num_attention_heads": 128,
           "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
           "first_k_dense_replace": 3, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "vocab_size": 129280, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
           "topk_method": "noaux_tc", "num_nextn_predict_layers": 1, "hidden_act": "silu",
           "index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    hf, _ = load_hf_config(path)
    assert (hf.experimental_attention_variant, hf.dsa_indexer_n_heads, hf.dsa_indexer_head_dim, hf.dsa_indexer_topk) == (
        "dsa", 64, 128, 2048)
    assert hf.mtp_num_layers == 1
    est = Estimate(hf.with_updates({"layer_num": 4}), _strategy(), SYSTEM)
    est.cost()  # the MTP layer runs its own indexer
    assert any(o.name.endswith("dsa.scores") and o.layer >= 4 for c in est.chunks for o in c.ops)


DSA_SPECS = [
    dict(id="dsa", layers=4, hidden=256, heads=4, ffn=512, q_lora_rank=64, kv_lora_rank=32, qk_head_dim=16, rope=8,
         v_head_dim=16, index_heads=4, index_dim=32, topk=64, vocab=1024, seq=128),
    dict(id="dsa-share-offset", layers=6, hidden=256, heads=8, ffn=384, q_lora_rank=96, kv_lora_rank=64, qk_head_dim=32,
         rope=16, v_head_dim=24, index_heads=2, index_dim=48, topk=64, vocab=1024, seq=128, freq=3, offset=2),
    dict(id="dsa-share", layers=2, hidden=128, heads=4, ffn=256, q_lora_rank=48, kv_lora_rank=32, qk_head_dim=16,
         rope=8, v_head_dim=16, index_heads=4, index_dim=16, topk=64, vocab=1024, seq=128, freq=2),
]


def _ours(spec: dict):
    m = load_model("deepseek-v3.2").with_updates({
        "model_type": "dense", "layer_num": spec["layers"], "hidden_size": spec["hidden"], "head_num": spec["heads"],
        "kv_head_num": spec["heads"], "head_size": spec["v_head_dim"], "intermediate_size": spec["ffn"], "dense_layers": 0,
        "expert_num": None, "topk": None, "moe_ffn_hidden_size": None, "moe_shared_expert_intermediate_size": None,
        "q_lora_rank": spec["q_lora_rank"], "kv_lora_rank": spec["kv_lora_rank"], "qk_head_dim": spec["qk_head_dim"],
        "qk_pos_emb_head_dim": spec["rope"], "v_head_dim": spec["v_head_dim"], "vocab_size": spec["vocab"],
        "dsa_indexer_n_heads": spec["index_heads"], "dsa_indexer_head_dim": spec["index_dim"], "dsa_indexer_topk": spec["topk"],
        "dsa_indexer_topk_freq": spec.get("freq", 1), "dsa_indexer_skip_topk_offset": spec.get("offset", 0),
        "untie_embeddings_and_output_weights": True})
    st = _strategy(seq_len=spec["seq"], ep_size=1, world_size=1)
    return m, st


def test_parameters_exact_against_megatron_core(tmp_path) -> None:
    """Per decoder layer, the parameters of megatron-core 0.19's own AbsorbedMLASelfAttention /
    DSAttention / DSAIndexer modules (tests/reference/mcore_dsa.py: built on the meta device,
    TP1): absorbed MLA's weights and norms, the indexer's wq_b, wk, its key LayerNorm (weight and
    bias) and weights_proj, and no indexer in a layer that shares an earlier one's top-k."""
    pytest.importorskip("megatron.core")
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "specs.json").write_text(json.dumps(DSA_SPECS))
    r = subprocess.run([sys.executable, "-m", "tests.reference.mcore_dsa", str(tmp_path / "specs.json"),
                        str(tmp_path / "out.json")], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for spec, got in zip(DSA_SPECS, json.loads((tmp_path / "out.json").read_text())):
        m, st = _ours(spec)
        d = Dims.of(m, st)
        ours = [sum(o.params for o in layer_ops(m, st, d, i)) for i in range(m.layer_num)]
        assert ours == got["layer_params"], spec["id"]
        outside = 2 * spec["vocab"] * spec["hidden"] + spec["hidden"]  # embedding, output layer, final norm
        assert sum(ours) + outside == got["params"], spec["id"]


RUN_SPEC = dict(id="dsa-run", layers=2, hidden=256, heads=16, ffn=512, q_lora_rank=64, kv_lora_rank=512, qk_head_dim=16,
                rope=64, v_head_dim=16, index_heads=4, index_dim=96, topk=64, vocab=1024, seq=128, batch=1, freq=2,
                run=True, rotate=False)


def test_matmul_flops_exact_against_megatron_core(tmp_path) -> None:
    """One micro-batch through megatron-core's DSA layers on CPU (tests/reference/mcore_dsa.py):
    DeepSeek's attention widths (kv 512 + RoPE 64, 16 heads), index sharing. On the CPU the
    dense reference path runs, so the prediction is compared after swapping the TileLang
    kernels' FLOPs for that path's: the indexer's scores over every key (2·s²·Hi·Di, not the
    causal pairs) in the layers that run it, attention over every key (2·H·s²·(576 + 512),
    not the top-k; backward twice that). Every GEMM else — down / up projections, the
    absorption, the V up-projection, the indexer's three projections, the output projection,
    the MLP, the head — is compared as it is, per layer in forward and over the whole model
    both ways."""
    pytest.importorskip("megatron.core")
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "specs.json").write_text(json.dumps([RUN_SPEC]))
    r = subprocess.run([sys.executable, "-m", "tests.reference.mcore_dsa", str(tmp_path / "specs.json"),
                        str(tmp_path / "out.json")], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())[0]
    m, st = _ours(RUN_SPEC)
    m = m.with_updates({"dsa_indexer_rotate_activation": False})
    est = Estimate(m, st, SYSTEM)
    ops = [o for c in est.chunks for o in c.ops]
    s, H, qk, C = RUN_SPEC["seq"], RUN_SPEC["heads"], 512 + 64, 512
    dense_attn = 2 * H * s * s * (qk + C)
    fused_fwd = bwd_ours = 0.0
    for i in range(m.layer_num):
        mine = [o for o in ops if o.layer == i]
        fwd = sum(k.flops for o in mine for k in o.fwd if isinstance(k, (Gemm, Attention)))
        scores = sum(k.flops for o in mine if o.name.endswith("dsa.scores") for k in o.fwd if isinstance(k, Gemm))
        sparse = sum(k.flops for o in mine if o.name.endswith("sparse_attn") for k in o.fwd)
        dense_scores = 2 * s * s * RUN_SPEC["index_heads"] * RUN_SPEC["index_dim"] if m.dsa_computes_topk(i) else 0
        assert fwd - scores - sparse + dense_scores + dense_attn == got["layer_fwd_flops"][i], i
        fused_fwd += scores + sparse - dense_scores - dense_attn
    all_fwd = sum(k.flops for o in ops for k in o.fwd if isinstance(k, (Gemm, Attention)))
    assert all_fwd - fused_fwd == got["fwd_flops"]
    for o in ops:
        for k in o.bwd_input + o.bwd_weight:
            if isinstance(k, (Gemm, Attention)):
                bwd_ours += k.flops
    sparse_bwd = sum(k.flops for o in ops if o.name.endswith("sparse_attn") for k in o.bwd_input)
    assert bwd_ours - sparse_bwd + m.layer_num * 2 * dense_attn == got["bwd_flops"]


def test_v32_preset_is_v3_plus_one_indexer_per_layer() -> None:
    """DeepSeek-V3.2 = DeepSeek-V3 (671 B without its MTP layer) + per layer the indexer's
    wq_b (1536 x 64·128), wk (7168 x 128) with its LayerNorm (2 x 128) and weights_proj
    (7168 x 64): 671.9 B."""
    st = load_strategy({"seq_len": 4096, "world_size": 8, "ep_size": 8, "dsa_kernel_backend": "tilelang", "apply_rope_fusion": False})
    v3, v32 = (Estimate(load_model(n), st, SYSTEM).params.total for n in ("deepseek-v3", "deepseek-v3.2"))
    assert v32 - v3 == 61 * (1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64)
    assert round(v32 / 1e9, 1) == 671.9


def _hybrid(pattern: str, **fields):
    return V32.with_updates({"layer_num": len(pattern.split("/")[0].replace("|", "")), "hybrid_layer_pattern": pattern,
                             "dense_layers": 0, "mamba_num_heads": 112,
                             "experimental_attention_variant": "dsa" if "D" in pattern else None, **fields})


def test_hybrid_stacks_take_mla_and_dsa_blocks() -> None:
    """megatron-core's hybrid stack builds + blocks as MLA attention and D blocks as DSA
    (HybridStack: mla_layer, dsa_layer), each with its norm and residual like *; a D block's
    ops are a DSA layer's, a + block's an MLA layer's. Megatron refuses * beside + / D, and D
    blocks make the variant dsa; a D block can share only another D block's top-k."""
    from simumax.report.format import layer_mix

    m = _hybrid("MD-+E")
    st = _strategy()
    d = Dims.of(m, st)
    names = {i: {o.name.split(".", 1)[1] for o in layer_ops(m, st, d, i)} for i in range(5)}
    assert {"dsa.scores", "sparse_attn", "v_up", "q_absorb"} <= names[1]
    assert {"q_up", "kv_up", "attn"} <= names[3] and "sparse_attn" not in names[3]
    assert layer_mix(m) == "5 blocks: 1 Mamba-2, 1 MLA attention, 1 DeepSeek sparse attention, 1 MLP, 1 MoE"
    assert m.softmax_attention_layers == 2
    Estimate(m, st, SYSTEM).cost()
    with pytest.raises(ConfigError, match="hybrid_layer_pattern"):
        _hybrid("M*D-E")
    with pytest.raises(ConfigError, match="experimental_attention_variant"):
        _hybrid("M+-E", experimental_attention_variant="dsa")
    with pytest.raises(ConfigError, match="attention_type"):
        _hybrid("M*-E", attention_type="mla")
    with pytest.raises(ConfigError, match="no D block"):
        Estimate(_hybrid("-DD-DE", dsa_indexer_topk_freq=2), st, SYSTEM).cost()
    hm, _, _ = parse_megatron_args(
        "--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 2048 --seq-length 4096 "
        "--micro-batch-size 1 --multi-latent-attention --q-lora-rank 256 --kv-lora-rank 512 --qk-head-dim 64 "
        "--qk-pos-emb-head-dim 64 --v-head-dim 64 --disable-bias-linear --dsa-indexer-n-heads 16 "
        "--dsa-indexer-head-dim 128 --dsa-indexer-topk 2048 --hybrid-layer-pattern MDMD --mamba-num-heads 32 --vocab-size 32000",
        world_size=1)
    assert hm.experimental_attention_variant == "dsa"  # Megatron sets it from the pattern's D blocks
