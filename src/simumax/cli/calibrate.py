"""``calibrate``, ``calibrate-comm`` and ``check-step``: measure a machine, check a real step."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from simumax import cli  # the app and its consoles (cli.out_console is read at call time: tools swap it)
from simumax.atomic import dumps_finite, write_json_atomic
from simumax.cli.options import SetOpt, _int_list, apply_overrides
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.report import format as fmt


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


@cli.app.command()
def calibrate(
    model: list[str] = typer.Option(..., "--model", "-m", help="Model preset or JSON (repeat with --strategy for several jobs)."),
    strategy: list[str] = typer.Option(..., "--strategy", "-s", help="Strategy preset or JSON, one per --model."),
    out: Path = typer.Option(..., "--out", help="System JSON to write (a NAME.report.json with every timing goes beside it)."),
    base: Optional[str] = typer.Option(None, "--base", help="System preset or JSON to merge into (peaks and networks kept)."),
    name: Optional[str] = typer.Option(None, "--name", help="sys_name of the written config."),
    device: Optional[str] = typer.Option(None, "--device", help="torch device (default cuda if available, else cpu)."),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", help="bf16 peak (default: base, datasheet by device name, else measured)."),
    hbm_gbps: Optional[float] = typer.Option(None, "--hbm-gbps", help="Memory bandwidth peak in GB/s (same defaults)."),
    num_per_node: int = typer.Option(8, "--num-per-node", help="Accelerators per node when no --base."),
    warmup: int = typer.Option(3, "--warmup", min=0),
    repeats: int = typer.Option(10, "--repeats", min=1),
    cooldown: Optional[float] = typer.Option(
        None, "--cooldown", min=0.0,
        help="Idle seconds before each GEMM/attention kernel, timed then for at most 20 ms: its rate at full clock, "
             "before a power limit lowers it (default 0.3 on a GPU, 0 on CPU; 0: kernels back to back, as before)."),
    power_curve: bool = typer.Option(
        True, "--power-curve/--no-power-curve",
        help="With --cooldown on a GPU: also measure how the power limit slows tensor-core kernels by their share "
             "of the time (~40 s), written as accelerator.power_curve."),
    sm_contention: bool = typer.Option(
        True, "--sm-contention/--no-sm-contention",
        help="With --cooldown on a GPU: also measure how GEMMs slow beside a kernel that holds SMs (~25 s; what the "
             "flex dispatcher's SMs cost the compute they overlap), written as accelerator.sm_contention."),
    set_: list[str] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the written system config as JSON."),
) -> None:
    """Time the kernels the jobs run on this GPU; write a system config.

    GEMM, grouped GEMM, attention and memory-bound kernels (fp8 GEMMs too, for jobs with fp8:
    as TransformerEngine runs them)."""
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
    with Progress(*columns, console=cli.err_console, transient=True, disable=as_json) as bar:
        task = bar.add_task("timing kernels", total=None)
        system, report = calibrate_jobs(
            jobs, base_cfg, name, device, warmup, repeats, peak_tflops, hbm_gbps, num_per_node,
            progress=lambda i, n: bar.update(task, completed=i, total=n), cooldown=cooldown, power_curve=power_curve,
            on_phase=lambda what: bar.update(task, description=what), sm_contention=sm_contention,
        )
    write_json_atomic(out, system)
    write_json_atomic(out.with_name(out.stem + ".report.json"), report)
    if as_json:
        cli.out_console.print_json(dumps_finite(system))
        return
    cli.out_console.print(fmt.calibration_table(report))
    cli.out_console.print(f"wrote {out} ({len(report['kernels'])} kernels measured on {report['device']}, "
                      f"peak {report['peak_tflops']:.1f} TFLOP/s from {report['peak_source']})", markup=False)


@cli.app.command("calibrate-comm")
def calibrate_comm(
    out: Path = typer.Option(..., "--out", help="System JSON to write (rank 0)."),
    base: Optional[str] = typer.Option(None, "--base", help="System preset or JSON to merge into."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Network tier to write (default high_intra_node on one node, else inter_node)."),
    sizes: str = typer.Option("64K,1M,16M,64M", "--sizes", help="Message sizes (bytes; K/M/G suffixes)."),
    group_sizes: Optional[str] = typer.Option(None, "--group-sizes", help="Group sizes to time (default the world size)."),
    warmup: int = typer.Option(3, "--warmup", min=0),
    repeats: int = typer.Option(10, "--repeats", min=1),
    contention: bool = typer.Option(True, "--contention/--no-contention", help="Also measure how much the reduce-scatter, "
                                    "all-gather and all-to-all slow GEMMs beside them: the tier's processor_usage (a few seconds)."),
) -> None:
    """Under torchrun: time all-reduce / all-gather / reduce-scatter / all-to-all / p2p, fit α-β, write the tier."""
    from simumax.calibrate.comm_points import report_notes
    from simumax.calibrate.run import calibrate_collectives

    base_cfg = load_system(base) if base else None
    groups = _int_list(group_sizes, "--group-sizes") if group_sizes else None
    system, report, rank0 = calibrate_collectives(_sizes(sizes, "--sizes"), groups, tier, base_cfg, warmup, repeats,
                                                  contention)
    if rank0:
        write_json_atomic(out, system)
        write_json_atomic(out.with_name(out.stem + ".comm_report.json"), report)
        for name in report["tiers"] or [report["tier"]]:
            cli.out_console.print(fmt.comm_table({**report, "tier": name}, system), markup=False)
        cli.print_notes(report_notes(report))


@cli.app.command("check-step")
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
    fp8: Optional[str] = typer.Option(
        None, "--fp8", help="Run the layers' linears as TransformerEngine's fp8 linears with this recipe "
                            "(delayed or tensorwise; needs fp8 GEMMs: Hopper or later) and predict the same."),
    sync_phases: bool = typer.Option(
        False, "--sync-phases", help="Wait for the GPU after every forward, backward and optimizer phase (as check-step "
                                     "timed before 2026-11-27; the GPU idles while the next phase is launched)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write check_step.json here."),
) -> None:
    """Train a Llama-style model for a few steps with plain PyTorch; print measured vs predicted time and memory."""
    from simumax.calibrate.run import check_step

    m, _, sy = apply_overrides(load_model(model), load_strategy("tp1_pp1_dp8_mbs1"), load_system(system),
                               [s if s.startswith("model.") else f"model.{s}" for s in set_])
    row = check_step(m, sy, seq_len, mbs, mbc, steps, warmup, device, profile, compile_, fp8_recipe=fp8,
                     sync_phases=sync_phases)
    if out is not None:
        write_json_atomic(out / "check_step.json", row)
    if as_json:
        cli.out_console.print_json(dumps_finite(row))
        return
    cli.out_console.print(fmt.check_step_table(row))
