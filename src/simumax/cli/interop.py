"""``import hf``, ``import megatron`` and ``export``: configs from and to other tools."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from simumax import cli  # the app and its consoles (cli.out_console is read at call time: tools swap it)
from simumax.atomic import dumps_finite, write_json_atomic
from simumax.cli.options import GbsOpt, ModelOpt, SetOpt, StrategyOpt, WorldSizeOpt, load_job
from simumax.config.base import check_readable_file
from simumax.config.loader import load_strategy, load_system
from simumax.errors import ConfigError

import_app = typer.Typer(no_args_is_help=True, help="Configs from a Hugging Face config.json or a Megatron-LM command line.")
cli.app.add_typer(import_app, name="import")


@import_app.command("hf")
def import_hf(
    path: Path = typer.Argument(..., help="A local Hugging Face config.json (no network)."),
    name: Optional[str] = typer.Option(None, "--name", help="model_name (default: the folder or file name)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the model config JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the model config as JSON."),
) -> None:
    """Hugging Face config.json (Llama, Mistral, Qwen2/3, Phi-3, OLMo 2/3, Seed-OSS, Gemma 1-3, Mixtral, Qwen-MoE,
    MiniMax-M2, OLMoE, ERNIE 4.5 MoE, dots.llm1, GPT-OSS, DeepSeek-V2/V3, Kimi K2.5, GLM-4.5, GLM-4.7-Flash, Llama 4,
    Qwen3-Next, Qwen3.5, Nemotron-H, Granite 4.0-H) -> model config."""
    from simumax.estimate import Estimate
    from simumax.importers.hf import load_hf_config

    model, notes = load_hf_config(path, name)
    if out is not None:
        write_json_atomic(out, model.to_dict())
    cli.print_notes(notes)
    if as_json or out is None:
        cli.out_console.print_json(dumps_finite(model.to_dict()))
    params = Estimate(model, load_strategy("tp1_pp1_dp8_mbs1").with_updates({"world_size": 1}, source="import"), load_system("a100_pcie")).params
    cli.err_console.print(f"{model.model_name}: {params.total / 1e9:.2f} B parameters ({params.active / 1e9:.2f} B active)", markup=False)


@import_app.command("megatron")
def import_megatron(
    args: Optional[list[str]] = typer.Argument(None, help="The arguments after `--` (simumax import megatron -- --num-layers 32 ...), or use --file."),
    file: Optional[Path] = typer.Option(None, "--file", help="A launch script or a file holding the arguments."),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="GPUs of the job (default: DP 1)."),
    name: str = typer.Option("megatron", "--name", help="model_name."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write model.json and strategy.json into this folder."),
    as_json: bool = typer.Option(False, "--json", help="Print both configs as JSON."),
    log: Optional[Path] = typer.Option(None, "--log", help="The job's training log: its step time and peak memory, "
                                       "recorded with the configs as a run in --runs."),
    runs: Optional[Path] = typer.Option(None, "--runs", help="With --log: the runs file (JSONL) to add the run to, for "
                                        "simumax validate and fit-runs."),
    system: Optional[str] = typer.Option(None, "--system", "-y", help="With --log: the system (preset or file) the job ran on."),
    run_id: Optional[str] = typer.Option(None, "--id", help="With --log: the run's name (default: the log file's name)."),
) -> None:
    """Megatron-LM pretrain_gpt.py arguments -> model + strategy configs (with --log: a measured run)."""
    if log is not None and (runs is None or system is None):
        raise ConfigError("--runs" if runs is None else "--system", "--log records a run: give the runs file (--runs) "
                          "and the system it ran on (--system)")
    if log is None and (runs is not None or system is not None or run_id is not None):
        raise ConfigError("--log", "--runs, --system and --id record a measured run: give its training log (--log)")
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
    cli.print_notes(notes)
    if log is not None and runs is not None and system is not None:
        _record_run(log, runs, system, run_id, model, strategy)
        if not as_json:
            return
    cli.out_console.print_json(dumps_finite({"model": model.to_dict(), "strategy": strategy.to_dict()}))


@import_app.command("nccl-tests")
def import_nccl_tests(
    files: list[Path] = typer.Argument(..., help="nccl-tests outputs (rank 0's): all_reduce_perf, all_gather_perf, "
                                       "reduce_scatter_perf, alltoall_perf, sendrecv_perf; one or several hosts."),
    base: str = typer.Option(..., "--base", "-y", help="System (preset or file) the tiers are fitted into."),
    out: Path = typer.Option(..., "--out", help="Write the system here, and the fit beside it (my.json: my.comm_report.json)."),
    op: Optional[str] = typer.Option(None, "--op", help="The test, where neither the output nor the file name says."),
    tier: Optional[str] = typer.Option(None, "--tier", help="Fit every file into this tier with the flat ring formula "
                                       "(default: one host -> the node's tier, several -> inter_node, as the model "
                                       "splits such groups)."),
    as_json: bool = typer.Option(False, "--json", help="Print the system as JSON."),
) -> None:
    """nccl-tests results -> the system's network tiers (efficiency and latency per collective)."""
    from simumax.calibrate.comm_points import report_notes
    from simumax.importers.nccl_tests import parse_nccl_tests, system_from_nccl_tests
    from simumax.report import format as fmt

    runs = [parse_nccl_tests(f, op) for f in files]
    system, report = system_from_nccl_tests(runs, load_system(base).to_dict(), tier)
    load_system(system)  # a tier the fit made unusable is an error here, not in a later estimate
    write_json_atomic(out, system)
    write_json_atomic(out.with_name(out.stem + ".comm_report.json"), report)
    if as_json:
        cli.out_console.print_json(dumps_finite(system))
        return
    for name in report["tiers"]:
        cli.out_console.print(fmt.comm_table({**report, "tier": name, "world_size": max(r.ranks for r in runs)}, system),
                              markup=False)
    cli.print_notes(report_notes(report))
    cli.out_console.print(f"wrote {out} ({', '.join(f'{n} points -> {t}' for t, n in report['tiers'].items()) or 'nothing fitted'})",
                          markup=False)


def _record_run(log: Path, runs: Path, system: str, run_id: Optional[str], model, strategy) -> None:  # noqa: ANN001
    """The configs and the log's step time and peak memory as one line of ``runs``."""
    from simumax.config.base import read_text
    from simumax.importers.megatron_log import parse_megatron_log
    from simumax.validate import GIB, append_case

    check_readable_file(log, "a training log", "--log")
    parsed, notes = parse_megatron_log(read_text(log, "--log"), str(log))
    load_system(system)  # a system that does not load is refused now, not when the runs are read
    if system.endswith(".json") or Path(system).exists():
        system = str(Path(system).resolve())  # validate and fit-runs read the file from anywhere
    measured = {"iter_time_ms": parsed.step_ms}
    if parsed.max_allocated is not None:
        measured["peak_alloc_gib"] = parsed.max_allocated / GIB
    if parsed.max_reserved is not None:
        measured["peak_reserved_gib"] = parsed.max_reserved / GIB
    case = {"id": run_id or log.stem, "system": system, "model": model.to_dict(), "strategy": strategy.to_dict(),
            "measured": measured, "source": {"log": str(log.resolve()), "intervals": len(parsed.intervals)}}
    append_case(runs, case)
    cli.print_notes(notes)
    mem = f", peak allocated {measured['peak_alloc_gib']:.2f} GiB" if "peak_alloc_gib" in measured else ""
    cli.err_console.print(f"{case['id']}: {parsed.step_ms:.1f} ms per iteration (median of {max(1, len(parsed.intervals) - 1)} "
                          f"logged intervals){mem}; added to {runs}", markup=False, soft_wrap=True)


@cli.app.command()
def export(
    model: str = ModelOpt,
    strategy: str = StrategyOpt,
    set_: list[str] = SetOpt,
    world_size: Optional[int] = WorldSizeOpt,
    gbs: Optional[int] = GbsOpt,
    out: Optional[Path] = typer.Option(None, "--out", help="Also write megatron_flags.txt (torchtitan.toml, ds_config.json) here."),
    as_json: bool = typer.Option(False, "--json", help="Print the flags as a JSON list."),
    fmt_: str = typer.Option("megatron", "--format", help="megatron (flags), torchtitan (a job-config TOML snippet) or "
                             "deepspeed (a ds_config.json)."),
) -> None:
    """Model + strategy as Megatron-LM flags, a torchtitan job config or a DeepSpeed config.

    Megatron-LM flags are the inverse of `import megatron`; `--format torchtitan` writes a
    job-config snippet (FSDP2: zero_state 3), `--format deepspeed` a ds_config.json
    (fsdp_impl deepspeed)."""
    from simumax.atomic import write_text_atomic
    from simumax.export.megatron_flags import job_flags

    if fmt_ not in ("megatron", "torchtitan", "deepspeed"):
        raise ConfigError("--format", f"must be megatron, torchtitan or deepspeed (got {fmt_!r})")
    m, st, _ = load_job(model, strategy, "a100_pcie", set_, world_size=world_size, gbs=gbs)  # flags need no system
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
    flags = job_flags(st, m)
    if out is not None:
        write_text_atomic(out / "megatron_flags.txt", " \\\n".join(flags) + "\n")
    if as_json:
        cli.out_console.print_json(dumps_finite(flags))
        return
    sys.stdout.write(" \\\n".join(flags) + "\n")
