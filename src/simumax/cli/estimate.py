"""``perf``, ``compare``, ``what-if`` and ``simulate``: one strategy's estimate, several side
by side, one with each hardware resource scaled, an event-simulated iteration."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

import typer

from simumax import cli  # the app and its consoles (cli.out_console is read at call time: tools swap it)
from simumax.api import PerfLLM
from simumax.atomic import dumps_finite, write_json_atomic
from simumax.cli.options import (GbsOpt, ModelOpt, SetOpt, StrategyOpt, SystemOpt,
                                 WorldSizeOpt, _say_written, _training, load_job)
from simumax.errors import ConfigError
from simumax.report import format as fmt
from simumax.uncertainty import attribution, compute_shares

# what the numbers of `perf --json` are: SI units, and which are per micro-batch
JSON_UNITS = {
    "time": "s", "memory": "bytes", "flops": "FLOP", "throughput": "tokens/s per GPU",
    "per_micro_batch": ["cost.stages[].fwd", "cost.stages[].bwd", "cost.stages[].recompute", "cost.stages[].p2p",
                        "cost.stages[].comm_exposed", "mem.stages[].fwd_activation_cache_per_micro_batch"],
    "per_iteration": ["cost.duration_time_per_iter", "cost.breakdown", "cost.stages[].dp_comm", "cost.stages[].optimizer",
                      "cost.stages[].end_of_backward", "cost.flops_per_iter", "cost.tokens_per_iter"],
    "peak": ["mem.stages[].peak_mem (allocated)", "mem.stages[].peak_mem_with_reserved (allocated / mem_factor)"],
}


@cli.app.command()
def perf(
    model: str = ModelOpt,
    strategy: str = StrategyOpt,
    system: str = SystemOpt,
    set_: list[str] = SetOpt,
    world_size: Optional[int] = WorldSizeOpt,
    gbs: Optional[int] = GbsOpt,
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens (e.g. 15e12): prints time to train and GPU-hours."),
    gpu_hour_price: Optional[float] = typer.Option(None, "--gpu-hour-price", help="Price of one GPU-hour, for --tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write compute/mem results, resolved configs and memory/time plots here."),
    plot_format: str = typer.Option("png", "--plot-format", help="png or svg."),
) -> None:
    """Estimate one training iteration: time, MFU, throughput and memory per stage."""
    if plot_format not in ("png", "svg"):
        raise ConfigError("--plot-format", "must be png or svg")
    if tokens is not None and not (math.isfinite(tokens) and tokens > 0):
        raise ConfigError("--tokens", f"must be a positive number (got {tokens})")
    if gpu_hour_price is not None and not (math.isfinite(gpu_hour_price) and gpu_hour_price >= 0):
        raise ConfigError("--gpu-hour-price", f"must be >= 0 (got {gpu_hour_price})")
    m, st, sy = load_job(model, strategy, system, set_, world_size=world_size, gbs=gbs)
    p = PerfLLM().configure(strategy_config=st, model_config=m, system_config=sy)
    cost, mem = p.analysis_cost(), p.analysis_mem()
    params = p.estimate.params
    training = _training(cost.duration_time_per_iter, cost.duration_time_interval, st, tokens, gpu_hour_price) if tokens else None
    if out is not None:
        from simumax.report.breakdown_plots import plot_memory, plot_time

        t0 = time.time()
        p.analysis(out, console_log=False)
        plot_memory(mem, out / f"memory.{plot_format}", f"{m.model_name} on {sy.sys_name}")
        plot_time(cost, out / f"time.{plot_format}")
        _say_written(out, t0)
    if as_json:
        payload = {"cost": cost.to_dict(), "mem": mem.to_dict(), "params": params.to_dict(), "units": JSON_UNITS}
        if training:
            payload["training"] = training
        cli.out_console.print_json(dumps_finite(payload))
        return
    cli.out_console.print(fmt.run_title(m.model_name, sy.sys_name, st), style="bold", markup=False)
    mtp = f" (+ {params.mtp / 1e9:.2f} B in the MTP block)" if params.mtp else ""
    cli.out_console.print(f"parameters: {params.total / 1e9:.2f} B total, {params.active / 1e9:.2f} B active per token{mtp}", markup=False)
    mix = fmt.layer_mix(m)
    if mix:
        cli.out_console.print(mix, markup=False)
    cli.out_console.print(fmt.summary_table(cost, mem))
    if training:
        lo, hi = training["days_interval"]
        line = (f"{training['tokens']:.3g} tokens: {training['days']:.1f} days (80 %: {lo:.1f}–{hi:.1f}) on "
                f"{st.world_size} GPUs, {training['gpu_hours']:,.0f} GPU-hours")
        if training.get("cost") is not None:
            line += f", {training['cost']:,.0f} at {gpu_hour_price:g} per GPU-hour"
        cli.out_console.print(line, markup=False)
    cli.out_console.print(fmt.breakdown_table(cost))
    cli.out_console.print(fmt.memory_table(mem, cli.out_console.width))
    oom = fmt.out_of_memory(mem)
    if oom:
        cli.out_console.print(f"[red]{oom}[/]")
    free = fmt.free_overlap(st, p.estimate.network)
    if free:
        cli.out_console.print(f"[yellow]{free}[/]")
    held = fmt.nccl_sms_note(st, p.estimate.network)
    if held:
        cli.out_console.print(held, markup=False)
    host = fmt.host_issue_note(cost, sy.host_op_us)
    if host:
        cli.out_console.print(f"[yellow]{host}[/]")
    guessed = fmt.approximate_note(cost, m.moe_load_imbalance)
    if guessed:
        cli.out_console.print(f"[yellow]{guessed}[/]")
    if sy.accelerator.tables_from:
        cli.out_console.print(f"[yellow]kernel times measured on {sy.accelerator.tables_from}, a sibling of this device "
                              "(accelerator.tables_from): counted as unmeasured in the 80 % band[/]")
    misses = cost.efficiency_lookups.get("misses", {})
    if misses:
        shares = compute_shares(attribution(p.estimate))
        cli.out_console.print(f"[yellow]{len(misses)} kernel shapes not measured: {shares['fitted']:.0%} of the GEMM / "
                              f"attention time fitted from the table, {shares['default']:.0%} read off the default curve "
                              "(docs/hardware.md); shapes in --json efficiency_lookups[/]")


@cli.app.command()
def compare(
    model: str = ModelOpt,
    system: list[str] = typer.Option(..., "--system", "-y", help="System preset name or JSON path (repeat to compare "
                                     "systems: every strategy on each)."),
    strategy: list[str] = typer.Option([], "--strategy", "-s", help="A strategy to compare (repeat): preset or JSON."),
    vary: list[str] = typer.Option([], "--vary", help="A variant of the first strategy: key=value[,key=value] (repeat)."),
    set_: list[str] = SetOpt,
    world_size: Optional[int] = WorldSizeOpt,
    gbs: Optional[int] = typer.Option(None, "--gbs", help="Global batch in sequences for every strategy; each one's "
                                      "micro-batch count follows (default: the first strategy's global batch)."),
    as_json: bool = typer.Option(False, "--json", help="Print every strategy's results and breakdown differences as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write compare.json and compare.png here."),
    keep_micro_batches: bool = typer.Option(False, "--keep-micro-batches", help="Keep each strategy's micro-batch count "
                                            "(default: the first strategy's global batch for all, the count derived)."),
) -> None:
    """Strategies (or systems) side by side, each part's difference from the first.

    Time, MFU, tokens/s, memory per stage, and the difference of each breakdown part from the
    first ("what does TP4 instead of TP2 change", "what does a B200 instead of an H100
    change"), at the first strategy's global batch (or --gbs) on each one's world size (or
    --world-size)."""
    from simumax.report import compare as cmp

    if gbs is not None and keep_micro_batches:
        raise ConfigError("--gbs", "sets every strategy's micro-batch count: give it or --keep-micro-batches, not both")
    if not strategy:
        raise ConfigError("--strategy", "give at least one strategy (and more, or --vary, or several --system)")
    for v in vary:
        if not v or any("=" not in x for x in v.split(",") if x):
            raise ConfigError("--vary", f"expected key=value[,key=value], got {v!r}")
    specs = [(s_, s_, []) for s_ in strategy] + [(strategy[0], v, [x for x in v.split(",") if x]) for v in vary]
    if len(specs) * len(system) < 2:
        raise ConfigError("--strategy", "needs two or more strategies, --vary variants of the first, or two systems")
    rows = []
    for sys_spec in system:
        for spec, label, extra in specs:
            batch = gbs if gbs is not None or keep_micro_batches or not rows else rows[0].gbs
            m, st, sy = load_job(model, spec, sys_spec, [*set_, *extra], world_size=world_size, gbs=batch)
            p = PerfLLM().configure(strategy_config=st, model_config=m, system_config=sy)
            name = Path(label).stem if label.endswith(".json") else label
            if len(system) > 1:
                name = f"{name} @ {Path(sys_spec).stem if sys_spec.endswith('.json') else sys_spec}"
            rows.append(cmp.Compared(name, p.analysis_cost(), p.analysis_mem(), st.global_batch_size))
    if out is not None:
        write_json_atomic(out / "compare.json", cmp.to_dict(rows))
        cmp.plot(rows, out / "compare.png")
    if as_json:
        cli.out_console.print_json(dumps_finite(cmp.to_dict(rows)))
        return
    cli.out_console.print(cmp.table(rows))


@cli.app.command("what-if")
def what_if(
    model: str = ModelOpt,
    strategy: str = StrategyOpt,
    system: str = SystemOpt,
    set_: list[str] = SetOpt,
    world_size: Optional[int] = WorldSizeOpt,
    gbs: Optional[int] = GbsOpt,
    factor: list[float] = typer.Option([1.5], "--factor", help="How many times better each resource is made, one at a "
                                       "time (repeat for a sweep: --factor 1.25 --factor 2 --factor 4)."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write what_if.json and what_if.png here."),
) -> None:
    """Each hardware resource made --factor times better in turn: what bounds the job.

    The iteration time with one resource improved at a time (tensor-core peak, HBM bandwidth,
    scale-up links, scale-out links, latencies, host link): which resource bounds the job, and
    with several factors how the gain grows."""
    from simumax import what_if as wif
    from simumax.report import what_if as wi

    for f in factor:  # before the configs load: a bad factor is the error to report
        wif.check_factor(f)
    m, st, sy = load_job(model, strategy, system, set_, world_size=world_size, gbs=gbs)
    rows = wif.sweep(m, st, sy, tuple(factor))
    payload = {"rows": [w.to_dict() for w in rows], "units": {"time": "s"}}
    title = fmt.run_title(m.model_name, sy.sys_name, st)
    if out is not None:
        t0 = time.time()
        write_json_atomic(out / "what_if.json", payload)
        wi.plot(rows, out / "what_if.png", title)
        _say_written(out, t0)
    if as_json:
        cli.out_console.print_json(dumps_finite(payload))
        return
    cli.out_console.print(wi.table(rows, f"{title}: {rows[0].base_time * 1e3:.1f} ms per iteration as it is"))


@cli.app.command()
def simulate(
    model: str = ModelOpt,
    strategy: str = StrategyOpt,
    system: str = SystemOpt,
    schedule: Optional[str] = typer.Option(None, "--schedule", help="1f1b | interleaved | zb | dualpipev (default: the strategy's)."),
    set_: list[str] = SetOpt,
    world_size: Optional[int] = WorldSizeOpt,
    gbs: Optional[int] = GbsOpt,
    out: Path = typer.Option(Path("simumax_sim"), "--out", help="Folder for the trace, memory files and Gantt chart."),
    ops: Optional[bool] = typer.Option(None, "--ops/--no-ops", help="Per-op events in the trace (default: when not huge)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Event-simulate one iteration: Chrome trace, memory timelines, memory_viz snapshot, Gantt PNG."""
    if schedule is not None:
        set_ = [*set_, f"strategy.pp_schedule={schedule}"]
    m, st, sy = load_job(model, strategy, system, set_, world_size=world_size, gbs=gbs)
    res = PerfLLM().configure(strategy_config=st, model_config=m, system_config=sy).simulate(out, ops=ops)
    if as_json:
        cli.out_console.print_json(dumps_finite(res.to_dict()))
        return
    cli.out_console.print(fmt.simulation_table(res))
    timelines = [w for w in res.files if w.startswith("memory_timeline_rank")]
    for what, path in res.files.items():
        if what not in timelines:
            cli.out_console.print(f"{what}: {path}")
        elif what == timelines[0]:  # one line for every rank's timeline
            cli.out_console.print(f"memory_timeline_rank0..{len(timelines) - 1}: "
                              f"{path.replace('memory_timeline_rank0', 'memory_timeline_rank<r>')} ({len(timelines)} files)")
