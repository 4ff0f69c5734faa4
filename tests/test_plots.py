

def test_every_plot_uses_one_font_size() -> None:
    """Memory, time, compare, frontier and Gantt figures (the CLI's files and the web app's
    images) share one font size; only micro-batch numbers inside Gantt bars are smaller."""
    from matplotlib.text import Text

    from simumax.api import PerfLLM
    from simumax.report import breakdown_plots, compare
    from simumax.report.figure import BAR_LABEL_SIZE, FONT_SIZE, pyplot

    perf = PerfLLM().configure(strategy_config="tp1_pp2_dp4_mbs1", model_config="llama2-tiny", system_config="a100_pcie")
    cost, mem = perf.analysis_cost(), perf.analysis_mem()
    figs = [breakdown_plots.memory_figure(mem, "title"), breakdown_plots.time_figure(cost, "title")]
    figs.append(compare.figure([compare.Compared("a", cost, mem, 32), compare.Compared("b", cost, mem, 32)]))
    for fig in figs:
        fig.canvas.draw()
        sizes = {t.get_fontsize() for t in fig.findobj(Text) if t.get_text()}
        assert sizes == {FONT_SIZE}, sizes
        pyplot().close(fig)
    assert BAR_LABEL_SIZE < FONT_SIZE
