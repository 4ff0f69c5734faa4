"""Human formatting, used only at print time."""

from __future__ import annotations

from rich.table import Table

from simumax.report.results import CostResult, MemResult, SimResult

GIB = 2**30


def gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def summary_table(title: str, cost: CostResult, mem: MemResult) -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("iteration time (ms)", ms(cost.duration_time_per_iter))
    t.add_row("MFU (causal attention)", f"{cost.mfu:.1%}")
    t.add_row("MFU (SimuMax 6ND + attn)", f"{cost.mfu_6nd_with_attn:.1%}")
    t.add_row("TFLOP/s per GPU", f"{cost.tflops_per_gpu:.1f}")
    t.add_row("tokens/s per GPU", f"{cost.throughput_per_accelerator:.0f}")
    t.add_row("peak allocated (GiB, max stage)", f"{gib(mem.peak_mem)} (stage {mem.peak_stage})")
    t.add_row("peak reserved (GiB)", f"{gib(mem.peak_mem_with_reserved)} of {gib(mem.capacity)}")
    return t


def breakdown_table(cost: CostResult) -> Table:
    t = Table(title="time on the critical rank (ms per iteration)")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in cost.breakdown.items():
        t.add_row(k, ms(v), f"{v / cost.duration_time_per_iter:.1%}")
    return t


def memory_table(mem: MemResult) -> Table:
    t = Table(title="memory per pipeline stage (GiB)")
    for col in ("stage", "layers", "weights", "grads", "optimizer", "TE buf", "act/mb", "in-flight", "peak", "reserved", "peak at"):
        t.add_column(col, justify="right" if col not in ("peak at",) else "left")
    for s in mem.stages:
        t.add_row(
            str(s.stage), str(s.layers), gib(s.weights), gib(s.grads), gib(s.optimizer), gib(s.te_buffers),
            gib(s.fwd_activation_cache_per_micro_batch), s.peak_path["in_flight"], gib(s.peak_mem),
            gib(s.peak_mem_with_reserved), f"{s.peak_path['phase']} {s.peak_path['op']}",
        )
    return t


def search_table(rows: list, capacity: float, gmi_error_gib: float) -> Table:
    t = Table(title=f"best strategies (capacity {capacity / GIB:.0f} GiB, {gmi_error_gib:g} GiB kept free)")
    for col in ("#", "strategy", "iter ms", "MFU", "tokens/s/GPU", "peak GiB per stage", "headroom GiB"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for i, r in enumerate(rows, 1):
        stages = " ".join(f"{x / GIB:.1f}" for x in r.peak_mem_per_stage)
        if r.fits:
            t.add_row(str(i), r.label, f"{r.iter_time * 1e3:.1f}", f"{r.mfu:.1%}", f"{r.tokens_per_s_per_gpu:.0f}", stages, f"{r.headroom / GIB:.1f}")
        else:
            t.add_row(str(i), r.label, "does not fit", "-", "-", stages, f"{r.headroom / GIB:.1f}")
    return t


def simulation_table(res: SimResult) -> Table:
    t = Table(
        title=f"{res.schedule}: simulated {ms(res.duration_time_per_iter)} ms per iteration "
        f"(analysis_cost {ms(res.closed_form_time_per_iter)} ms)"
    )
    for col in ("rank", "passes end ms", "iteration end ms", "busy ms", "bubble", "peak GiB"):
        t.add_column(col, justify="right")
    for r in res.ranks:
        t.add_row(str(r.rank), ms(r.end_of_backward), ms(r.end), ms(r.busy), f"{r.bubble_fraction:.1%}", gib(r.peak_mem))
    return t
