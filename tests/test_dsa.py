"""DeepSeek sparse attention (megatron-core experimental_attention_variant dsa, DeepSeek-V3.2)
with the TileLang kernels: absorbed MLA, the lightning indexer without its loss, SparseMLA over
the top-k keys; sizes, FLOPs and kept bytes by hand from the megatron-core 0.19 sources
(graph/dsa.py's docstring names them)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.dims import Dims
from simumax.graph.kernels import Attention, Collective, Gemm, MemBound
from simumax.graph.model_graph import layer_ops

SYSTEM = load_system("h100-sxm-80gb")
V32 = load_model("deepseek-v3.2")


def _model(**fields):
    return V32.with_updates({"layer_num": 4, "dense_layers": 1, **fields})


def _strategy(**fields):
    base = {"seq_len": 4096, "dsa_kernel_backend": "tilelang", "apply_rope_fusion": False, "world_size": 8, "ep_size": 8}
    return load_strategy("ep8_pp1_dp8_mbs1").with_updates({**base, **fields})


def _ops(m, st, layer=1):
    return {o.name.split(".", 1)[1]: o for o in layer_ops(m, st, Dims.of(m, st), layer)}


def _gemm_flops(kernels) -> float:
    return sum(k.flops for k in kernels if isinstance(k, Gemm))


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_dsa_layer_sizes_and_flops_by_hand(tp) -> None:
    """Per TP rank at s = 4096, b = 1: the indexer duplicated (whole weights, every token: it
    runs on the sequence gathered over TP), the attention split over heads. Sparse attention
    forward 2·s·k·H·(576 + 512) over max(H, 16) heads; its backward twice that (the forward
    kernel run again counts no model FLOPs); the indexer's scores 2·Hi·Di over the causal
    (query, key) pairs; the absorption and the V up-projection 2·s·H·128·512 each."""
    m = _model()
    st = _strategy(tp_size=tp, enable_sequence_parallel=tp > 1, world_size=8 * tp)
    ops = _ops(m, st)
    s, H = 4096, 128 // tp
    Hi, Di, k, q_rank, h = 64, 128, 2048, 1536, 7168
    # parameters: the indexer's (wq_b, wk with k's LayerNorm, weights_proj) whole on every rank
    assert ops["dsa.wq_b"].params == q_rank * Hi * Di == ops["dsa.wq_b"].tp_replicated_params
    assert ops["dsa.wk"].params == h * Di + 2 * Di == ops["dsa.wk"].tp_replicated_params
    assert ops["dsa.weights_proj"].params == h * Hi
    assert ops["v_up"].params == 512 * H * (128 + 128)  # the kv up-projection, never run as a linear
    assert ops["q_absorb"].params == 0
    # FLOPs
    assert _gemm_flops(ops["dsa.wq_b"].fwd) == 2 * s * q_rank * Hi * Di
    assert _gemm_flops(ops["dsa.scores"].fwd) == 2 * Hi * Di * s * ((s + 1) // 2)
    hk = max(H, 16)
    fwd = 2 * s * k * hk * (576 + 512)
    sparse = ops["sparse_attn"]
    assert sum(x.flops for x in sparse.fwd) == fwd
    assert sum(x.flops for x in sparse.bwd_input) == 2 * fwd
    assert sum(1 for x in sparse.bwd_input if isinstance(x, Attention) and x.phase == "fwd" and x.rerun) == 1
    assert _gemm_flops(ops["q_absorb"].fwd) == _gemm_flops(ops["v_up"].fwd) == 2 * s * H * 128 * 512
    # without its loss the indexer has no backward and keeps nothing
    for name in ("dsa.wq_b", "dsa.wk", "dsa.weights_proj", "dsa.scores", "dsa.topk"):
        assert not ops[name].bwd_input and not ops[name].bwd_weight and not ops[name].saved, name
    # with SP, the indexer's inputs (hidden state and q latent) are all-gathered over TP
    gathers = [c.bytes for c in ops["dsa.gather"].fwd] if tp > 1 else []
    assert gathers == ([2.0 * s * h, 2.0 * s * q_rank] if tp > 1 else [])


def test_dsa_kept_bytes_by_hand() -> None:
    """What one DSA layer keeps at TP1, s = 4096, b = 1 (bf16): the absorption q_nope's buffer
    (the q up-projection's output, s·H·192), SparseMLA its q [s, H, 576], kv [s, 576], the int32
    indices [s, 2048] and the valid-head mask, the V up-projection the latent output
    [s, H, 512]; the unfused RoPE (Megatron refuses RoPE fusion with DSA) its cos / sin for q and k
    (s·64 each); a layer sharing an earlier layer's top-k keeps no indices of its own."""
    m = _model(dsa_indexer_topk_freq=2)
    st = _strategy()
    s, H = 4096, 128
    ops = _ops(m, st, layer=2)  # layers 1 and 3 (1-based) run the indexer, 2 and 4 reuse their top-k
    assert ops["q_absorb"].saved_bytes == 2 * s * H * 192 + 4 * 2 * s * 64
    assert ops["sparse_attn"].saved_bytes == 2 * s * H * 576 + 2 * s * 576 + 4 * s * 2048 + s * H
    assert ops["v_up"].saved_bytes == 2 * s * H * 512
    shared = _ops(m, st, layer=3)
    assert "dsa.scores" not in shared and "dsa.wq_b" not in shared
    assert shared["sparse_attn"].saved_bytes == 2 * s * H * 576 + 2 * s * 576 + s * H


def test_index_sharing_follows_megatron() -> None:
    """Which layers run the indexer and whose top-k the others take: megatron-core's own
    is_dsa_skip_topk_layer / source_dsa_compute_layer over frequencies and offsets."""
    dsa = pytest.importorskip("megatron.core.transformer.experimental_attention_variant.dsa")
    for freq in (1, 2, 3, 4):
        for offset in (0, 1, 2, 5):
            m = _model(layer_num=12, dsa_indexer_topk_freq=freq, dsa_indexer_skip_topk_offset=offset)
            for i in range(12):
                assert m.dsa_computes_topk(i) == (not dsa.is_dsa_skip_topk_layer(i + 1, offset, freq)), (freq, offset, i)
                assert m.dsa_source_layer(i) + 1 == dsa.source_dsa_compute_layer(i + 1, offset, freq), (freq, offset, i)


def test_index_sharing_cuts_indexer_time_and_pipeline_split_is_checked() -> None:
    st = _strategy(seq_len=16384)
    every = Estimate(_model(), st, SYSTEM).cost().duration_time_per_iter
    shared = Estimate(_model(dsa_indexer_topk_freq=2), st, SYSTEM).cost().duration_time_per_iter
    assert shared < every
    # pp 2 over 4 layers: the second stage starts on layer 3 (1-based), which runs its indexer at
    # freq 2 but at freq 3 reuses layer 1's top-k, on the other stage
    with pytest.raises(ConfigError, match="dsa_indexer_topk_freq"):
        Estimate(_model(dsa_indexer_topk_freq=3), _strategy(pp_size=2, world_size=16), SYSTEM).cost()
    Estimate(_model(dsa_indexer_topk_freq=2), _strategy(pp_size=2, world_size=16), SYSTEM).cost()


def test_sparse_attention_beats_dense_mla_only_at_long_context() -> None:
    """Absorbed sparse attention does 576 + 512 per (query, key) pair over 2048 keys, dense MLA
    192 + 128 over the causal half: at TP1 DSA costs more at 4K and much less at 64K. The
    indexer (64 heads of 128 over the causal pairs) runs whole on every TP rank while attention
    splits over heads, so at TP8 most of the long-context gain is gone."""
    dense = load_model("deepseek-v3").with_updates({"layer_num": 4, "dense_layers": 1})
    ratio = {}
    for tp in (1, 8):
        for seq in (4096, 65536):
            st = _strategy(seq_len=seq, micro_batch_num=1, tp_size=tp, enable_sequence_parallel=tp > 1, world_size=8 * tp)
            mla, sparse = (Estimate(mm, st, SYSTEM).cost().duration_time_per_iter for mm in (dense, _model()))
            ratio[tp, seq] = sparse / mla
    assert ratio[1, 4096] > 1 and ratio[1, 65536] < 0.7
    assert ratio[8, 65536] > ratio[1, 65536] + 0.2


def test_core_attention_recompute_reruns_the_indexer() -> None:
    st = _strategy(megatron_recompute=True, megatron_recompute_modules=["core_attn"])
    est = Estimate(_model(), st, SYSTEM)
    ops = {o.name.split(".", 1)[1]: o for o in est.chunks[0].ops if o.layer == 1}
    assert ops["dsa.scores"].recompute_group == ops["sparse_attn"].recompute_group == "L1.attn"
    assert est.cost().breakdown["recompute"] > 0


@pytest.mark.parametrize("fields, field", [
    ({"dsa_kernel_backend": "none"}, "dsa_kernel_backend"),
    ({"dsa_kernel_backend": "cudnn"}, "dsa_kernel_backend"),
    ({"use_math_sdp": True}, "use_math_sdp"),
    ({"cp_size": 2, "world_size": 16, "cp_comm_type": "p2p"}, "cp_comm_type"),
    ({"tp_size": 2, "enable_sequence_parallel": False, "world_size": 16}, "enable_sequence_parallel"),
    ({"seq_len": 2000}, "dsa_indexer_topk"),  # all 2000 keys are the top-k: not whole blocks of 64
])
def test_dsa_strategy_rules(fields, field) -> None:
    with pytest.raises(ConfigError, match=field):
        Estimate(_model(), _strategy(**fields), SYSTEM).cost()


def test_sparse_mla_head_and_topk_limits() -> None:
    """TileLang's SparseMLA pads a rank's query heads to 16 and needs a power of two
    (ops/tilelang_dsa.py): 128 heads over TP16 (8, padded) run; 96 over TP2 (48) do not. The
    top-k is min(topk, keys): 2048 of 4000 keys runs."""
    tp16 = _strategy(tp_size=16, enable_sequence_parallel=True, world_size=128)
    Estimate(_model(), tp16, SYSTEM).cost()
    sparse = _ops(_model(), tp16)["sparse_attn"]
    assert {k.head_num for k in sparse.fwd if isinstance(k, Attention)} == {16}
    with pytest.raises(ConfigError, match="tp_size"):
        Estimate(_model(head_num=96), _strategy(tp_size=2, enable_sequence_parallel=True, world_size=16), SYSTEM).cost()
    Estimate(_model(), _strategy(seq_len=4000), SYSTEM).cost()


@pytest.mark.parametrize("fields, field", [
    ({"attention_type": "mha", "dense_layers": 0, "model_type": "dense"}, "experimental_attention_variant"),
    ({"dsa_indexer_topk": None}, "dsa_indexer_topk"),
    ({"add_bias_linear": True}, "add_bias_linear"),
    ({"dsa_indexer_loss_coeff": 0.01}, "dsa_indexer_use_sparse_loss"),  # the dense loss
    ({"kv_lora_rank": 256}, "kv_lora_rank"),
    ({"q_lora_rank": None}, "q_lora_rank"),
])
def test_dsa_model_rules(fields, field) -> None:
    with pytest.raises(ConfigError, match=field):
        Estimate(_model(**fields), _strategy(), SYSTEM).cost()


def test_dsa_kernels_are_all_costed() -> None:
    """Every kernel of a DSA layer has a time: the indexer's fused score GEMM moves no HBM bytes
    of its own (its logits are the next kernels'), SparseMLA's attention kernels read the table."""
    ops = _ops(_model(), _strategy())
    kinds = {type(k) for o in ops.values() for k in o.fwd + o.bwd_input + o.bwd_weight}
    assert {Gemm, MemBound, Attention} <= kinds
    scores = [k for k in ops["dsa.scores"].fwd if isinstance(k, Gemm)]
    assert len(scores) == 1 and scores[0].fused and scores[0].bytes == 0
    assert not any(isinstance(k, Collective) for k in ops["sparse_attn"].fwd)


def test_perf_says_which_layers_run_the_indexer() -> None:
    from simumax.report.format import layer_mix

    assert layer_mix(_model(layer_num=8, dsa_indexer_topk_freq=4)) == (
        "8 DeepSeek sparse attention layers (top-2048 keys): 2 run the indexer, 6 reuse an earlier layer's top-k")
    assert layer_mix(_model()) == "4 DeepSeek sparse attention layers (top-2048 keys): 4 run the indexer"


@pytest.mark.parametrize("tp", [1, 8])
def test_sparse_indexer_loss_by_hand(tp) -> None:
    """The indexer under its sparse KL loss (TileLang's streaming loss), per TP rank at
    s = 16384: its projections' weight gradients only (their inputs are detached), the indexer
    backward's three products over the top-k pairs (6·s·k·max(Hi, 16)·Di), the target's
    attention logits over the top-k keys on the rank's heads (2·s·H·576·k); kept: k's norm input
    and statistics, q, k, the fp32 weights and the block's indices (IndexerFunction), the logits'
    gradient (the KL kernel), the unfused RoPE's cos / sin for q and k (s·64 each), and with SP
    the gathered hidden state and q latent the projections read (at TP1 those are the layer's own
    input norm output and q latent, kept already)."""
    m = _model(dsa_indexer_loss_coeff=0.01, dsa_indexer_use_sparse_loss=True)
    st = _strategy(seq_len=16384, tp_size=tp, enable_sequence_parallel=tp > 1, world_size=8 * tp)
    ops = _ops(m, st)
    s, H, Hi, Di, k, h, q = 16384, 128 // tp, 64, 128, 2048, 7168, 1536
    for name, k_in, n in (("dsa.wq_b", q, Hi * Di), ("dsa.wk", h, Di), ("dsa.weights_proj", h, Hi)):
        assert _gemm_flops(ops[name].bwd_weight) == 2 * s * k_in * n and not _gemm_flops(ops[name].bwd_input)
    assert _gemm_flops(ops["dsa.scores"].bwd_input) == 6 * s * k * Hi * Di
    assert _gemm_flops(ops["dsa.loss"].fwd) == 2 * s * H * 576 * k
    assert ops["dsa.scores"].saved_bytes == (2 * s * Di + 8 * s + 2 * s * Hi * Di + 2 * s * Di + 4 * s * Hi + 4 * s * k
                                             + 4 * 2 * s * 64)
    assert ops["dsa.loss"].saved_bytes == 4 * s * k
    gathered = {n for name in ("dsa.wq_b", "dsa.wk") for n, _ in ops[name].saved}
    assert gathered == ({"L1.dsa.qr", "L1.dsa.x"} if tp > 1 else {"L1.q_norm.out", "L1.attn_norm.out"})
    assert any(isinstance(c, Collective) and c.op == "all_reduce" for c in ops["dsa.loss"].fwd) == (tp > 1)
    # the loss makes the step slower and keeps more; layers sharing a top-k run no loss
    plain = _model()
    shared = _ops(_model(dsa_indexer_loss_coeff=0.01, dsa_indexer_use_sparse_loss=True, dsa_indexer_topk_freq=2), st, layer=1)
    assert "dsa.loss" not in shared
    with_loss, without = (Estimate(mm, st, SYSTEM) for mm in (m, plain))
    assert with_loss.cost().duration_time_per_iter > without.cost().duration_time_per_iter
    assert with_loss.memory().peak_mem > without.memory().peak_mem


def test_indexer_loss_rules() -> None:
    """The loss's TileLang backward takes at most 64 indexer heads, a multiple of 8."""
    with pytest.raises(ConfigError, match="dsa_indexer_n_heads"):
        Estimate(_model(dsa_indexer_loss_coeff=0.01, dsa_indexer_use_sparse_loss=True, dsa_indexer_n_heads=96),
                 _strategy(), SYSTEM).cost()
    Estimate(_model(dsa_indexer_n_heads=96), _strategy(), SYSTEM).cost()  # without the loss: fine


def test_context_parallel_all_gather_by_hand() -> None:
    """CP 2 (DSAttention's all-gather scheme) at S = 16384: each rank's 8192 query rows (two
    load-balanced chunks) score the causal half of all S keys on average, so the indexer's and
    the sparse attention's FLOPs halve; the latent key [S, 576] and the indexer's k [S, 128] are
    all-gathered over CP (the key's gradient reduce-scattered back), and the rank keeps the
    gathered key for SparseMLA's backward."""
    S = 16384
    one, two = (_ops(_model(), _strategy(seq_len=S, cp_size=cp, cp_comm_type="all_gather", world_size=8 * cp))
                for cp in (1, 2))
    assert _gemm_flops(two["dsa.scores"].fwd) == 2 * 64 * 128 * (S // 2) * ((S + 1) // 2)
    assert _gemm_flops(two["dsa.scores"].fwd) * 2 == _gemm_flops(one["dsa.scores"].fwd)
    assert sum(k.flops for k in two["sparse_attn"].fwd) * 2 == sum(k.flops for k in one["sparse_attn"].fwd)
    gathers = sorted(c.bytes for o in ("dsa.scores", "sparse_attn") for c in two[o].fwd
                     if isinstance(c, Collective) and c.group == "cp" and c.bytes > 64)
    assert gathers == [2.0 * S * 128, 2.0 * S * 576]
    assert [c.op for c in two["sparse_attn"].bwd_input if isinstance(c, Collective)] == ["reduce_scatter"]
    assert ("L1.sparse_attn.kv_gathered", 2.0 * S * 576) in two["sparse_attn"].saved
    Estimate(_model(dsa_indexer_loss_coeff=0.01, dsa_indexer_use_sparse_loss=True),
             _strategy(seq_len=S, cp_size=2, cp_comm_type="all_gather", world_size=16), SYSTEM).cost()


@settings(max_examples=60, deadline=None)
@given(tp=hs.sampled_from([1, 2, 4, 8]), cp=hs.sampled_from([1, 2]), pp=hs.sampled_from([1, 2]),
       freq=hs.sampled_from([1, 2]), loss=hs.booleans(), fp8=hs.booleans(), mbs=hs.sampled_from([1, 2]),
       rec=hs.sampled_from(["none", "full", "core_attn", "mla_up_proj", "attn_only", "layernorm"]), overlap=hs.booleans(),
       te=hs.sampled_from([None, "2.6.0"]))
def test_dsa_estimates_hold_their_invariants(tp, cp, pp, freq, loss, fp8, mbs, rec, overlap, te) -> None:
    """Any valid DSA strategy: the breakdown sums to the iteration time (with every overlap
    option), the 80 % band holds the point estimate, the same configs give the same numbers;
    an invalid one is a ConfigError, never another exception."""
    recompute = {"none": {}, "full": {"enable_recompute": True, "recompute_granularity": "full_block", "recompute_layer_num": 1},
                 "attn_only": {"enable_recompute": True, "recompute_granularity": "attn_only", "recompute_layer_num": 1}}.get(
        rec, {"megatron_recompute": True, "megatron_recompute_modules": [rec]})
    m = _model(dsa_indexer_topk_freq=freq, dsa_indexer_loss_coeff=0.01 if loss else None, dsa_indexer_use_sparse_loss=loss)
    fields = dict(tp_size=tp, cp_size=cp, cp_comm_type="all_gather", pp_size=pp, enable_sequence_parallel=tp > 1,
                  world_size=8 * tp * cp * pp, micro_batch_size=mbs, fp8=fp8, overlap_grad_reduce=overlap, te_version=te,
                  fp8_recipe="blockwise" if fp8 else "delayed",
                  overlap_param_gather=overlap, tp_comm_overlap=overlap and tp > 1, **recompute)
    try:
        st = _strategy(**fields)
        runs = [Estimate(m, st, SYSTEM) for _ in range(2)]
        costs = [e.cost() for e in runs]
    except ConfigError:
        return
    c = costs[0]
    assert sum(c.breakdown.values()) == pytest.approx(c.duration_time_per_iter, rel=1e-9)
    low, high = c.duration_time_interval
    assert low <= c.duration_time_per_iter <= high
    assert costs[1].duration_time_per_iter == c.duration_time_per_iter
    assert runs[0].memory().peak_mem == runs[1].memory().peak_mem > 0


def test_packed_documents_bound_the_indexer_scores() -> None:
    """THD (packed documents, no CP): the indexer kernel scores each row against the causal part
    of its own document (its per-row bounds), 2·Hi·Di·Σ l(l+1)/2; its logits and top-k still
    span the sequence, and SparseMLA still runs every top-k slot (the rest masked -1)."""
    docs = [8192, 4096, 4096]
    s = sum(docs)
    ops = _ops(_model(), _strategy(seq_len=s, document_lengths=docs))
    pairs = sum(l * (l + 1) // 2 for l in docs)
    assert _gemm_flops(ops["dsa.scores"].fwd) == 2 * 64 * 128 * s * (pairs // s)
    plain = _ops(_model(), _strategy(seq_len=s))
    assert sum(k.flops for k in ops["sparse_attn"].fwd) == sum(k.flops for k in plain["sparse_attn"].fwd)
    with pytest.raises(ConfigError, match="document_lengths"):
        Estimate(_model(), _strategy(seq_len=s, document_lengths=docs, cp_size=2, cp_comm_type="all_gather",
                                     world_size=16), SYSTEM).cost()


def test_topk_reads_the_logits_five_times() -> None:
    """torch.topk over the indexer's fp32 logits [s, s] as PyTorch's multi-block radix select runs
    it: four counting passes (one per 8-bit digit) and the gather, then the values (fp32) and
    indices (int64) of the top-k written; the kernel's logits themselves are written once (its
    causal part, clean_logits the rest)."""
    s, k = 4096, 2048
    topk = _ops(_model(), _strategy(seq_len=s))["dsa.topk"]
    assert next(x for x in topk.fwd if x.name == "dsa.topk").bytes == 5 * 4 * s * s + s * k * (4 + 8)
    scores = _ops(_model(), _strategy(seq_len=s))["dsa.scores"]
    assert sum(x.bytes for x in scores.fwd
               if isinstance(x, MemBound) and x.name in ("dsa.logits_write", "dsa.clean_logits")) == 4 * s * s


def test_index_sharing_with_mtp_follows_megatrons_depth_numbering() -> None:
    """MultiTokenPredictionLayer numbers its inner layer by depth (1, 2, ...): with sharing every
    other layer, depth 1 runs its own indexer (DeepSeek-V3.2's one MTP layer), depth 2 would
    reuse a top-k it has none of (refused)."""
    m = _model(mtp_num_layers=1, dsa_indexer_topk_freq=2)
    assert m.dsa_computes_topk(m.layer_num)
    Estimate(m, _strategy(), SYSTEM).cost()
    with pytest.raises(ConfigError, match="MTP depth 2"):
        _model(mtp_num_layers=2, dsa_indexer_topk_freq=2)
