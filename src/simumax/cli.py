"""The ``simumax`` command line."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from simumax.api import PerfLLM
from simumax.atomic import dumps_finite, write_json_atomic
from simumax.config.base import check_readable_file
from simumax.config.loader import list_presets, load_model, load_strategy, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.report import format as fmt

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Predict LLM training time and memory.")

out_console = Console()
if not out_console.is_terminal:  # piped or captured: do not squeeze tables to 80 columns
    out_console = Console(width=160)
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from simumax import __version__

        out_console.print(f"simumax {__version__}", markup=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Predict LLM training time and memory."""


SetOpt = typer.Option([], "--set", help="Override a field: \\[model.|strategy.|system.]key=value (JSON value).")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _set_path(data: dict[str, Any], path: list[str], value: Any, key: str) -> None:
    """Set a nested field of a config dump (``accelerator.mem_gbs``); SimuMax's flat network
    tiers are reached as ``networks.<tier>...``."""
    node: Any = data
    for part in path[:-1]:
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(key, f"unknown field {part!r}")
        node = node[part]
    if not isinstance(node, dict):
        raise ConfigError(key, f"{path[-2]!r} has no fields")
    node[path[-1]] = value  # an unknown leaf is refused when the config is validated


def apply_overrides(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig, sets: list[str]):
    """``--set key=value`` (JSON value) on the model, strategy or system; ``model.``,
    ``strategy.`` or ``system.`` first picks the config, dots go into nested fields."""
    configs: dict[str, Any] = {"model": model, "strategy": strategy, "system": system}
    dumps: dict[str, dict[str, Any]] = {}
    for item in sets:
        if "=" not in item:
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        target, _, field = key.partition(".") if key.split(".", 1)[0] in configs else ("", "", key)
        if not target:
            owners = [n for n, c in (("model", ModelConfig), ("strategy", StrategyConfig)) if field in c.model_fields]
            if not owners:
                raise ConfigError(key, "unknown field in model and strategy configs")
            target = owners[0]
        path = field.split(".")
        if path[0] not in type(configs[target]).model_fields:
            raise ConfigError(key, f"unknown field of the {target} config")
        data = dumps.setdefault(target, configs[target].model_dump())
        _set_path(data, path, _parse_value(value), key)
    for target, data in dumps.items():
        configs[target] = type(configs[target]).init_from_dict(data, source="--set")
    return configs["model"], configs["strategy"], configs["system"]


def _job_size(st: StrategyConfig, gbs: int | None) -> StrategyConfig:
    """``--gbs``: the micro-batch count follows (gbs / (mbs x dp))."""
    if gbs is not None:
        per_step = st.micro_batch_size * st.dp_size
        if gbs < 1 or gbs % per_step:
            raise ConfigError("--gbs", f"{gbs} must be a positive multiple of micro-batch size x DP = {per_step}")
        st = st.with_updates({"micro_batch_num": gbs // per_step}, source="--gbs")
    return st


def _training(step: float, band: tuple[float, float] | None, st: StrategyConfig, tokens: float,
              price: float | None) -> dict[str, Any]:
    """Time and GPU-hours to train on ``tokens`` at this step time (and its 80 % band)."""
    steps = tokens / (st.global_batch_size * st.seq_len)
    seconds = steps * step
    lo, hi = band or (step, step)
    gpu_hours = seconds * st.world_size / 3600
    return {
        "tokens": tokens, "steps": steps, "seconds": seconds, "days": seconds / 86400,
        "days_interval": (steps * lo / 86400, steps * hi / 86400), "gpu_hours": gpu_hours,
        "cost": gpu_hours * price if price is not None else None,
    }


@app.command()
def perf(
    model: str = typer.Option(..., "--model", "-m", help="Model preset name or JSON path."),
    strategy: str = typer.Option(..., "--strategy", "-s", help="Strategy preset name or JSON path."),
    system: str = typer.Option(..., "--system", "-y", help="System preset name or JSON path."),
    set_: list[str] = SetOpt,
    world_size: Optional[int] = typer.Option(None, "--world-size", help="GPUs (DP follows from TP x PP x CP)."),
    gbs: Optional[int] = typer.Option(None, "--gbs", help="Global batch in sequences; the micro-batch count follows."),
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
    if world_size is not None:  # with the other overrides, so --set tp_size=8 sees the new world
        if world_size < 1:
            raise ConfigError("--world-size", f"must be >= 1 (got {world_size})")
        set_ = [f"strategy.world_size={world_size}", *set_]
    m, st, sy = apply_overrides(load_model(model), load_strategy(strategy), load_system(system), set_)
    st = _job_size(st, gbs)
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
        out_console.print_json(dumps_finite(payload))
        return
    out_console.print(fmt.run_title(m.model_name, sy.sys_name, st), style="bold", markup=False)
    mtp = f" (+ {params.mtp / 1e9:.2f} B in the MTP block)" if params.mtp else ""
    out_console.print(f"parameters: {params.total / 1e9:.2f} B total, {params.active / 1e9:.2f} B active per token{mtp}", markup=False)
    out_console.print(fmt.summary_table(cost, mem))
    if training:
        lo, hi = training["days_interval"]
        line = (f"{training['tokens']:.3g} tokens: {training['days']:.1f} days (80 %: {lo:.1f}–{hi:.1f}) on "
                f"{st.world_size} GPUs, {training['gpu_hours']:,.0f} GPU-hours")
        if training.get("cost") is not None:
            line += f", {training['cost']:,.0f} at {gpu_hour_price:g} per GPU-hour"
        out_console.print(line, markup=False)
    out_console.print(fmt.breakdown_table(cost))
    out_console.print(fmt.memory_table(mem, out_console.width))
    oom = fmt.out_of_memory(mem)
    if oom:
        out_console.print(f"[red]{oom}[/]")
    misses = cost.efficiency_lookups.get("misses", {})
    if misses:
        src = cost.efficiency_lookups.get("sources", {})
        fitted = sum(v["fitted"] for k, v in src.items() if not k.startswith("memory/"))
        default = sum(v["default"] for k, v in src.items() if not k.startswith("memory/"))
        out_console.print(f"[yellow]{len(misses)} kernel shapes not measured: {fitted} lookups fitted from the table, "
                          f"{default} on the default curve (docs/hardware.md); keys in --json efficiency_lookups[/]")


@app.command()
def compare(
    model: str = typer.Option(..., "--model", "-m", help="Model preset name or JSON path."),
    system: str = typer.Option(..., "--system", "-y", help="System preset name or JSON path."),
    strategy: list[str] = typer.Option([], "--strategy", "-s", help="A strategy to compare (repeat): preset or JSON."),
    vary: list[str] = typer.Option([], "--vary", help="A variant of the first strategy: key=value[,key=value] (repeat)."),
    set_: list[str] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print every strategy's results and breakdown differences as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write compare.json and compare.png here."),
    keep_micro_batches: bool = typer.Option(False, "--keep-micro-batches", help="Keep each strategy's micro-batch count "
                                            "(default: the first strategy's global batch for all, the count derived)."),
) -> None:
    """Strategies side by side: time, MFU, tokens/s, memory per stage, and the difference of
    each breakdown part from the first ("what does TP4 instead of TP2 change"), at the first
    strategy's global batch."""
    from simumax.report import compare as cmp

    if not strategy:
        raise ConfigError("--strategy", "give at least one strategy (and more, or --vary)")
    specs = [(s_, s_, []) for s_ in strategy] + [(strategy[0], v, [x for x in v.split(",") if x]) for v in vary]
    if len(specs) < 2:
        raise ConfigError("--strategy", "needs two or more strategies, or --vary variants of the first")
    rows = []
    for spec, label, extra in specs:
        m, st, sy = apply_overrides(load_model(model), load_strategy(spec), load_system(system), [*set_, *extra])
        if rows and not keep_micro_batches:
            st = _job_size(st, rows[0].gbs)
        p = PerfLLM().configure(strategy_config=st, model_config=m, system_config=sy)
        rows.append(cmp.Compared(Path(label).stem if label.endswith(".json") else label, p.analysis_cost(), p.analysis_mem(),
                                 st.global_batch_size))
    if out is not None:
        write_json_atomic(out / "compare.json", cmp.to_dict(rows))
        cmp.plot(rows, out / "compare.png")
    if as_json:
        out_console.print_json(dumps_finite(cmp.to_dict(rows)))
        return
    out_console.print(cmp.table(rows))


@app.command()
def simulate(
    model: str = typer.Option(..., "--model", "-m", help="Model preset name or JSON path."),
    strategy: str = typer.Option(..., "--strategy", "-s", help="Strategy preset name or JSON path."),
    system: str = typer.Option(..., "--system", "-y", help="System preset name or JSON path."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="1f1b | interleaved | zb | dualpipev (default: the strategy's)."),
    set_: list[str] = SetOpt,
    out: Path = typer.Option(Path("simumax_sim"), "--out", help="Folder for the trace, memory files and Gantt chart."),
    ops: Optional[bool] = typer.Option(None, "--ops/--no-ops", help="Per-op events in the trace (default: when not huge)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Event-simulate one iteration: Chrome trace, memory timelines, memory_viz snapshot, Gantt PNG."""
    if schedule is not None:
        set_ = [*set_, f"strategy.pp_schedule={schedule}"]
    m, st, sy = apply_overrides(load_model(model), load_strategy(strategy), load_system(system), set_)
    res = PerfLLM().configure(strategy_config=st, model_config=m, system_config=sy).simulate(out, ops=ops)
    if as_json:
        out_console.print_json(dumps_finite(res.to_dict()))
        return
    out_console.print(fmt.simulation_table(res))
    timelines = [w for w in res.files if w.startswith("memory_timeline_rank")]
    for what, path in res.files.items():
        if what not in timelines:
            out_console.print(f"{what}: {path}")
        elif what == timelines[0]:  # one line for every rank's timeline
            out_console.print(f"memory_timeline_rank0..{len(timelines) - 1}: "
                              f"{path.replace('memory_timeline_rank0', 'memory_timeline_rank<r>')} ({len(timelines)} files)")


def _str_list(text: str) -> tuple[str, ...]:
    """A comma-separated option's items, stripped, empty ones dropped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _int_list(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in _str_list(text)]
    except ValueError:
        raise ConfigError(name, f"expected comma-separated integers, got {text!r}") from None


@app.command()
def search(
    model: str = typer.Option(..., "--model", "-m", help="Model preset name or JSON path."),
    strategy: str = typer.Option(..., "--strategy", "-s", help="Base strategy (seq_len, dtype, kernels ...)."),
    system: str = typer.Option(..., "--system", "-y", help="System preset name or JSON path."),
    world_size: int = typer.Option(..., "--world-size", help="Accelerators to lay the job out on."),
    global_batch_size: Optional[int] = typer.Option(None, "--gbs", help="Global batch (sequences); default the base strategy's."),
    tp: str = typer.Option("1,2,4,8", "--tp", help="TP sizes to try."),
    pp: Optional[str] = typer.Option(None, "--pp", help="PP sizes to try (default: every pp up to the layer count; uneven first/last stages where layers do not divide)."),
    vp: Optional[str] = typer.Option(None, "--vp", help="Virtual pipeline (interleaving) sizes to try (default: the base strategy's)."),
    ep: Optional[str] = typer.Option(None, "--ep", help="EP sizes to try, MoE (default: the base strategy's)."),
    etp: Optional[str] = typer.Option(None, "--etp", help="Expert TP sizes to try, MoE (default: the base strategy's)."),
    cp: Optional[str] = typer.Option(None, "--cp", help="CP sizes to try (default: the base strategy's)."),
    mbs: Optional[str] = typer.Option(None, "--mbs", help="Micro-batch sizes to try; the count follows from --gbs (default: the base strategy's)."),
    recompute: str = typer.Option("none,selective,full_block", "--recompute", help="Recompute variants: none, selective, selective_norm, selective_mlp, full_block (fewest layers that fit)."),
    zero: Optional[str] = typer.Option(None, "--zero", help="ZeRO stages to try, 0 to 3 (default: the base strategy's)."),
    replicas: Optional[str] = typer.Option(None, "--replicas", help="HSDP replica counts to try (fsdp_replicate_size: shard inside a replica, all-reduce across; ZeRO >= 1; default: the base strategy's)."),
    fsdp: Optional[str] = typer.Option(None, "--fsdp", help="Sharded-DP implementations to try: megatron_fsdp, torch_fsdp2 (ZeRO-3 only), deepspeed (ZeRO 1-3; default: the base strategy's)."),
    offload: Optional[str] = typer.Option(None, "--offload", help="What to offload to host memory, to try: none, optimizer, activations (attention and expert inputs), both (default: the base strategy's settings)."),
    schedule: str = typer.Option("auto", "--schedule", help="Pipeline schedules to try: auto (1F1B / interleaved), 1f1b, interleaved, zb, dualpipev."),
    gmi_error: float = typer.Option(0.0, "--gmi-error", help="GiB kept free per GPU (default 0, as in the API's search methods and the app)."),
    allocated: bool = typer.Option(False, "--allocated", help="Fit allocated bytes, not reserved (allocated / mem_factor)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Worker processes (or Ray actors)."),
    executor: str = typer.Option("local", "--executor", help="local, process or ray (pip install 'simumax\\[ray]'; RAY_ADDRESS for a cluster)."),
    top: int = typer.Option(10, "--top", help="Rows shown."),
    set_: list[str] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print all rows as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for search.jsonl (streamed), search.csv, frontier.png, best_strategy.json, best_megatron_flags.txt."),
    resume: bool = typer.Option(False, "--resume", help="Keep the rows already in OUT/search.jsonl and skip their candidates."),
) -> None:
    """Search the fastest strategy that fits memory; print the top rows."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from simumax.search.run import SearchInterrupted, run_search
    from simumax.search.space import SearchSpace

    if resume and out is None:
        raise ConfigError("--resume", "needs --out (the folder holding search.jsonl)")
    if global_batch_size is not None and global_batch_size < 1:
        raise ConfigError("--gbs", f"must be >= 1 (got {global_batch_size})")
    if not math.isfinite(gmi_error) or gmi_error < 0:
        raise ConfigError("--gmi-error", f"must be a finite number of GiB >= 0 (got {gmi_error})")
    if top < 1:
        raise ConfigError("--top", f"must be >= 1 (got {top})")
    if world_size < 1:
        raise ConfigError("--world-size", f"must be >= 1 (got {world_size})")
    m, st, sy = apply_overrides(load_model(model), load_strategy(strategy), load_system(system), set_)
    schedules = tuple(None if s == "auto" else s for s in _str_list(schedule))
    for flag, text in (("--ep", ep), ("--etp", etp)):
        if text and not m.is_moe and any(v != 1 for v in _int_list(text, flag)):
            raise ConfigError(flag, "the model is dense (no experts): expert parallelism does not apply")
    # every dimension not given defaults to the base strategy's value (an EP8 base searches EP8)
    dim = lambda text, flag, base: tuple(_int_list(text, flag)) if text else (base,)  # noqa: E731
    space = SearchSpace(
        world_size=world_size, global_batch_size=global_batch_size or st.global_batch_size, tp=tuple(_int_list(tp, "--tp")),
        pp=tuple(_int_list(pp, "--pp")) if pp else None, vp=dim(vp, "--vp", st.interleaving_size), ep=dim(ep, "--ep", st.ep_size),
        etp=dim(etp, "--etp", st.etp_size), cp=dim(cp, "--cp", st.cp_size), mbs=dim(mbs, "--mbs", st.micro_batch_size),
        recompute=_str_list(recompute), zero=dim(zero, "--zero", st.zero_state),
        schedule=schedules, offload=_str_list(offload) if offload else ("none",),
        replicas=tuple(_int_list(replicas, "--replicas")) if replicas else (1,),
        fsdp=tuple(_str_list(fsdp)) if fsdp else (None,),
    )
    jsonl = out / "search.jsonl" if out is not None else None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err_console, transient=True, disable=as_json) as bar:
            task = bar.add_task("evaluating", total=None)
            rows = run_search(
                m, sy, st, space, gmi_error=gmi_error, use_reserved_memory=not allocated, jobs=jobs, executor=executor,
                jsonl=jsonl, resume=resume, progress=lambda i, n: bar.update(task, completed=i, total=n),
            )
    except SearchInterrupted as exc:
        err_console.print(f"interrupted: {len(exc.rows)} rows kept in {exc.path}; rerun with --resume to finish" if exc.path
                          else f"interrupted after {len(exc.rows)} rows (use --out to keep them)", soft_wrap=True)
        raise SystemExit(130) from None
    if not rows:
        from simumax.search.space import empty_space_error

        raise empty_space_error(m, sy, st, space)
    if out is not None:
        _write_search_outputs(out, rows, m, sy, float(sy.mem_bytes) - gmi_error * 2**30)
    if as_json:
        out_console.print_json(dumps_finite([r.to_dict() for r in rows]))
        return
    out_console.print(fmt.search_table(rows[:top], float(sy.mem_bytes), gmi_error, reserved=not allocated))
    if rows and not rows[0].fits:
        short = min(-r.headroom for r in rows)  # headroom = budget - peak
        err_console.print(
            f"nothing fits: the closest candidate needs {short / 2**30:.1f} GiB more per GPU than the budget; widen the space "
            "(--pp, --tp, --ep for MoE, --cp for long sequences, --recompute full_block, --zero 1,2,3, "
            "--offload optimizer,activations) or use more GPUs",
            markup=False, soft_wrap=True,
        )
    if rows and rows[0].fits:
        from simumax.export.megatron_flags import megatron_flags

        out_console.print("best as Megatron-LM flags:", markup=False)
        out_console.print(" ".join(megatron_flags(StrategyConfig.init_from_dict(rows[0].strategy or {}), m)), markup=False, soft_wrap=True)


# what the numbers of `perf --json` are: SI units, and which are per micro-batch
JSON_UNITS = {
    "time": "s", "memory": "bytes", "flops": "FLOP", "throughput": "tokens/s per GPU",
    "per_micro_batch": ["cost.stages[].fwd", "cost.stages[].bwd", "cost.stages[].recompute", "cost.stages[].p2p",
                        "cost.stages[].comm_exposed", "mem.stages[].fwd_activation_cache_per_micro_batch"],
    "per_iteration": ["cost.duration_time_per_iter", "cost.breakdown", "cost.stages[].dp_comm", "cost.stages[].optimizer",
                      "cost.stages[].end_of_backward", "cost.flops_per_iter", "cost.tokens_per_iter"],
    "peak": ["mem.stages[].peak_mem (allocated)", "mem.stages[].peak_mem_with_reserved (allocated / mem_factor)"],
}


def _say_written(out: Path, since: float) -> None:
    """One line on stderr naming the files just written to ``out`` (stdout stays the result)."""
    names = sorted(p.name for p in out.iterdir() if p.is_file() and p.stat().st_mtime >= since - 1)
    if names:
        err_console.print(f"wrote {out}: {', '.join(names)}", markup=False, soft_wrap=True)


def _write_search_outputs(out: Path, rows: list, model: ModelConfig, system: SystemConfig, budget: float) -> None:
    """CSV, frontier plot, and the best strategy as JSON and as Megatron-LM flags."""
    from simumax.atomic import write_text_atomic
    from simumax.export.megatron_flags import megatron_flags
    from simumax.report.frontier import plot_frontier
    from simumax.search.table import search_csv

    t0 = time.time()
    write_text_atomic(out / "search.csv", search_csv(rows))
    plot_frontier(rows, out / "frontier.png", budget, f"{model.model_name} on {system.sys_name}")
    if rows and rows[0].fits:
        best = StrategyConfig.init_from_dict(rows[0].strategy or {})
        write_json_atomic(out / "best_strategy.json", best.to_dict())
        write_text_atomic(out / "best_megatron_flags.txt", " \\\n".join(megatron_flags(best, model)) + "\n")
    _say_written(out, t0)


@app.command()
def validate(
    file: Path = typer.Argument(..., help="Validation JSONL (schema: shared/validation/README.md)."),
    reference_root: Optional[Path] = typer.Option(None, help="Folder config paths are relative to (default ../reference)."),
    as_json: bool = typer.Option(False, "--json", help="Print per-case results and the summary as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write validation.json to this folder."),
) -> None:
    """Compare predictions with measured runs: time and peak memory error per case."""
    from simumax.validate import ranking, run_file, summary, summary_by_family, summary_by_source

    results = run_file(file, reference_root)
    summ = summary(results)
    by_family = summary_by_family(results)
    by_source = summary_by_source(results)
    ranks = ranking(results)
    payload = {"cases": [r.to_dict() for r in results], "summary": summ, "by_family": by_family, "by_source": by_source,
               "ranking": ranks}
    if out is not None:
        write_json_atomic(out / "validation.json", payload)
    if as_json:
        out_console.print_json(dumps_finite(payload))
        return
    t = Table(title=f"validation: {file.name}")
    for col in ("case", "pred ms", "real ms", "err", "SimuMax err", "pred GiB", "real GiB", "err", "SimuMax err"):
        t.add_column(col, justify="left" if col == "case" else "right")
    pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
    apct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    opt = lambda x, f: "-" if x is None else f(x)  # noqa: E731
    for r in results:
        if r.skipped:
            t.add_row(r.id, "skipped", "", "", "", "", "", "", r.skipped.split(": ", 1)[-1][:40])
            continue
        # memory compared as weights + grads + optimizer + stored activations: marked with *
        star = "*" if r.mem_measure != "peak_alloc" else ""
        t.add_row(
            r.id + ("†" if r.record_does_not_fit else ""), opt(r.predicted_time, fmt.ms), opt(r.measured_time, fmt.ms), pct(r.time_error), pct(r.reference_time_error),
            opt(r.predicted_mem, fmt.gib) + star, opt(r.measured_mem, fmt.gib) + star, pct(r.mem_error), pct(r.reference_mem_error),
        )
    out_console.print(t)
    if any(r.mem_measure != "peak_alloc" for r in results):
        out_console.print("* weights + grads + optimizer + stored activations of the first stage (no transient buffers)", markup=False)
    if any(r.record_does_not_fit for r in results):
        out_console.print("† ran, but the recorded strategy does not fit the GPU in the memory model (reserved bytes): its "
                          "record misses a memory-saving setting (recompute, fp8 parameters, offload) or the model "
                          "over-predicts its memory; its time is compared as recorded", markup=False)

    def line(label: str, s: dict) -> str:
        text = (
            f"{label}{s['evaluated']}/{s['cases']} cases: time ({s['time_cases']}) mean |err| {apct(s['time_mean_abs_error'])}"
            f" max {apct(s['time_max_abs_error'])} signed mean {pct(s['time_mean_error'])}"
            f" (SimuMax {apct(s['reference_time_mean_abs_error'])} / {apct(s['reference_time_max_abs_error'])});"
            f" memory ({s['mem_cases']}) mean |err| {apct(s['mem_mean_abs_error'])} max {apct(s['mem_max_abs_error'])}"
        )
        if s["band_coverage"] is not None:
            text += f"; 80 % band holds {apct(s['band_coverage'])} (median width {apct(s['band_median_width'])})"
        return text + (f"; {s['skipped']} skipped" if s["skipped"] else "")

    if len(by_source) > 1:
        for source, s in by_source.items():
            out_console.print(line(f"{source}: ", s), markup=False)
    if len(by_family) > 1:
        for family, s in by_family.items():
            out_console.print(line(f"{family}: ", s), markup=False)
    out_console.print(line("all: " if len(by_family) > 1 or len(by_source) > 1 else "", summ), markup=False)
    if ranks["groups"]:
        rho = ranks["mean_spearman"]
        out_console.print(
            f"ranking: {len(ranks['groups'])} groups of cases with the same model, GPUs, global batch and sequence:"
            f" mean Spearman {'-' if rho is None else f'{rho:.2f}'}, regret of the predicted-fastest mean"
            f" {apct(ranks['mean_regret'])} max {apct(ranks['max_regret'])}", markup=False,
        )


def _sizes(text: str, name: str) -> list[int]:
    """Byte sizes like 1K,64K,1M,256M."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    out = []
    for part in (x.strip().upper() for x in text.split(",") if x.strip()):
        try:
            out.append(int(float(part[:-1]) * units[part[-1]]) if part[-1] in units else int(part))
        except (ValueError, KeyError):
            raise ConfigError(name, f"expected sizes like 64K,1M,256M, got {part!r}") from None
    if not out or min(out) <= 0:
        raise ConfigError(name, "needs positive sizes")
    return out


@app.command()
def calibrate(
    model: list[str] = typer.Option(..., "--model", "-m", help="Model preset or JSON (repeat with --strategy for several jobs)."),
    strategy: list[str] = typer.Option(..., "--strategy", "-s", help="Strategy preset or JSON, one per --model."),
    out: Path = typer.Option(..., "--out", help="System JSON to write (a <name>.report.json with every timing goes beside it)."),
    base: Optional[str] = typer.Option(None, "--base", help="System preset or JSON to merge into (peaks and networks kept)."),
    name: Optional[str] = typer.Option(None, "--name", help="sys_name of the written config."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device (default cuda if available, else cpu)."),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", help="bf16 peak (default: base, datasheet by device name, else measured)."),
    hbm_gbps: Optional[float] = typer.Option(None, "--hbm-gbps", help="Memory bandwidth peak in GB/s (same defaults)."),
    num_per_node: int = typer.Option(8, "--num-per-node", help="Accelerators per node when no --base."),
    warmup: int = typer.Option(3, "--warmup", min=0),
    repeats: int = typer.Option(10, "--repeats", min=1),
    set_: list[str] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the written system config as JSON."),
) -> None:
    """Time the GEMM / grouped GEMM / attention / memory-bound kernels the jobs run; write a system config."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from simumax.calibrate.run import calibrate_jobs

    if len(model) != len(strategy):
        raise ConfigError("--model/--strategy", f"give one strategy per model ({len(model)} models, {len(strategy)} strategies)")
    base_cfg = load_system(base) if base else None
    jobs = []
    for m_name, s_name in zip(model, strategy):
        m, st, _ = apply_overrides(load_model(m_name), load_strategy(s_name), base_cfg or load_system("a100_pcie"), set_)
        jobs.append((m, st))
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True, disable=as_json) as bar:
        task = bar.add_task("timing kernels", total=None)
        system, report = calibrate_jobs(
            jobs, base_cfg, name, device, warmup, repeats, peak_tflops, hbm_gbps, num_per_node,
            progress=lambda i, n: bar.update(task, completed=i, total=n),
        )
    write_json_atomic(out, system)
    write_json_atomic(out.with_name(out.stem + ".report.json"), report)
    if as_json:
        out_console.print_json(dumps_finite(system))
        return
    out_console.print(fmt.calibration_table(report))
    out_console.print(f"wrote {out} ({len(report['kernels'])} kernels measured on {report['device']}, "
                      f"peak {report['peak_tflops']:.1f} TFLOP/s from {report['peak_source']})", markup=False)


@app.command("calibrate-comm")
def calibrate_comm(
    out: Path = typer.Option(..., "--out", help="System JSON to write (rank 0)."),
    base: Optional[str] = typer.Option(None, "--base", help="System preset or JSON to merge into."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Network tier to write (default high_intra_node on one node, else inter_node)."),
    sizes: str = typer.Option("64K,1M,16M,64M", "--sizes", help="Message sizes (bytes; K/M/G suffixes)."),
    group_sizes: Optional[str] = typer.Option(None, "--group-sizes", help="Group sizes to time (default the world size)."),
    warmup: int = typer.Option(3, "--warmup", min=0),
    repeats: int = typer.Option(10, "--repeats", min=1),
) -> None:
    """Under torchrun: time all-reduce / all-gather / reduce-scatter / all-to-all / p2p, fit α-β, write the tier."""
    from simumax.calibrate.run import calibrate_collectives

    base_cfg = load_system(base) if base else None
    groups = _int_list(group_sizes, "--group-sizes") if group_sizes else None
    system, report, rank0 = calibrate_collectives(_sizes(sizes, "--sizes"), groups, tier, base_cfg, warmup, repeats)
    if rank0:
        write_json_atomic(out, system)
        write_json_atomic(out.with_name(out.stem + ".comm_report.json"), report)
        out_console.print(fmt.comm_table(report, system), markup=False)


@app.command("check-step")
def check_step_cmd(
    model: str = typer.Option(..., "--model", "-m", help="Dense model preset or JSON (use --set layer_num=... to fit one device)."),
    system: str = typer.Option(..., "--system", "-y", help="System preset or JSON to predict with (e.g. a calibrated one)."),
    seq_len: int = typer.Option(2048, "--seq-len", min=1),
    mbs: int = typer.Option(1, "--mbs", min=1, help="Sequences per micro-batch."),
    mbc: int = typer.Option(1, "--mbc", min=1, help="Micro-batches per step (gradient accumulation)."),
    steps: int = typer.Option(5, "--steps", min=1, help="Timed steps (median reported)."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Untimed steps first."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device (default cuda if available, else cpu)."),
    set_: list[str] = typer.Option([], "--set", help="Override a model field: key=value."),
    profile: bool = typer.Option(False, "--profile", help="Profile one extra step: device time per kernel name in the JSON."),
    compile_: bool = typer.Option(False, "--compile", help="torch.compile each layer (fuses element-wise chains as TE does)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write check_step.json here."),
) -> None:
    """Train a Llama-style model for a few steps with plain PyTorch; print measured vs predicted time and memory."""
    from simumax.calibrate.run import check_step

    m, _, sy = apply_overrides(load_model(model), load_strategy("tp1_pp1_dp8_mbs1"), load_system(system),
                               [s if s.startswith("model.") else f"model.{s}" for s in set_])
    row = check_step(m, sy, seq_len, mbs, mbc, steps, warmup, device, profile, compile_)
    if out is not None:
        write_json_atomic(out / "check_step.json", row)
    if as_json:
        out_console.print_json(dumps_finite(row))
        return
    out_console.print(fmt.check_step_table(row))


import_app = typer.Typer(no_args_is_help=True, help="Configs from a Hugging Face config.json or a Megatron-LM command line.")
app.add_typer(import_app, name="import")


def _print_notes(notes: list[str]) -> None:
    for n in notes:
        err_console.print(f"note: {n}", markup=False, highlight=False, soft_wrap=True)


@import_app.command("hf")
def import_hf(
    path: Path = typer.Argument(..., help="A local Hugging Face config.json (no network)."),
    name: Optional[str] = typer.Option(None, "--name", help="model_name (default: the folder or file name)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the model config JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the model config as JSON."),
) -> None:
    """Hugging Face config.json (Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE, DeepSeek-V2/V3) -> model config."""
    from simumax.estimate import Estimate
    from simumax.importers.hf import load_hf_config

    model, notes = load_hf_config(path, name)
    if out is not None:
        write_json_atomic(out, model.to_dict())
    _print_notes(notes)
    if as_json or out is None:
        out_console.print_json(dumps_finite(model.to_dict()))
    params = Estimate(model, load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 1}, source="import"), load_system("a100_pcie")).params
    err_console.print(f"{model.model_name}: {params.total / 1e9:.2f} B parameters ({params.active / 1e9:.2f} B active)", markup=False)


@import_app.command("megatron")
def import_megatron(
    args: Optional[list[str]] = typer.Argument(None, help="The arguments after `--` (simumax import megatron -- --num-layers 32 ...), or use --file."),
    file: Optional[Path] = typer.Option(None, "--file", help="A launch script or a file holding the arguments."),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="GPUs of the job (default: DP 1)."),
    name: str = typer.Option("megatron", "--name", help="model_name."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write model.json and strategy.json into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print both configs as JSON."),
) -> None:
    """Megatron-LM pretrain_gpt.py arguments -> model + strategy configs."""
    from simumax.importers.megatron_args import parse_megatron_args

    if (not args) == (file is None):
        raise ConfigError("args", "give the arguments (after --) or --file, one of them")
    if file is not None:
        check_readable_file(file, "a launch script", "--file")
        import os
        import shlex

        from simumax.config.base import read_text
        from simumax.importers.launch_script import megatron_words

        text = shlex.join(megatron_words(read_text(file, "--file"), dict(os.environ)))
    else:
        text = " ".join(args or [])
    model, strategy, notes = parse_megatron_args(text, world_size, name)
    if out is not None:
        write_json_atomic(out / "model.json", model.to_dict())
        write_json_atomic(out / "strategy.json", strategy.to_dict())
    _print_notes(notes)
    out_console.print_json(dumps_finite({"model": model.to_dict(), "strategy": strategy.to_dict()}))


@app.command()
def export(
    model: str = typer.Option(..., "--model", "-m", help="Model preset name or JSON path."),
    strategy: str = typer.Option(..., "--strategy", "-s", help="Strategy preset name or JSON path."),
    set_: list[str] = SetOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="Also write megatron_flags.txt (torchtitan.toml, ds_config.json) here."),
    as_json: bool = typer.Option(False, "--json", help="Print the flags as a JSON list."),
    fmt_: str = typer.Option("megatron", "--format", help="megatron (flags), torchtitan (a job-config TOML snippet) or "
                             "deepspeed (a ds_config.json)."),
) -> None:
    """Model + strategy as Megatron-LM flags (the inverse of `import megatron`), as a
    torchtitan job-config snippet (`--format torchtitan`, FSDP2: zero_state 3), or as a
    DeepSpeed config (`--format deepspeed`, fsdp_impl deepspeed)."""
    from simumax.atomic import write_text_atomic
    from simumax.export.megatron_flags import megatron_flags, model_flags

    if fmt_ not in ("megatron", "torchtitan", "deepspeed"):
        raise ConfigError("--format", f"must be megatron, torchtitan or deepspeed (got {fmt_!r})")
    m, st, _ = apply_overrides(load_model(model), load_strategy(strategy), load_system("a100_pcie"), set_)
    if fmt_ != "megatron":
        if fmt_ == "torchtitan":
            from simumax.export.torchtitan import torchtitan_toml

            name, text = "torchtitan.toml", torchtitan_toml(st)
        else:
            from simumax.export.deepspeed import deepspeed_config

            name, text = "ds_config.json", json.dumps(deepspeed_config(st), indent=2) + "\n"
        if out is not None:
            write_text_atomic(out / name, text)
        sys.stdout.write(text)
        return
    flags = model_flags(m) + megatron_flags(st, m)
    if out is not None:
        write_text_atomic(out / "megatron_flags.txt", " \\\n".join(flags) + "\n")
    if as_json:
        out_console.print_json(dumps_finite(flags))
        return
    sys.stdout.write(" \\\n".join(flags) + "\n")


@app.command("app")
def app_cmd(
    port: int = typer.Option(8501, "--port", help="Port to serve on."),
    browser: bool = typer.Option(False, "--browser/--no-browser", help="Open a browser tab."),
) -> None:
    """Start the web app (pip install 'simumax\\[app]')."""
    import importlib.util
    import os

    if importlib.util.find_spec("streamlit") is None:
        raise ConfigError("app", "needs Streamlit: pip install 'simumax[app]'")
    script = Path(__file__).resolve().parent / "app" / "streamlit_app.py"
    cmd = [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
           "--server.headless", "false" if browser else "true", "--browser.gatherUsageStats", "false"]
    sys.stdout.flush()
    # become the server (no child process): a signal to this process stops the server
    # instead of orphaning it
    os.execv(sys.executable, cmd)


@app.command()
def presets(
    kind: Optional[str] = typer.Argument(None, help="model, strategy or system (default all)."),
    as_json: bool = typer.Option(False, "--json", help="Print {kind: \\[names]} as JSON."),
) -> None:
    """List the shipped presets."""
    kinds = [kind] if kind else ["model", "strategy", "system"]
    for k in kinds:
        if k not in ("model", "strategy", "system"):
            raise ConfigError("kind", "must be model, strategy or system")
    from simumax.config.hardware import preset_provenance

    if as_json:
        payload: dict[str, Any] = {k: list_presets(k) for k in kinds}
        if "system" in kinds:  # which system presets are measured and which derived
            payload["system_provenance"] = {n: preset_provenance(n) for n in list_presets("system")}
        out_console.print_json(dumps_finite(payload))
        return
    for k in kinds:
        out_console.print(f"[bold]{k}[/]:")
        # a grid: a long description wraps inside its own column at any terminal width
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for n in list_presets(k):
            grid.add_row(Text(f"  {n}"), Text(_preset_line(k, n)))
        out_console.print(grid)


def _preset_line(kind: str, name: str) -> str:
    """One line that says what a preset is (its size, its layout, where its numbers come from)."""
    if kind == "system":
        from simumax.config.hardware import preset_provenance

        return preset_provenance(name)
    if kind == "strategy":
        st = load_strategy(name)
        parts = [f"tp{st.tp_size} pp{st.pp_size} dp{st.dp_size}"] + ([f"ep{st.ep_size}"] if st.ep_size > 1 else [])
        parts += [f"{st.world_size} GPUs", f"mbs {st.micro_batch_size} x {st.micro_batch_num}", f"recompute {st.recompute_mode}"]
        return ", ".join(parts)
    m = load_model(name)
    kind_text = f"MoE {m.expert_num} experts top-{m.topk}" if m.is_moe else "dense"
    origin = " (SimuMax's file as it ships it)" if name in SIMUMAX_MODEL_FILES else ""
    twin = SIMUMAX_COUNTERPARTS.get(name)
    if twin is not None:
        theirs, ours = m.model_dump(), load_model(twin).model_dump()
        differ = [k for k in theirs if k != "model_name" and theirs[k] != ours[k]]
        shown = ", ".join(differ[:4]) + (" ..." if len(differ) > 4 else "")
        origin = f" (SimuMax's file as it ships it; the published model is {twin}, which differs in {shown})"
    return f"{kind_text}, {m.layer_num} layers, hidden {m.hidden_size}, vocabulary {m.vocab_size}{origin}"


# model presets that are SimuMax's own files, kept unchanged for its users (our presets of the
# same models carry the published architecture: deepseek-v3, llama3.1-8b, kimi-k2, ...)
SIMUMAX_MODEL_FILES = frozenset({
    'aquila2-13b', 'aquila2-34b', 'aquila2-70b', 'aquila2-7b', 'deepseek-16b', 'deepseek-1b', 'deepseek-32b',
    'deepseekv2', 'deepseekv2-lite', 'deepseekv3', 'gpt3-175b', 'kimi-1T', 'ling-1T', 'llama-33b',
    'llama2-13b', 'llama2-70b', 'llama2-7b', 'llama2-tiny', 'llama3-405b_padding_128', 'llama3-70b',
    'llama3-8b', 'megatron-1t', 'megatron-22b', 'megatron-530b', 'mixtral-8x1b', 'mixtral-8x7b', 'moe-8T',
    'qwen3-32b',
})
# SimuMax files of a model we also ship as published (routing, padding, vocabulary as released):
# not two names for one model, two configurations of it; `presets` says how they differ
SIMUMAX_COUNTERPARTS = {
    "deepseekv2": "deepseek-v2", "deepseekv2-lite": "deepseek-v2-lite", "deepseekv3": "deepseek-v3", "kimi-1T": "kimi-k2",
    "llama3-8b": "llama3.1-8b", "llama3-70b": "llama3.1-70b", "llama3-405b_padding_128": "llama3.1-405b",
}


@app.command()
def schema(kind: str = typer.Argument(..., help="model, strategy or system.")) -> None:
    """Print the JSON Schema of one config format (for editors)."""
    classes = {"model": ModelConfig, "strategy": StrategyConfig, "system": SystemConfig}
    if kind not in classes:
        raise ConfigError("kind", "must be model, strategy or system")
    sys.stdout.write(json.dumps(classes[kind].model_json_schema(), indent=2) + "\n")


def main() -> None:
    """Entry point: bad input prints one line and exits 2, never a traceback."""
    try:
        app(standalone_mode=False)
    except ConfigError as exc:
        err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except OSError as exc:  # a file or folder the OS refused: one line, never a traceback
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        err_console.print(f"error: {exc.strerror or exc}{where}", markup=False, highlight=False, soft_wrap=True)
        raise SystemExit(2) from None
    except Exception as exc:  # click usage errors (typer may vendor its own click)
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise


if __name__ == "__main__":
    main()
