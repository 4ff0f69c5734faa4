"""Pipeline layouts (issue 22 part 1): Megatron's layout string, the embedding / loss
counted in the split, and their flags, against Megatron's semantics by hand."""

from __future__ import annotations

import pytest

from simumax.config.checks import stage_layer_counts, vstage_layer_counts
from simumax.config.layout import expand, parse_layout
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags
from simumax.importers.megatron_args import parse_megatron_args


def test_layout_strings_expand_as_megatron_writes_them() -> None:
    # DeepSeek-V3 on PP16 (Megatron-Core's MoE model zoo): 3 layers with the embedding,
    # 14 stages of 4, then 2 layers, the MTP layer and the loss
    stages = expand("Et*3|(tttt|)*14ttmL")
    assert stages == ["Ettt"] + ["tttt"] * 14 + ["ttmL"]
    assert parse_layout("Et*3|(tttt|)*14ttmL", 16, 61, mtp_layers=1) == [3] + [4] * 14 + [2]
    assert expand("E|((tt|)*2)*2L") == ["E", "tt", "tt", "tt", "tt", "L"]  # nested groups; embedding- and loss-only stages
    assert expand(" E t | t L ") == ["Et", "tL"]  # spaces are ignored
    # Megatron's own example (pipeline_parallel_layer_layout.py, parse_str_to_list): commas
    # are cosmetic, and a trailing separator opens an empty stage as its split does
    assert expand("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert expand("E(tt|)*2") == ["Ett", "tt", ""]


@pytest.mark.parametrize("layout", ["Et*3|(tttt|)*14ttmL", "Ettt|(tt|)*29,m|L", "E|t*3|(ttt|)*2,ttL", "Et*8|m||L",
                                    "E(tt|)*2", "Ett|tt,|tt|ttL"])
def test_layout_stages_as_megatron_parses_them(layout: str) -> None:
    """The same virtual stages as Megatron-Core's own parser on every layout it accepts."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    letter = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    theirs = ["".join(letter[x.name] for x in stage) for stage in PipelineParallelLayerLayout.parse_str_to_list(layout)]
    assert expand(layout) == theirs


@pytest.mark.parametrize("layout, rule", [
    ("Ett|ttL|t", "3 stages"),  # wrong stage count
    ("tEt|tL", "embedding"),
    ("Ett|tLt", "loss"),
    ("Ett|tL", "3 transformer layers"),
    ("Ettx|tL", "unexpected"),
])
def test_layout_errors_name_the_rule(layout: str, rule: str) -> None:
    with pytest.raises(ConfigError, match=rule):
        parse_layout(layout, 2, 4)


def _counts(model: str, layers: int, **st) -> tuple[list[int], list[int]]:
    m = load_model(model).with_updates({"layer_num": layers})
    s = load_strategy({"seq_len": 4096, "micro_batch_num": 16, **st})
    return vstage_layer_counts(m, s), stage_layer_counts(m, s)


def test_embedding_and_loss_in_the_split() -> None:
    """Llama 3.1 405B's 126 layers on PP8 x VP8: 126 + 2 = 128 = 64 x 2, the first virtual
    stage one layer (+ embedding), the last one layer (+ loss), every other 2 (Megatron's
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split)."""
    per_v, per_rank = _counts("llama3-8b", 126, world_size=64, pp_size=8, interleaving_size=8,
                              account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    assert per_v[0] == 1 and per_v[-1] == 1 and set(per_v[1:-1]) == {2} and sum(per_v) == 126
    assert per_rank == [15, 16, 16, 16, 16, 16, 16, 15]  # rank 0 holds vstage 0, rank 7 the last
    # only the embedding: 32 + 1 over 3 stages
    per_v, _ = _counts("llama3-8b", 32, world_size=3, pp_size=3, account_for_embedding_in_pipeline_split=True)
    assert per_v == [10, 11, 11]
    with pytest.raises(ConfigError, match="must split evenly"):
        _counts("llama3-8b", 32, world_size=4, pp_size=4, account_for_embedding_in_pipeline_split=True)
    with pytest.raises(ConfigError, match="cannot be combined"):
        _counts("llama3-8b", 32, world_size=4, pp_size=4, account_for_loss_in_pipeline_split=True, num_layers_in_first_pipeline_stage=7)


def test_layout_drives_the_estimate() -> None:
    """An embedding-only first stage holds no transformer layer: its forward is the
    lookup's; the two 3-layer stages cost the same; the last holds 2 layers and the head."""
    m = load_model("llama3-8b").with_updates({"layer_num": 8})
    st = load_strategy({"seq_len": 4096, "micro_batch_num": 8, "world_size": 4, "pp_size": 4,
                        "pipeline_model_parallel_layout": "E|ttt|ttt|ttL"})
    est = Estimate(m, st, load_system("a100_pcie"))
    assert [len(s.layers) for s in est.stages] == [0, 3, 3, 2]
    times = est.rank_pass_times()
    assert times[0][0] < times[1][0] / 10 and times[1] == pytest.approx(times[2])
    assert est.memory().stages[0].params == est.stages[0].params
    with pytest.raises(ConfigError, match="MTP layers"):
        Estimate(m, st.with_updates({"pipeline_model_parallel_layout": "E|ttt|ttt|ttmL"}), load_system("a100_pcie")).stages
    with pytest.raises(ConfigError, match="layout states every stage"):
        load_strategy({**st.to_dict(), "num_layers_in_first_pipeline_stage": 1}) and Estimate(
            m, st.with_updates({"num_layers_in_first_pipeline_stage": 1}), load_system("a100_pcie")).stages


def test_layout_flags_round_trip() -> None:
    args = ("--num-layers 8 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 --vocab-size 32000 "
            "--seq-length 4096 --micro-batch-size 1 --pipeline-model-parallel-size 4 "
            "--pipeline-model-parallel-layout 'E|ttt|ttt|ttL'")
    model, st, _ = parse_megatron_args(args)
    assert st.pipeline_model_parallel_layout == "E|ttt|ttt|ttL"
    flags = " ".join(megatron_flags(st, model))
    assert "--pipeline-model-parallel-layout 'E|ttt|ttt|ttL'" in flags
    model2, st2, _ = parse_megatron_args(flags + " --num-layers 8 --hidden-size 4096 --num-attention-heads 32 "
                                         "--ffn-hidden-size 11008 --vocab-size 32000")
    assert st2.pipeline_model_parallel_layout == st.pipeline_model_parallel_layout
    _, acc, _ = parse_megatron_args(args.replace("--pipeline-model-parallel-layout 'E|ttt|ttt|ttL'", "")
                                    + " --num-layers 10 --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split")
    assert acc.account_for_embedding_in_pipeline_split and acc.account_for_loss_in_pipeline_split
    assert "--account-for-loss-in-pipeline-split" in " ".join(megatron_flags(acc))


def test_blackwell_ultra_and_pcie_hopper_presets() -> None:
    """Issue 22 part 5: the added presets load, estimate, and carry their datasheet rows."""
    from simumax.config.hardware import datasheet

    m = load_model("llama3-8b").with_updates({"layer_num": 2})
    st = load_strategy({"seq_len": 4096, "world_size": 8, "tp_size": 2, "enable_sequence_parallel": True})
    times = {}
    for name in ("b300-sxm-288gb", "gb300-nvl72", "h100-pcie-80gb", "h100-nvl-94gb", "h200-nvl-141gb"):
        sy = load_system(name)
        times[name] = Estimate(m, st, sy).cost().duration_time_per_iter
    assert load_system("gb300-nvl72").num_per_node == 72 and load_system("b300-sxm-288gb").mem_bytes == 288 * 2**30
    assert datasheet("NVIDIA GB300").bf16_tflops == 2500.0 and datasheet("NVIDIA H100 NVL").hbm_gbps == 3900.0
    assert datasheet("NVIDIA H100 PCIe").bf16_tflops == 756.0  # the more specific name wins over "H100"
    # PCIe between the cards: TP2 costs more than on the SXM board with the same compute tables
    assert times["h100-pcie-80gb"] > times["h100-nvl-94gb"] > times["b300-sxm-288gb"]


def test_search_proposes_the_embedding_and_loss_in_the_split() -> None:
    """Where the layers alone do not divide over p x v virtual stages but with the
    embedding and the loss counted they do, the search proposes Megatron's accounting:
    Llama 3.1 405B's 126 layers on PP8 x VP8 (the production layout)."""
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace, accounting_layouts

    assert accounting_layouts(126, 8, 8) == [("E", "L")] and accounting_layouts(128, 8, 8) == []
    assert accounting_layouts(33, 2, 1) == [("E", ""), ("", "L")]
    m = load_model("llama3.1-405b")
    space = SearchSpace(world_size=8192, global_batch_size=2048, tp=(8,), pp=(8,), vp=(8,), cp=(1,), mbs=(1,),
                        recompute=("none",), zero=(1,))
    rows = run_search(m, load_system("gb200-nvl72"), load_strategy({"seq_len": 8192, "world_size": 8192}), space)
    assert [r.label for r in rows] == ["tp8 pp8[E+L] vp8 dp128 ep1 cp1 mbs1 mbc16 zero1 none"]
    assert rows[0].strategy["account_for_loss_in_pipeline_split"] and rows[0].pipeline_split == "E+L"


def test_uneven_first_last_stages_with_virtual_pipelining() -> None:
    """Megatron's uneven first / last stages with VPP: each rank's layers split evenly over
    its chunks, so the first and last ranks' chunks are smaller than the middle ones'."""
    per_v, per_rank = _counts("llama3-8b", 32, world_size=4, pp_size=4, interleaving_size=2,
                              num_layers_in_first_pipeline_stage=6, num_layers_in_last_pipeline_stage=6)
    assert per_rank == [6, 10, 10, 6] and per_v == [3, 5, 5, 3, 3, 5, 5, 3]


def test_standalone_mtp_stage() -> None:
    """A layout may put the MTP layers on a stage of their own before the loss's (megatron-core
    pipeline_parallel_layer_layout: after every decoder layer, in the last virtual stage of
    their rank): that stage runs each depth's embedding copy, norms, projection and layer; the
    loss's stage runs each depth's final norm, output head and loss, so from the MTP stage on
    each depth's hidden state travels with the main one; the word-embedding gradient is
    all-reduced between the first stage and the MTP stage."""
    m = load_model("deepseek-v3-mtp").with_updates({"layer_num": 8, "dense_layers": 1})
    base = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"pp_size": 4, "world_size": 32, "seq_len": 4096,
                                                           "micro_batch_num": 8})
    sy = load_system("h100-sxm-80gb")
    est = Estimate(m, base.with_updates({"pipeline_model_parallel_layout": "Et*2|ttt|tttm|L"}), sy)
    mtp = [[o.name for o in c.ops if o.name.startswith("mtp0.")] for c in est.chunks]
    assert not mtp[0] and not mtp[1]
    assert mtp[2][0] == "mtp0.embedding" and "mtp0.final_norm" not in mtp[2]
    assert mtp[3] == ["mtp0.final_norm", "mtp0.lm_head", "mtp0.loss"]
    p2p = [c.p2p_bytes for c in est.chunks]
    assert p2p[2] == 2 * p2p[1] and p2p[3] == 0
    sync = est.embedding_grad_sync
    assert sync[0] == sync[2] > 0 and sync[1] == sync[3] == 0
    together = Estimate(m, base.with_updates({"pipeline_model_parallel_layout": "Et*2|tt|tt|ttmL"}), sy)
    assert together.embedding_grad_sync[3] > 0 and together.chunks[3].p2p_bytes == 0
    with pytest.raises(ConfigError, match="decoder layers"):
        Estimate(m, base.with_updates({"pipeline_model_parallel_layout": "Et*2|tt|ttm|ttL"}), sy).stages
    alone = Estimate(m, base.with_updates({"pipeline_model_parallel_layout": "Et*7|t|m|L"}), sy)  # the MTP stage alone
    assert [len(c.layers) for c in alone.chunks] == [7, 1, 0, 0] and alone.cost().duration_time_per_iter > 0
    vpp = base.with_updates({"pp_size": 2, "world_size": 16, "interleaving_size": 2,
                             "pipeline_model_parallel_layout": "Et*8|m||L"})
    with pytest.raises(ConfigError, match="last virtual stage of their pipeline rank"):
        Estimate(m, vpp, sy).stages
