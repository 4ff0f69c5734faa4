"""``validate``: predictions against measured runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from simumax import cli  # the app and its consoles (cli.out_console is read at call time: tools swap it)
from simumax.atomic import dumps_finite, write_json_atomic
from simumax.errors import ConfigError
from simumax.report import format as fmt


FIT_HINT_BIAS = 0.03  # a signed mean error past this on one cluster's runs suggests fit-runs


def _one_system(file: Path, system: Optional[str]) -> bool:
    """Whether every run of the file is estimated on one system (fit-runs' case)."""
    from simumax.validate import load_cases

    return system is not None or len({json.dumps(c["system"], sort_keys=True) for c in load_cases(file)}) == 1


@cli.app.command()
def validate(
    file: Path = typer.Argument(..., help="Validation JSONL (schema: shared/validation/README.md)."),
    reference_root: Optional[Path] = typer.Option(None, help="Folder config paths are relative to (default: ../reference beside the file's folder if there is one, else the file's folder)."),
    as_json: bool = typer.Option(False, "--json", help="Print per-case results and the summary as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write validation.json and validation.png (each run's time error and band) to this folder."),
    system: Optional[str] = typer.Option(None, "--system", "-y", help="Run every case on this system (e.g. one from "
                                         "fit-runs) instead of the one it names."),
) -> None:
    """Compare predictions with measured runs: time and peak memory error per case."""
    from simumax.validate import ranking, run_file, summary, summary_by_family, summary_by_source
    from simumax.validate_split import step_split

    results = run_file(file, reference_root, system)
    summ = summary(results)
    by_family = summary_by_family(results)
    by_source = summary_by_source(results)
    ranks = ranking(results)
    split = step_split(results)
    payload = {"cases": [r.to_dict() for r in results], "summary": summ, "by_family": by_family, "by_source": by_source,
               "ranking": ranks, "micro_batch_split": split}
    if out is not None:
        write_json_atomic(out / "validation.json", payload)
        if any(r.time_error is not None for r in results):
            from simumax.report.validation_chart import plot

            plot(results, out / "validation.png", f"{file.name}: time error per run, bar: its 80 % band")
    if as_json:
        cli.out_console.print_json(dumps_finite(payload))
        return
    t = Table(title=f"validation: {file.name}")
    # SimuMax's own errors where the file records them (its validation files); a user's runs
    # leave the two columns out, and the case names get their width
    simumax = any(r.reference_time_error is not None or r.reference_mem_error is not None for r in results)
    cols = ["case", "pred ms", "real ms", "err", "SimuMax err", "pred GiB", "real GiB", "err", "SimuMax err"]
    keep = [i for i, c in enumerate(cols) if simumax or c != "SimuMax err"]
    for i in keep:
        t.add_column(cols[i], justify="left" if i == 0 else "right")
    pct = lambda x: "-" if x is None else f"{x:+.1%}"  # noqa: E731
    apct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731
    opt = lambda x, f: "-" if x is None else f(x)  # noqa: E731
    for r in results:
        if r.skipped:
            t.add_row(r.id, "skipped", *[""] * (len(keep) - 3), r.skipped.split(": ", 1)[-1][:40])
            continue
        # memory compared as weights + grads + optimizer + stored activations (*) or as peak reserved (‡)
        star = {"states_plus_activations": "*", "peak_reserved": "‡"}.get(r.mem_measure, "")
        derived = "§" if r.time_from == "tflops_per_gpu" else ""  # real time from the TFLOP/s given
        cells = [
            r.id + ("†" if r.record_does_not_fit else ""), opt(r.predicted_time, fmt.ms), opt(r.measured_time, fmt.ms) + derived,
            pct(r.time_error), pct(r.reference_time_error),
            opt(r.predicted_mem, fmt.gib) + star, opt(r.measured_mem, fmt.gib) + star, pct(r.mem_error), pct(r.reference_mem_error),
        ]
        t.add_row(*[cells[i] for i in keep])
    cli.out_console.print(t)
    if any(r.mem_measure == "states_plus_activations" for r in results):
        cli.out_console.print("* weights + grads + optimizer + stored activations of the first stage (no transient buffers)", markup=False)
    if any(r.mem_measure == "peak_reserved" for r in results):
        cli.out_console.print("‡ peak reserved by the caching allocator (torch.cuda.max_memory_reserved; the prediction: "
                              "peak allocated / the strategy's mem_factor), max over stages", markup=False)
    if any(r.time_from == "tflops_per_gpu" for r in results):
        cli.out_console.print("§ real time from the record's tflops_per_gpu: SimuMax's FLOPs per GPU (6 x parameters but the "
                              "input embedding + non-causal attention, Megatron-LM's logged convention before 2025) over "
                              "that rate", markup=False)
    if any(r.record_does_not_fit for r in results):
        cli.out_console.print("† ran, but the recorded strategy does not fit the GPU in the memory model (reserved bytes): its "
                          "record misses a memory-saving setting (recompute, fp8 parameters, offload) or the model "
                          "over-predicts its memory; its time is compared as recorded", markup=False)

    def line(label: str, s: dict) -> str:
        text = (
            f"{label}{s['evaluated']}/{s['cases']} cases: time ({s['time_cases']}) mean |err| {apct(s['time_mean_abs_error'])}"
            f" max {apct(s['time_max_abs_error'])} signed mean {pct(s['time_mean_error'])}"
            + (f" (SimuMax {apct(s['reference_time_mean_abs_error'])} / {apct(s['reference_time_max_abs_error'])})" if simumax else "")
            + ";"
            f" memory ({s['mem_cases']}) mean |err| {apct(s['mem_mean_abs_error'])} max {apct(s['mem_max_abs_error'])}"
        )
        if s["band_coverage"] is not None:
            text += f"; 80 % band holds {apct(s['band_coverage'])} (median width {apct(s['band_median_width'])})"
        if s["mem_band_coverage"] is not None:
            text += f"; memory band holds {apct(s['mem_band_coverage'])}"
        return text + (f"; {s['skipped']} skipped" if s["skipped"] else "")

    if len(by_source) > 1:
        for source, s in by_source.items():
            cli.out_console.print(line(f"{source}: ", s), markup=False)
    if len(by_family) > 1:
        for family, s in by_family.items():
            cli.out_console.print(line(f"{family}: ", s), markup=False)
    cli.out_console.print(line("all: " if len(by_family) > 1 or len(by_source) > 1 else "", summ), markup=False)
    bias = summ["time_mean_error"]
    if bias is not None and abs(bias) > FIT_HINT_BIAS and summ["time_cases"] >= 2 and _one_system(file, system):
        cli.out_console.print(f"these runs are {abs(bias):.1%} {'slower' if bias < 0 else 'faster'} than predicted on "
                              f"average: `simumax fit-runs {file} --out my_cluster.json` fits the system to them "
                              "(docs/calibration.md)", markup=False)
    if ranks["groups"]:
        rho = ranks["mean_spearman"]
        cli.out_console.print(
            f"ranking: {len(ranks['groups'])} groups of cases with the same model, GPUs, global batch and sequence:"
            f" mean Spearman {'-' if rho is None else f'{rho:.2f}'}, regret of the predicted-fastest mean"
            f" {apct(ranks['mean_regret'])} max {apct(ranks['max_regret'])}", markup=False,
        )
    if split:
        cli.out_console.print(
            f"per micro-batch vs per iteration ({len(split)} group{'s' if len(split) > 1 else ''} of runs that differ only in micro-batch and GPU counts;"
            " time = fixed + per micro-batch x micro-batches, least squares):", markup=False)
        for g in split:
            r, p = g["real"], g["predicted"]
            cli.out_console.print(
                f"  {g['cases'][0]} (+{len(g['cases']) - 1}, micro-batches {'/'.join(map(str, g['micro_batches']))}):"
                f" per micro-batch {fmt.ms(r['per_micro_batch'])} ms real, {fmt.ms(p['per_micro_batch'])} predicted"
                f" ({pct(g['per_micro_batch_error'])}); fixed {fmt.ms(r['fixed'])} ms real, {fmt.ms(p['fixed'])} predicted"
                f" (real points off the line by up to {apct(r['max_residual'])})", markup=False)


@cli.app.command("fit-runs")
def fit_runs(
    file: Path = typer.Argument(..., help="Your measured runs, JSONL in the validation schema (measured.iter_time_ms)."),
    out: Path = typer.Option(..., "--out", help="Write the fitted system config here, and the fit and its chart beside it (my.json: my.fit.json, my.fit.png)."),
    system: Optional[str] = typer.Option(None, "--system", "-y", help="Base system (default: the one the runs name)."),
    resource: Optional[list[str]] = typer.Option(
        None, "--resource", help="Resources to fit (repeat): compute, hbm, scale_up, scale_out, latency, host. "
        "Default: compute, hbm, scale_up, scale_out."),
    noise_sd: float = typer.Option(0.04, help="Spread of ln(time) a run keeps once its hardware is right."),
    prior_sd: float = typer.Option(0.2, help="Spread of ln(factor) a resource may stray from the base's value."),
    reference_root: Optional[Path] = typer.Option(None, help="Folder config paths are relative to (default: ../reference beside the file's folder if there is one, else the file's folder)."),
    as_json: bool = typer.Option(False, "--json", help="Print the fit as JSON."),
    plot_format: str = typer.Option("png", "--plot-format", help="The chart's format: png, svg or none."),
) -> None:
    """Fit a system's resources (tensor cores, HBM, links) to measured runs of your own
    cluster; write it for every later estimate."""
    from simumax.fit_runs import DEFAULT_RESOURCES, fit_file
    from simumax.uncertainty import Z80

    if plot_format not in ("png", "svg", "none"):
        raise ConfigError("--plot-format", "must be png, svg or none")
    res = fit_file(file, system, reference_root, resources=tuple(resource or DEFAULT_RESOURCES), noise_sd=noise_sd,
                   prior_sd=prior_sd)
    report = res.to_dict()
    write_json_atomic(out, res.system.model_dump())
    write_json_atomic(out.with_name(out.stem + ".fit.json"), report)
    if plot_format != "none":
        from simumax.report.fit_runs import plot

        plot(res, out.with_name(f"{out.stem}.fit.{plot_format}"))
    if as_json:
        cli.out_console.print_json(dumps_finite(report))
        return
    t = Table(title=f"{res.base}: resources fitted to {len(res.rows)} runs")
    for col in ("resource", "factor", "80 % range", "fields"):
        t.add_column(col, justify="left" if col in ("resource", "fields") else "right")
    for row in report["resources"]:  # the 80 % range of the posterior: ln factor ± Z80 · sd
        f, sd = row["factor"], row["sd_log"]
        t.add_row(row["name"], f"x{f:.3f}", f"{f * math.exp(-Z80 * sd):.2f}–{f * math.exp(Z80 * sd):.2f}", row["fields"])
    cli.out_console.print(t)
    r = Table(title="runs (ms): measured, on the base system, on the fitted one, fitted without the run")
    r.add_column("run", overflow="fold")  # a narrow terminal folds the name, never a number
    for col in ("real", "base", "err", "fitted", "err", "left out", "err"):
        r.add_column(col, justify="right", no_wrap=True)
    pct = lambda x: f"{x:+.1%}"  # noqa: E731
    for row in res.rows:
        e = row.to_dict()
        r.add_row(row.id, fmt.ms(row.measured), fmt.ms(row.before), pct(e["error_before"]), fmt.ms(row.after),
                  pct(e["error_after"]), fmt.ms(row.loo), pct(e["error_loo"]))
    cli.out_console.print(r)
    mean = lambda key: sum(abs(x[key]) for x in report["runs"]) / len(report["runs"])  # noqa: E731
    cli.out_console.print(
        f"mean |err|: base {mean('error_before'):.1%}, fitted {mean('error_after'):.1%}, each run left out of the fit "
        f"{mean('error_loo'):.1%} (what to expect on a run the fit has not seen, on this cluster)", markup=False)
    for note in res.notes:
        cli.out_console.print(f"note: {note}", markup=False)
    chart = "" if plot_format == "none" else f", {out.with_name(f'{out.stem}.fit.{plot_format}')}"
    cli.out_console.print(f"wrote {out} (use it as --system {out}), {out.with_name(out.stem + '.fit.json')}{chart}", markup=False)
