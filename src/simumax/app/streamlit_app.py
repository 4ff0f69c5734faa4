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
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.report import format as fmt
from simumax.report.format import GIB

RECOMPUTE = ("none", "selective", "full_block")


def _pick(kind: str, default: str, cls):
    """A preset by name, or an uploaded JSON file of that kind."""
    names = list_presets(kind)
    name = st.sidebar.selectbox(f"{kind} preset", names, index=names.index(default), key=f"{kind}_preset")
    upload = st.sidebar.file_uploader(f"or upload a {kind} JSON", type="json", key=f"{kind}_upload")
    if upload is not None:
        return cls.init_from_dict(json.loads(upload.getvalue()), source=upload.name)
    return {"model": load_model, "strategy": load_strategy, "system": load_system}[kind](name)


def _edit_strategy(base: StrategyConfig) -> StrategyConfig:
    st.sidebar.markdown("**strategy**")
    c1, c2 = st.sidebar.columns(2)
    tp = c1.number_input("TP", 1, 64, base.tp_size, key="tp")
    pp = c2.number_input("PP", 1, 64, base.pp_size, key="pp")
    dp = c1.number_input("DP", 1, 4096, base.dp_size, key="dp")
    ep = c2.number_input("EP", 1, 256, base.ep_size, key="ep")
    mbs = c1.number_input("micro-batch", 1, 64, base.micro_batch_size, key="mbs")
    mbc = c2.number_input("micro-batches", 1, 4096, base.micro_batch_num, key="mbc")
    seq = st.sidebar.number_input("sequence length", 128, 1 << 20, base.seq_len, step=1024, key="seq")
    rec = st.sidebar.selectbox("recompute", RECOMPUTE, index=RECOMPUTE.index(_recompute_of(base)), key="recompute")
    zero = st.sidebar.selectbox("ZeRO", (0, 1, 2, 3), index=base.zero_state, key="zero")
    upd = {"tp_size": int(tp), "pp_size": int(pp), "ep_size": int(ep), "world_size": int(tp * pp * base.cp_size * dp),
           "micro_batch_size": int(mbs), "micro_batch_num": int(mbc), "seq_len": int(seq), "zero_state": int(zero),
           "interleaving_size": base.interleaving_size if pp > 1 else 1}
    if rec == "none":
        upd.update(enable_recompute=False)
    elif rec == "selective":
        upd.update(enable_recompute=True, recompute_granularity="selective_recompute", attn_recompute=True, recompute_layer_num=None)
    else:
        upd.update(enable_recompute=True, recompute_granularity="full_block", recompute_layer_num=None)
    return base.with_updates(upd, source="app")


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
        strategy = _edit_strategy(base)
        perf = PerfLLM().configure(strategy_config=strategy, model_config=model, system_config=system)
        cost, mem = perf.analysis_cost(), perf.analysis_mem()
    except ConfigError as exc:
        st.error(f"error: {exc}")
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

    from simumax.report.breakdown_plots import memory_figure, time_figure
    from simumax.report.figure import png_bytes

    left, right = st.columns(2)
    left.image(png_bytes(memory_figure(mem)))
    right.image(png_bytes(time_figure(cost)))
    st.download_button("download results (JSON)", json.dumps({"cost": cost.to_dict(), "mem": mem.to_dict()}, indent=2, sort_keys=True),
                       file_name="simumax_result.json", mime="application/json", key="dl_result")
    st.download_button("download strategy (JSON)", json.dumps(strategy.to_dict(), indent=2), file_name="strategy.json",
                       mime="application/json", key="dl_strategy")
    _search(model, strategy, system)


def _search(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig) -> None:
    st.subheader("strategy search")
    c1, c2, c3 = st.columns(3)
    world = c1.number_input("GPUs", 1, 1 << 16, strategy.world_size, key="search_world")
    gbs = c2.number_input("global batch (sequences)", 1, 1 << 20, strategy.global_batch_size, key="search_gbs")
    tps = c3.text_input("TP sizes", "1,2,4,8", key="search_tp")
    if not st.button("run search", key="run_search"):
        return
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    try:
        space = SearchSpace(world_size=int(world), global_batch_size=int(gbs), tp=tuple(int(x) for x in tps.split(",") if x.strip()),
                            pp=None, vp=(1,), ep=(1,), etp=(1,), cp=(1,), mbs=(1,), recompute=RECOMPUTE,
                            zero=(1,), schedule=(None,))
        rows = run_search(model, system, strategy, space)
    except (ConfigError, ValueError) as exc:
        st.error(f"error: {exc}")
        return
    fit = [r for r in rows if r.fits]
    st.write(f"{len(fit)} of {len(rows)} strategies fit")
    table = [{"strategy": r.label, "iter ms": round(r.iter_time * 1e3, 1), "MFU": round(r.mfu or 0.0, 3),
              "tokens/s/GPU": round(r.tokens_per_s_per_gpu or 0.0), "peak GiB": round(r.peak_mem / GIB, 2)} for r in fit[:20]]
    st.dataframe(table, key="search_table")
    from simumax.search.table import search_csv

    # the CLI's search.csv columns (SI units), every row with its fits flag
    st.download_button("download search (CSV)", search_csv(rows), file_name="search.csv", mime="text/csv", key="dl_search")


main()
