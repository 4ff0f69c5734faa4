"""Documents packed into a sequence (``document_lengths``: Megatron's
--dataloader-inter-document-masking / --sft, TransformerEngine's THD attention over
cu_seqlens): attention stays inside each document, everything else sees the same tokens."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.kernels import Attention, Collective

CP_SCHEMES = [
    (1, "p2p", {}),
    (2, "p2p", {}),
    (2, "a2a", {}),
    (4, "all_gather", {}),
    (4, "a2a+p2p", {"hierarchical_context_parallel_sizes": [2, 2]}),
]


def _estimate(model: str, **fields) -> Estimate:
    m = load_model(model).with_updates({"layer_num": 2})
    return Estimate(m, load_strategy("tp1_pp1_dp8_mbs1").with_updates(fields), load_system("h100-sxm-80gb"))


@pytest.mark.parametrize("model", ["llama3.1-8b", "deepseek-v2-lite", "gpt-oss-20b"])
@pytest.mark.parametrize("cp,scheme,extra", CP_SCHEMES)
def test_packed_documents_cost_a_batch_of_them(model, cp, scheme, extra) -> None:
    """k documents of length L packed into one sequence of k·L cost what a micro-batch of k
    sequences of L does, time, memory and FLOPs alike, under every CP scheme (TE splits each
    document into 2·cp chunks as it splits each sequence): the linears see the same tokens
    and attention the same (batch, length) blocks. Dense GQA, MLA + MoE, and GPT-OSS's
    sliding-window layers and sinks (its CP: a2a only, as TransformerEngine)."""
    if model == "gpt-oss-20b" and cp > 1 and scheme != "a2a":
        pytest.skip("TransformerEngine runs sliding windows and sinks with CP a2a only")
    job = dict(cp_size=cp, world_size=8 * cp, cp_comm_type=scheme, **extra)
    packed = _estimate(model, seq_len=8192, micro_batch_size=1, document_lengths=[2048] * 4, **job)
    batch = _estimate(model, seq_len=2048, micro_batch_size=4, **job)
    t_packed, t_batch = packed.cost(band=False).duration_time_per_iter, batch.cost(band=False).duration_time_per_iter
    assert t_packed == pytest.approx(t_batch, rel=1e-7)
    # but for seq_aux_loss's tokens per expert, which Megatron counts per sequence (int64 [b, E]
    # kept for backward: router.router_saved): one packed sequence where the batch has four
    m, mem = packed.model, packed.memory()
    counts = 0.0
    if m.is_moe and m.moe_router_load_balancing_type == "seq_aux_loss":
        moe_layers = sum(m.is_moe_layer(i) for i in range(m.layer_num))
        counts = moe_layers * (4 - 1) * m.expert_num * 8 * mem.stages[0].in_flight_micro_batches
    assert batch.memory().peak_mem - mem.peak_mem == pytest.approx(counts, abs=1e-3)
    assert packed.model_flops_per_iter() == pytest.approx(batch.model_flops_per_iter(), rel=1e-12)
    # one length for all: the same documents
    same = _estimate(model, seq_len=8192, micro_batch_size=1, document_lengths=2048, **job)
    assert same.cost(band=False).duration_time_per_iter == t_packed


@pytest.mark.parametrize("cp,scheme,extra", CP_SCHEMES)
def test_one_document_is_no_packing(cp, scheme, extra) -> None:
    """A sequence that is one document is the unpacked estimate, to the bit; packing several
    is faster (less attention) and uses no more memory."""
    job = dict(seq_len=8192, cp_size=cp, world_size=8 * cp, cp_comm_type=scheme, **extra)
    plain = _estimate("llama3.1-8b", **job)
    for whole in (8192, [8192]):
        one = _estimate("llama3.1-8b", document_lengths=whole, **job)
        assert one.cost(band=False).duration_time_per_iter == plain.cost(band=False).duration_time_per_iter
        assert one.memory().peak_mem == plain.memory().peak_mem
    mixed = _estimate("llama3.1-8b", document_lengths=[4096, 2048, 1024, 1024], **job)
    assert mixed.cost(band=False).duration_time_per_iter < plain.cost(band=False).duration_time_per_iter
    assert mixed.memory().peak_mem <= plain.memory().peak_mem


def test_document_attention_flops_by_hand() -> None:
    """Causal attention within documents of lengths l_i: each forward kernel does
    2 · heads · l(l+1)/2 · (qk + v head dims) FLOPs per document (QK^T and PV over the
    causal triangle), the lengths as given (a single length L: seq_len // L documents of L
    and one of the rest); backward twice that."""
    e = _estimate("llama3.1-8b", seq_len=8192, document_lengths=3000)
    assert e.strategy.document_groups == ((3000, 2), (2192, 1))
    m = e.model
    heads, d = m.head_num, m.head_size
    by_hand = sum(n * 2 * heads * length * (length + 1) / 2 * (d + d) for length, n in ((3000, 2), (2192, 1)))
    attn = next(o for o in e.chunks[0].ops if o.module == "core_attn")
    fwd = [k for k in attn.fwd if isinstance(k, Attention)]
    assert {(k.batch, k.seq_len) for k in fwd} == {(2, 3000), (1, 2192)}
    assert sum(k.flops for k in fwd) == pytest.approx(by_hand, rel=1e-12)
    assert sum(k.flops for k in attn.bwd_input if isinstance(k, Attention)) == pytest.approx(2 * by_hand, rel=1e-12)


def test_ring_steps_attend_every_document_and_hide_the_next_send() -> None:
    """With the p2p ring each step runs one kernel per document length (cp steps of them,
    the later ones non-causal on half of each document's local chunks), and the KV send of a
    step hides under all of the step before it, not its last kernel alone: packed documents
    expose no more ring transfer than the same tokens as a batch of sequences."""
    job = dict(cp_size=4, world_size=32, cp_comm_type="p2p")
    packed = _estimate("llama3.1-8b", seq_len=8192, document_lengths=[4096, 2048, 2048], **job)
    attn = next(o for o in packed.chunks[0].ops if o.module == "core_attn")
    fwd = [k for k in attn.fwd if isinstance(k, Attention)]
    assert len(fwd) == 2 * 4  # two lengths, four steps
    assert [(k.seq_len, k.kv_seq_len, k.causal) for k in fwd[:2]] == [(1024, None, True), (512, None, True)]
    assert [(k.seq_len, k.kv_seq_len, k.causal) for k in fwd[2:4]] == [(1024, 512, False), (512, 256, False)]
    # exposed forward ring time: each of the cp - 1 sends less the whole step before it
    coster = packed.layer_profiles.coster
    send = next(k for k in attn.fwd if isinstance(k, Collective) and k.group == "cp")
    steps = [sum(coster.kernel(k) for k in fwd[i:i + 2]) for i in range(0, 6, 2)]
    by_hand = sum(max(0.0, coster.kernel(send) - step) for step in steps)
    assert by_hand < coster.kernel(send) * 3  # some of it hides
    assert packed.layer_profiles.op_time(attn)["fwd"].comm.get("cp", 0.0) == pytest.approx(by_hand, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("fields,rule", [
    ({"document_lengths": [4096, 2048]}, "must sum to seq_len 8192"),
    ({"document_lengths": 9000}, "longer than seq_len"),
    ({"document_lengths": 2048, "use_math_sdp": True, "use_flash_sdp": False}, "fused attention"),
    ({"document_lengths": 2048, "transformer_impl": "local"}, "fused attention"),
    ({"document_lengths": [4094, 4098], "cp_size": 2, "world_size": 16}, "2*cp = 4"),
])
def test_document_rules(fields, rule) -> None:
    with pytest.raises(ConfigError) as exc:
        load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 8192, **fields})
    assert exc.value.field == "document_lengths" and rule in exc.value.rule


def test_bad_document_length_names_the_element() -> None:
    """A union field's error names the member the value's shape picked (the list's element),
    not pydantic's union tags."""
    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 8192})
    for value, field in ((0, "document_lengths"), ([8192, 0], "document_lengths.1"), ("x", "document_lengths")):
        with pytest.raises(ConfigError) as exc:
            st.with_updates({"document_lengths": value})
        assert exc.value.field == field


def test_documents_in_megatron_flags_and_titles() -> None:
    """Export says --dataloader-inter-document-masking; import reads it (and --sft) with a
    note that the lengths are the data's; perf's title names the documents."""
    from simumax.export.megatron_flags import megatron_flags
    from simumax.importers.megatron_args import parse_megatron_args
    from simumax.report.format import run_title

    st = load_strategy("tp1_pp1_dp8_mbs1").with_updates({"seq_len": 8192, "document_lengths": 3000})
    assert "--dataloader-inter-document-masking" in megatron_flags(st)
    assert "--dataloader-inter-document-masking" not in megatron_flags(st.with_updates({"document_lengths": None}))
    assert run_title("m", "s", st).endswith("docs 2x3000+2192")
    args = ["--num-layers", "2", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "4096",
            "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16",
            "--vocab-size", "32000"]
    for flag in ("--dataloader-inter-document-masking", "--sft"):
        _, s, notes = parse_megatron_args([*args, flag], world_size=8)
        assert s.document_lengths is None
        assert any(n.startswith(flag) and "document_lengths" in n for n in notes)
    _, s, notes = parse_megatron_args([*args, "--reset-attention-mask"], world_size=8)
    assert s.document_lengths is None and any(n.startswith("--reset-attention-mask: no effect") for n in notes)


@pytest.mark.parametrize("cp,scheme,extra", CP_SCHEMES[:3])
def test_packed_documents_launch_one_attention_kernel_per_step(cp, scheme, extra) -> None:
    """TE's THD attention runs a step's documents in one varlen kernel: the host-issue count
    (Estimate.host_issue_seconds) is the unpacked one whatever the lengths."""
    job = dict(seq_len=8192, cp_size=cp, world_size=8 * cp, cp_comm_type=scheme, **extra)
    plain = _estimate("llama3.1-8b", **job)
    packed = _estimate("llama3.1-8b", document_lengths=[4096, 2048, 1024, 1024], **job)
    assert packed.host_issue_seconds(packed.stages[0]) == plain.host_issue_seconds(plain.stages[0])
