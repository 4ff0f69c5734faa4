"""simumax in the browser: pick or upload configs, edit the strategy, see time / MFU /
memory and the plots, run a small search, download the results.

Run with ``simumax app`` (or ``streamlit run`` on this file). Everything shown comes from
the same PerfLLM / search calls as the CLI.
"""

from __future__ import annotations

import json

import streamlit as st

from simumax.api import PerfLLM
from simumax.config.loader import list_presets, load_model, load_strategy, load_system
from simumax.config.megatron_rules import fsdp_impl_fields
from simumax.config.model import ModelConfig
from simumax.config.strategy import FSDP_IMPLS, StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.importers.hf import model_from_hf
from simumax.report import format as fmt
from simumax.report.format import GIB

RECOMPUTE = ("none", "selective", "full_block")


def _pick(kind: str, default: str, cls):
    """A preset by name, or an uploaded JSON file of that kind."""
    names = list_presets(kind)
    name = st.sidebar.selectbox(f"{kind} preset", names, index=names.index(default), key=f"{kind}_preset")
    label = f"or upload a {kind} JSON" + (" (or a Hugging Face config.json)" if kind == "model" else "")
    upload = st.sidebar.file_uploader(label, type="json", key=f"{kind}_upload")
    if upload is not None:
        data = json.loads(upload.getvalue())
        if kind == "model" and isinstance(data, dict) and "architectures" in data:
            # a Hugging Face config.json, read as `simumax import hf` reads it, its notes shown
            model, notes = model_from_hf(data, upload.name.removesuffix(".json"), upload.name)
            for note in notes:
                st.sidebar.caption(f"note: {note}")
            return model
        return cls.init_from_dict(data, source=upload.name)
    return {"model": load_model, "strategy": load_strategy, "system": load_system}[kind](name)


def _edit_strategy(base: StrategyConfig, model: ModelConfig) -> StrategyConfig:
    """The strategy as the sidebar sets it. The job's size (GPUs) stays as set when TP / PP
    / CP change: DP is what divides it (a size that does not divide is an error)."""
    st.sidebar.markdown("**strategy**")
    world = st.sidebar.number_input("GPUs (world size)", 1, 1 << 20, base.world_size, key="world")
    c1, c2 = st.sidebar.columns(2)
    tp = c1.number_input("TP", 1, 64, base.tp_size, key="tp")
    pp = c2.number_input("PP", 1, 256, base.pp_size, key="pp")
    cp = c1.number_input("CP", 1, 64, base.cp_size, key="cp")
    vp = c2.number_input("VP (chunks per rank)", 1, 64, base.interleaving_size, key="vp")
    ep = c1.number_input("EP", 1, 1024, base.ep_size, key="ep")
    etp = c2.number_input("ETP", 1, 64, base.etp_size, key="etp")
    mbs = c1.number_input("micro-batch", 1, 64, base.micro_batch_size, key="mbs")
    mbc = c2.number_input("micro-batches", 1, 1 << 16, base.micro_batch_num, key="mbc")
    first = c1.number_input("layers, first stage (0: even)", 0, 1024, base.num_layers_in_first_pipeline_stage or 0, key="first")
    last = c2.number_input("layers, last stage (0: even)", 0, 1024, base.num_layers_in_last_pipeline_stage or 0, key="last")
    seq = st.sidebar.number_input("sequence length", 128, 1 << 20, base.seq_len, step=1024, key="seq")
    given = base.document_lengths
    doc = st.sidebar.number_input("document length (0: one document per sequence)", 0, 1 << 20,
                                  given if isinstance(given, int) else 0, step=512, key="doc",
                                  help="documents packed into each sequence, attention within each (Megatron "
                                       "--dataloader-inter-document-masking)")
    rec = st.sidebar.selectbox("recompute", RECOMPUTE, index=RECOMPUTE.index(_recompute_of(base)), key="recompute")
    zero = st.sidebar.selectbox("ZeRO", (0, 1, 2, 3), index=base.zero_state, key="zero")
    impl = st.sidebar.selectbox("sharded DP implementation (ZeRO >= 1)", FSDP_IMPLS, index=FSDP_IMPLS.index(base.fsdp_impl),
                                key="fsdp_impl")
    if world % (tp * pp * cp):
        raise ConfigError("world_size", f"{world} GPUs do not divide into TP x PP x CP = {tp * pp * cp}")
    st.sidebar.caption(f"DP = {world // (tp * pp * cp)}, global batch = {mbs * mbc * (world // (tp * pp * cp))} sequences")
    upd = {"tp_size": int(tp), "pp_size": int(pp), "cp_size": int(cp), "ep_size": int(ep), "etp_size": int(etp),
           "world_size": int(world), "micro_batch_size": int(mbs), "micro_batch_num": int(mbc), "seq_len": int(seq),
           "zero_state": int(zero), "fsdp_impl": impl, "interleaving_size": int(vp) if pp > 1 else 1,
           "enable_sequence_parallel": tp > 1,
           "num_layers_in_first_pipeline_stage": int(first) or None, "num_layers_in_last_pipeline_stage": int(last) or None,
           # a file's list of lengths stays while its sequence does
           "document_lengths": int(doc) or (given if isinstance(given, list) and int(seq) == base.seq_len else None)}
    upd.update(fsdp_impl_fields(impl))
    if upd["interleaving_size"] == 1 and base.pp_schedule == "interleaved":
        upd["pp_schedule"] = None
    if rec == "none":
        upd.update(enable_recompute=False)
    elif rec == "selective":
        upd.update(enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True, recompute_layer_num=None)
    else:
        upd.update(enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=None)
    return base.with_updates(upd, source="app")


def _plain(text: str) -> str:
    """Text shown as it is (Streamlit reads messages as markdown: ``ep*etp`` would turn
    into emphasis)."""
    return "".join("\\" + ch if ch in "\\`*_{}[]()#+-.!|<>~$" else ch for ch in text)


def _recompute_of(s: StrategyConfig) -> str:
    mode = s.recompute_mode  # Megatron's module list shows as selective
    return mode if mode in RECOMPUTE else "selective"


def main() -> None:
    st.set_page_config(page_title="simumax", layout="wide")
    st.title("simumax: LLM training time and memory")
    try:
        model: ModelConfig = _pick("model", "llama3-8b", ModelConfig)
        base: StrategyConfig = _pick("strategy", "tp1_pp2_dp4_mbs1", StrategyConfig)
        system: SystemConfig = _pick("system", "a100_pcie", SystemConfig)
        strategy = _edit_strategy(base, model)
        perf = PerfLLM().configure(strategy_config=strategy, model_config=model, system_config=system)
        cost, mem = perf.analysis_cost(), perf.analysis_mem()
    except ConfigError as exc:
        st.error(_plain(f"error: {exc}"))
        return
    st.caption(fmt.run_title(model.model_name, system.sys_name, strategy))
    oom = fmt.out_of_memory(mem)
    if oom:
        st.warning(oom)
    cols = st.columns(5)
    cols[0].metric("iteration time (ms)", f"{cost.duration_time_per_iter * 1e3:.1f}")
    cols[1].metric("MFU", f"{cost.mfu:.1%}")
    cols[2].metric("tokens/s per GPU", f"{cost.throughput_per_accelerator:.0f}")
    cols[3].metric("peak allocated (GiB)", f"{mem.peak_mem / GIB:.2f}")
    cols[4].metric("fits in memory", "yes" if mem.fits else "no")
    if cost.duration_time_interval:  # the 80 % band (simumax/uncertainty.py)
        lo, hi = cost.duration_time_interval
        st.caption(f"iteration time, 80 % band: {lo * 1e3:.1f}–{hi * 1e3:.1f} ms")
    for note in (fmt.host_issue_note(cost, system.host_op_us), fmt.approximate_note(cost, model.moe_load_imbalance)):
        if note:
            st.info(note)

    from simumax.report.breakdown_plots import memory_figure, time_figure
    from simumax.report.figure import png_bytes

    left, right = st.columns(2)
    left.image(png_bytes(memory_figure(mem)))
    right.image(png_bytes(time_figure(cost)))
    st.download_button("download results (JSON)", json.dumps({"cost": cost.to_dict(), "mem": mem.to_dict()}, indent=2, sort_keys=True),
                       file_name="simumax_result.json", mime="application/json", key="dl_result")
    st.download_button("download strategy (JSON)", json.dumps(strategy.to_dict(), indent=2), file_name="strategy.json",
                       mime="application/json", key="dl_strategy")
    _what_if(perf, fmt.run_title(model.model_name, system.sys_name, strategy))
    _search(model, strategy, system)


def _what_if(perf: PerfLLM, title: str) -> None:
    """The iteration time with each hardware resource made better in turn (simumax what-if)."""
    from simumax.report.figure import png_bytes
    from simumax.report.what_if import figure as what_if_figure

    with st.expander("what if the hardware were better"):
        factor = st.number_input("each resource in turn x", 1.1, 10.0, 1.5, 0.1, key="whatif_factor")
        st.image(png_bytes(what_if_figure(perf.what_if(float(factor)), title)))


def _search(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig) -> None:
    st.subheader("strategy search")
    st.caption("Each list defaults to the strategy above; the search tries every combination that divides the job.")
    c1, c2, c3 = st.columns(3)
    world = c1.number_input("GPUs", 1, 1 << 20, strategy.world_size, key="search_world")
    gbs = c2.number_input("global batch (sequences)", 1, 1 << 24, strategy.global_batch_size, key="search_gbs")
    tps = c3.text_input("TP sizes", "1,2,4,8", key="search_tp")
    lists = {
        "EP sizes": ("search_ep", strategy.ep_size), "ETP sizes": ("search_etp", strategy.etp_size),
        "VP sizes": ("search_vp", strategy.interleaving_size), "CP sizes": ("search_cp", strategy.cp_size),
        "micro-batch sizes": ("search_mbs", strategy.micro_batch_size), "ZeRO levels": ("search_zero", strategy.zero_state),
    }
    cols = st.columns(len(lists))
    texts = {label: col.text_input(label, str(default), key=key) for col, (label, (key, default)) in zip(cols, lists.items())}
    from simumax.search.space import OFFLOAD_VARIANTS

    offload = st.multiselect("host offload (optimizer states, activations) to try", list(OFFLOAD_VARIANTS), default=["none"],
                             key="search_offload")
    if not st.button("run search", key="run_search"):
        return
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    try:
        ints = {label: _ints(label, text) for label, text in [("TP sizes", tps), *texts.items()]}
        space = SearchSpace(world_size=int(world), global_batch_size=int(gbs), tp=ints["TP sizes"], pp=None,
                            vp=ints["VP sizes"], ep=ints["EP sizes"], etp=ints["ETP sizes"], cp=ints["CP sizes"],
                            mbs=ints["micro-batch sizes"], recompute=RECOMPUTE, zero=ints["ZeRO levels"], schedule=(None,),
                            offload=tuple(offload))
        rows = run_search(model, system, strategy, space)
    except (ConfigError, ValueError) as exc:
        st.error(_plain(f"error: {exc}"))
        return
    fit = [r for r in rows if r.fits]
    st.write(f"{len(fit)} of {len(rows)} strategies fit")
    table = [{"strategy": r.label, "iter ms": round(r.iter_time * 1e3, 1), "MFU": f"{r.mfu or 0.0:.1%}",
              "tokens/s/GPU": round(r.tokens_per_s_per_gpu or 0.0), "peak GiB": round(r.peak_mem / GIB, 2)} for r in fit[:20]]
    st.dataframe(table, key="search_table")
    from simumax.search.table import search_csv

    # the CLI's search.csv columns (SI units), every row with its fits flag
    st.download_button("download search (CSV)", search_csv(rows), file_name="search.csv", mime="text/csv", key="dl_search")



def _ints(label: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(label, f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise ConfigError(label, "needs at least one value")
    return values


main()
