"""The ``simumax`` command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from simumax.api import PerfLLM
from simumax.atomic import write_json_atomic
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

SetOpt = typer.Option([], "--set", help="Override a field: [model.|strategy.|system.]key=value (JSON value).")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(model: ModelConfig, strategy: StrategyConfig, system: SystemConfig, sets: list[str]):
    upd: dict[str, dict[str, Any]] = {"model": {}, "strategy": {}, "system": {}}
    for item in sets:
        if "=" not in item:
            raise ConfigError("--set", f"expected key=value, got {item!r}")
        key, value = item.split("=", 1)
        target, _, field = key.partition(".") if key.split(".", 1)[0] in upd else ("", "", key)
        if not target:
            owners = [n for n, c in (("model", ModelConfig), ("strategy", StrategyConfig)) if field in c.model_fields]
            if not owners:
                raise ConfigError(key, "unknown field in model and strategy configs")
            target = owners[0]
        upd[target][field] = _parse_value(value)
    if upd["model"]:
        model = model.with_updates(upd["model"], source="--set")
    if upd["strategy"]:
        strategy = strategy.with_updates(upd["strategy"], source="--set")
    if upd["system"]:
        system = system.with_updates(upd["system"], source="--set")
    return model, strategy, system


@app.command()
def perf(
    model: str = typer.Option(..., "--model", "-m", help="Model preset name or JSON path."),
    strategy: str = typer.Option(..., "--strategy", "-s", help="Strategy preset name or JSON path."),
    system: str = typer.Option(..., "--system", "-y", help="System preset name or JSON path."),
    set_: list[str] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write compute/mem results and resolved configs here."),
) -> None:
    """Estimate one training iteration: time, MFU, throughput and memory per stage."""
    m, st, sy = apply_overrides(load_model(model), load_strategy(strategy), load_system(system), set_)
    p = PerfLLM().configure(strategy_config=st, model_config=m, system_config=sy)
    cost, mem = p.analysis_cost(), p.analysis_mem()
    if out is not None:
        p.analysis(out)
    if as_json:
        out_console.print_json(json.dumps({"cost": cost.to_dict(), "mem": mem.to_dict()}, sort_keys=True))
        return
    title = f"{m.model_name} | {sy.sys_name} | tp{st.tp_size} pp{st.pp_size} dp{st.dp_size} mbs{st.micro_batch_size} mbc{st.micro_batch_num}"
    out_console.print(fmt.summary_table(title, cost, mem))
    out_console.print(fmt.breakdown_table(cost))
    out_console.print(fmt.memory_table(mem))
    misses = cost.efficiency_lookups.get("misses", {})
    if misses:
        out_console.print(f"[yellow]{len(misses)} kernel shapes not in the efficiency table (family default used); see --json[/]")


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
        out_console.print_json(json.dumps(res.to_dict(), sort_keys=True))
        return
    out_console.print(fmt.simulation_table(res))
    for what, path in res.files.items():
        if not what.startswith("memory_timeline_rank") or what.endswith("rank0"):
            out_console.print(f"{what}: {path}")


def _int_list(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
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
    pp: Optional[str] = typer.Option(None, "--pp", help="PP sizes to try (default: divisors of the layer count)."),
    ep: str = typer.Option("1", "--ep", help="EP sizes to try (MoE)."),
    cp: str = typer.Option("1", "--cp", help="CP sizes to try."),
    mbs: str = typer.Option("1", "--mbs", help="Micro-batch sizes to try."),
    recompute: str = typer.Option("none,selective,full_block", "--recompute", help="Recompute types to try."),
    gmi_error: float = typer.Option(0.0, "--gmi-error", help="GiB kept free per GPU."),
    jobs: int = typer.Option(1, "--jobs", help="Worker processes."),
    top: int = typer.Option(10, "--top", help="Rows shown."),
    set_: list[str] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print all rows as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write search.jsonl and search.csv here."),
) -> None:
    """Search the fastest strategy that fits memory; print the top rows."""
    from rich.progress import Progress

    from simumax.atomic import write_jsonl_atomic
    from simumax.search.run import run_search
    from simumax.search.space import SearchSpace

    m, st, sy = apply_overrides(load_model(model), load_strategy(strategy), load_system(system), set_)
    space = SearchSpace(
        world_size=world_size, global_batch_size=global_batch_size or st.global_batch_size, tp=tuple(_int_list(tp, "--tp")),
        pp=tuple(_int_list(pp, "--pp")) if pp else None, ep=tuple(_int_list(ep, "--ep")), cp=tuple(_int_list(cp, "--cp")),
        mbs=tuple(_int_list(mbs, "--mbs")), recompute=tuple(r.strip() for r in recompute.split(",") if r.strip()),
    )
    with Progress(console=err_console, transient=True, disable=as_json) as bar:
        task = bar.add_task("evaluating", total=None)
        rows = run_search(m, sy, st, space, gmi_error=gmi_error, jobs=jobs, progress=lambda i, n: bar.update(task, completed=i, total=n))
    dicts = [r.to_dict() for r in rows]
    if out is not None:
        write_jsonl_atomic(out / "search.jsonl", dicts)
        _write_csv(out / "search.csv", rows)
    if as_json:
        out_console.print_json(json.dumps(dicts, sort_keys=True))
        return
    out_console.print(fmt.search_table(rows[:top], float(sy.mem_bytes), gmi_error))


def _write_csv(path: Path, rows: list) -> None:
    import csv
    import io

    from simumax.atomic import write_text_atomic

    cols = ["tp", "pp", "dp", "ep", "cp", "mbs", "mbc", "zero", "recompute", "recompute_layer_num", "fits", "iter_time", "mfu", "tokens_per_s_per_gpu", "peak_mem", "headroom"]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(cols)
    for r in rows:
        d = r.to_dict()
        w.writerow([d[c] for c in cols])
    write_text_atomic(path, buf.getvalue())


@app.command()
def validate(
    file: Path = typer.Argument(..., help="Validation JSONL (schema: shared/validation/README.md)."),
    reference_root: Optional[Path] = typer.Option(None, help="Folder config paths are relative to (default ../reference)."),
    as_json: bool = typer.Option(False, "--json", help="Print per-case results and the summary as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write validation.json to this folder."),
) -> None:
    """Compare predictions with measured runs: time and peak memory error per case."""
    from simumax.validate import run_file, summary

    results = run_file(file, reference_root)
    summ = summary(results)
    payload = {"cases": [r.to_dict() for r in results], "summary": summ}
    if out is not None:
        write_json_atomic(out / "validation.json", payload)
    if as_json:
        out_console.print_json(json.dumps(payload, sort_keys=True))
        return
    t = Table(title=f"validation: {file.name}")
    for col in ("case", "pred ms", "real ms", "err", "SimuMax err", "pred GiB", "real GiB", "err", "SimuMax err"):
        t.add_column(col, justify="left" if col == "case" else "right")
    pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
    apct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    for r in results:
        if r.skipped:
            t.add_row(r.id, "skipped", "", "", "", "", "", "", r.skipped.split(": ", 1)[-1][:40])
            continue
        t.add_row(
            r.id, fmt.ms(r.predicted_time), fmt.ms(r.measured_time), pct(r.time_error), pct(r.reference_time_error),
            fmt.gib(r.predicted_mem) if r.predicted_mem else "-", fmt.gib(r.measured_mem) if r.measured_mem else "-",
            pct(r.mem_error), pct(r.reference_mem_error),
        )
    out_console.print(t)
    s = summ
    line = (
        f"{s['evaluated']}/{s['cases']} cases: time mean |err| {apct(s['time_mean_abs_error'])} max {apct(s['time_max_abs_error'])}"
        f" (SimuMax {apct(s['reference_time_mean_abs_error'])} / {apct(s['reference_time_max_abs_error'])});"
        f" memory mean |err| {apct(s['mem_mean_abs_error'])} max {apct(s['mem_max_abs_error'])}"
    )
    if s["skipped"]:
        line += f"; {s['skipped']} skipped"
    out_console.print(line)


@app.command()
def presets(kind: Optional[str] = typer.Argument(None, help="model, strategy or system (default all).")) -> None:
    """List the shipped presets."""
    kinds = [kind] if kind else ["model", "strategy", "system"]
    for k in kinds:
        if k not in ("model", "strategy", "system"):
            raise ConfigError("kind", "must be model, strategy or system")
        out_console.print(f"[bold]{k}[/]: " + ", ".join(list_presets(k)))


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
    except Exception as exc:  # click usage errors (typer may vendor its own click)
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise


if __name__ == "__main__":
    main()
