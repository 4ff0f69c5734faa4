"""``search``: the fastest strategy that fits, and the files it writes."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Optional

import typer

from simumax import cli  # the app and its consoles (cli.out_console is read at call time: tools swap it)
from simumax.atomic import dumps_finite, write_json_atomic
from simumax.cli.options import ModelOpt, SetOpt, SystemOpt, _int_list, _say_written, _str_list, apply_overrides
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.report import format as fmt


DEFAULT_BASE = {False: "tp1_pp1_dp8_mbs1", True: "ep8_pp1_dp8_mbs1"}  # without -s: dense, MoE


@cli.app.command()
def search(
    model: str = ModelOpt,
    strategy: Optional[str] = typer.Option(
        None, "--strategy", "-s",
        help="Base strategy (seq_len, dtype, kernels ...); default tp1_pp1_dp8_mbs1 (ep8_pp1_dp8_mbs1 for a MoE "
             "model): sequence 4096, bf16, ZeRO-1, flash attention, SP."),
    system: str = SystemOpt,
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
    fsdp: Optional[str] = typer.Option(None, "--fsdp", help="Sharded-DP implementations to try: megatron_fsdp, torch_fsdp2 (torchtitan) and megatron_torch_fsdp2 (ZeRO-3 only), deepspeed (ZeRO 1-3; default: the base strategy's)."),
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
    base_model = load_model(model)
    if strategy is None:
        strategy = DEFAULT_BASE[base_model.is_moe]
        cli.err_console.print(f"base strategy: {strategy} (give -s to choose another)", highlight=False)
    m, st, sy = apply_overrides(base_model, load_strategy(strategy, checked=False), load_system(system), set_, checked=False)
    # the base gives the fields the search does not vary; a base file written without the job
    # size (world_size 8 beside tp 8 x pp 16; one micro-batch with interleaving) is read as a job
    # on the searched cluster at the searched batch (every candidate takes its own count from --gbs)
    layout = st.tp_size * st.cp_size * st.pp_size
    job: dict[str, int] = {} if st.world_size % layout == 0 else {"world_size": world_size}
    per_step = st.micro_batch_size * (job.get("world_size", st.world_size) // layout)
    if global_batch_size and per_step and global_batch_size % per_step == 0:
        job["micro_batch_num"] = global_batch_size // per_step
    st = st.with_updates(job, source=st.source or "strategy")
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
        with Progress(*columns, console=cli.err_console, transient=True, disable=as_json) as bar:
            task = bar.add_task("evaluating", total=None)
            rows = run_search(
                m, sy, st, space, gmi_error=gmi_error, use_reserved_memory=not allocated, jobs=jobs, executor=executor,
                jsonl=jsonl, resume=resume, progress=lambda i, n: bar.update(task, completed=i, total=n),
            )
    except SearchInterrupted as exc:
        cli.err_console.print(f"interrupted: {len(exc.rows)} rows kept in {exc.path}; rerun with --resume to finish" if exc.path
                          else f"interrupted after {len(exc.rows)} rows (use --out to keep them)", soft_wrap=True)
        raise SystemExit(130) from None
    if not rows:
        from simumax.search.space import empty_space_error

        raise empty_space_error(m, sy, st, space)
    if out is not None:
        _write_search_outputs(out, rows, m, sy, float(sy.mem_bytes) - gmi_error * 2**30)
    if as_json:
        cli.out_console.print_json(dumps_finite([r.to_dict() for r in rows]))
        return
    cli.out_console.print(fmt.search_table(rows[:top], float(sy.mem_bytes), gmi_error, reserved=not allocated))
    if rows and not rows[0].fits:
        short = min(-r.headroom for r in rows)  # headroom = budget - peak
        cli.err_console.print(
            f"nothing fits: the closest candidate needs {short / 2**30:.1f} GiB more per GPU than the budget; widen the space "
            "(--pp, --tp, --ep for MoE, --cp for long sequences, --recompute full_block, --zero 1,2,3, "
            "--offload optimizer,activations) or use more GPUs",
            markup=False, soft_wrap=True,
        )
    if rows and rows[0].fits:
        from simumax.export.megatron_flags import job_flags

        try:
            flags = " ".join(job_flags(StrategyConfig.init_from_dict(rows[0].strategy or {}), m))
        except ConfigError as exc:  # an option Megatron-LM cannot run as estimated
            flags = f"none: {exc}"
        cli.out_console.print("best as Megatron-LM flags:", markup=False)
        cli.out_console.print(flags, markup=False, soft_wrap=True)


def _write_search_outputs(out: Path, rows: list, model: ModelConfig, system: SystemConfig, budget: float) -> None:
    """CSV, frontier plot, and the best strategy as JSON and as Megatron-LM flags."""
    from simumax.atomic import write_text_atomic
    from simumax.export.megatron_flags import job_flags
    from simumax.report.frontier import plot_frontier
    from simumax.search.table import search_csv

    t0 = time.time()
    write_text_atomic(out / "search.csv", search_csv(rows))
    plot_frontier(rows, out / "frontier.png", budget, f"{model.model_name} on {system.sys_name}")
    if rows and rows[0].fits:
        best = StrategyConfig.init_from_dict(rows[0].strategy or {})
        write_json_atomic(out / "best_strategy.json", best.to_dict())
        try:
            write_text_atomic(out / "best_megatron_flags.txt", " \\\n".join(job_flags(best, model)) + "\n")
        except ConfigError as exc:  # an option Megatron-LM cannot run as estimated
            write_text_atomic(out / "best_megatron_flags.txt", f"# none: {exc}\n")
    _say_written(out, t0)
