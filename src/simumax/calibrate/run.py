"""What the ``calibrate``, ``calibrate-comm`` and ``check-step`` commands do, as functions."""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError

log = logging.getLogger(__name__)


def _torch():
    try:
        import torch
    except ImportError:  # optional extra
        raise ConfigError("torch", "calibration needs PyTorch: pip install 'simumax[calibrate]'") from None
    return torch


def calibrate_jobs(
    jobs: list[tuple[ModelConfig, StrategyConfig]],
    base: SystemConfig | None,
    name: str | None = None,
    device: str | None = None,
    warmup: int = 3,
    repeats: int = 10,
    peak_tflops: float | None = None,
    hbm_gbps: float | None = None,
    num_per_node: int = 8,
    progress: Callable[[int, int], None] | None = None,
    cooldown: float | None = None,
    power_curve: bool = True,
    on_phase: Callable[[str], None] | None = None,
    sm_contention: bool = True,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Time every kernel the jobs run; return (system dict, report dict).

    ``cooldown`` (default 0.3 s on a GPU, 0 on CPU): idle seconds before each compute
    kernel, timed then at full clock; with it on a GPU (and ``power_curve``) the clock's
    response to the power limit is measured too (calibrate/power.py), so the estimate
    slows tensor-core kernels by each step's own mix (cost/power.py); with
    ``sm_contention`` the GEMMs' slowdown beside a kernel holding SMs (calibrate/sm_hold.py).
    ``on_phase`` hears what a long step after the kernels is doing."""
    torch = _torch()
    from simumax.calibrate import compute, system_writer
    from simumax.calibrate.shapes import JobKernels, job_kernels
    from simumax.calibrate.timing import FULL_CLOCK_COOLDOWN_SECONDS, device_name, pick_device
    from simumax.config.loader import load_system

    dev = pick_device(device)
    dname = device_name(dev)
    shape_system = base or load_system("a100_pcie")  # kernels do not depend on the system
    merged = JobKernels()
    for model, strategy in jobs:
        merged.add(job_kernels(model, strategy, shape_system))
    source = "option" if peak_tflops else None
    if base is not None:  # efficiencies against the base's peaks, unless given
        if peak_tflops is None and "matmul" in base.accelerator.op:
            peak_tflops = base.accelerator.op["matmul"].tflops
        hbm_gbps = hbm_gbps or base.accelerator.bandwidth["default"].gbps
        source = source or "base"
    if cooldown is None:
        cooldown = FULL_CLOCK_COOLDOWN_SECONDS if dev.type == "cuda" else 0.0
    cal = compute.calibrate_compute(merged, dev, dname, peak_tflops, hbm_gbps, source or "option", warmup, repeats, progress,
                                   cooldown)
    props = torch.cuda.get_device_properties(dev) if dev.type == "cuda" else None
    mem_gib = props.total_memory / 2**30 if props else None
    sys_name = name or (base.sys_name if base else dname.replace(" ", "_").lower())
    start = base.to_dict() if base else system_writer.fresh_system(
        sys_name, dname, mem_gib or 16.0, cal.peak_tflops, cal.hbm_gbps, num_per_node,
        props.multi_processor_count if props else None, props.major if props else None)
    start["sys_name"] = sys_name
    system = system_writer.merge_compute(start, cal, mem_gib, set_fallbacks=base is None)
    curve = None
    if power_curve and cooldown > 0 and dev.type == "cuda":
        from simumax.calibrate.power import measure_power_curve

        if on_phase:
            on_phase("measuring the power curve (~40 s)")
        curve = system["accelerator"]["power_curve"] = measure_power_curve(dev)
    sm_rows = None
    if sm_contention and cooldown > 0 and dev.type == "cuda":
        from simumax.calibrate.sm_hold import contention_curve, measure_sm_contention

        if on_phase:
            on_phase("measuring GEMMs beside a kernel holding SMs (~25 s)")
        sm_rows = measure_sm_contention(dev)
        if points := contention_curve(sm_rows):  # none when no side kernel outlasted its loop
            system["accelerator"]["sm_contention"] = points
    if cooldown == 0 and system["accelerator"].get("power_curve"):  # (nothing measured above then)
        log.warning("kernels timed back to back (--cooldown 0) into a base with a power curve: the new entries "
                    "hold part of the power limit's slowdown, which the curve applies again")
    SystemConfig.init_from_dict(system)  # what we write must load
    report = {
        "device": dname,
        "torch": torch.__version__,
        "peak_tflops": cal.peak_tflops,
        "hbm_gbps": cal.hbm_gbps,
        "peak_source": cal.peak_source,
        "cooldown_seconds": cooldown,
        "power_curve": curve,
        "sm_contention": sm_rows,
        "kernels": [{"family": t.family, "key": t.key, "flops": t.flops, "seconds": t.seconds} for t in cal.timings],
        "bandwidth": {f: {"points": cal.bandwidth_points[f], "seconds_per_byte": a.seconds_per_byte,
                          "latency": a.latency, "max_rel_residual": a.max_rel_residual}
                      for f, a in cal.bandwidth.items()},
    }
    return system, report


def calibrate_collectives(sizes: list[int], group_sizes: list[int] | None, tier: str | None,
                          base: SystemConfig | None, warmup: int, repeats: int,
                          contention: bool = True) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """Under torchrun: (system dict, report, is rank 0). Initialises and tears down the
    process group (NCCL when CUDA is available, else gloo). ``contention``: measure the
    tier's processor_usage too (calibrate/contention.py)."""
    torch = _torch()
    import os

    import torch.distributed as dist

    from simumax.calibrate import system_writer
    from simumax.calibrate.collectives import run_collectives
    from simumax.calibrate.comm_points import merge_points, points_report
    from simumax.calibrate.contention import tier_usage

    if "RANK" not in os.environ:
        raise ConfigError("calibrate-comm", "run it under torchrun: torchrun --nproc-per-node N --no-python simumax calibrate-comm ...")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        cal = run_collectives(sizes, group_sizes, warmup=warmup, repeats=repeats, contention=contention)
        rank0 = dist.get_rank() == 0
    finally:
        dist.destroy_process_group()
    start = base.to_dict() if base else None
    if start is None:  # peaks from the datasheet: this run measures only the network
        dname = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        mem = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 16.0
        start = system_writer.fresh_system(dname.replace(" ", "_").lower(), dname, mem, None, None, cal.per_node)
    # groups inside a node fit the node's tier; larger ones inter_node through the model's
    # split into node-local and cross-node parts (comm_points.merge_points); --tier: all on it
    system, where = merge_points(start, cal.points, tier_usage(cal.contention), tier)
    SystemConfig.init_from_dict(system)
    report = {
        "backend": cal.backend, "world_size": cal.world_size, "tier": tier or next(iter(where["tiers"]), "inter_node"),
        **where,
        **points_report(cal.points),
        "contention": [{"op": p.op, "group_size": p.group_size, "bytes": p.nbytes, "gemm_alone": p.gemm_alone,
                        "gemm_beside": p.gemm_beside, "comm_beside": p.comm_beside, "usage": p.usage}
                       for p in cal.contention],
        "processor_usage": tier_usage(cal.contention),
    }
    return system, report, rank0


KERNEL_KINDS = (  # kernel-name fragments -> kind, first match wins (CUDA kernel names vary by library)
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("optimizer", ("adam", "multi_tensor")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_", "aten::mm", "aten::bmm", "aten::addmm")),
)


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, frags in KERNEL_KINDS if any(f in low for f in frags)), "memory_bound")


def predicted_seconds_by_kind(est: Any, optimizer_seconds: float) -> dict[str, float]:
    """The estimate's compute-stream time of one iteration split like a profile
    (``optimizer_seconds``: the step, from the estimate's cost already computed)."""
    from simumax.graph.kernels import Attention, Collective, Gemm, GroupGemm, MemBound

    out = {"gemm": 0.0, "attention": 0.0, "memory_bound": 0.0}
    cm = est.compute_model
    for k in itertools.chain.from_iterable(chunk.kernels() for chunk in est.chunks):
        if isinstance(k, (Gemm, GroupGemm)):
            out["gemm"] += cm.compute(k)[0]
        elif isinstance(k, Attention):
            out["attention"] += cm.compute(k)[0]
        elif isinstance(k, MemBound):
            out["memory_bound"] += cm.membound(k)
        elif not isinstance(k, Collective):
            raise TypeError(k)
    out = {k: v * est.strategy.micro_batch_num for k, v in out.items()}
    out["optimizer"] = optimizer_seconds
    return out


def check_step(model: ModelConfig, system: SystemConfig, seq_len: int, mbs: int, mbc: int, steps: int, warmup: int,
               device: str | None = None, profile: bool = False, compile: bool = False,
               fp8_recipe: str | None = None, sync_phases: bool = False) -> dict[str, Any]:
    """Train for real, predict the same job, return both and the errors."""
    _torch()
    from simumax.calibrate.check_step import single_device_strategy, train_steps
    from simumax.calibrate.fp8_linear import FP8_RECIPES
    from simumax.calibrate.timing import compute_capability, device_name, fp32_accumulation_fused, pick_device
    from simumax.config.checks import check_compatible
    from simumax.estimate import Estimate
    from simumax.validate import relative_error

    if fp8_recipe is not None and fp8_recipe not in FP8_RECIPES:
        raise ConfigError("--fp8", f"check-step runs the recipes {', '.join(FP8_RECIPES)}, got {fp8_recipe!r}")
    dev = pick_device(device)
    if fp8_recipe is not None and dev.type == "cuda" and compute_capability(dev) < (8, 9):
        raise ConfigError("--fp8", f"{device_name(dev)} runs no fp8 GEMMs (compute capability 8.9 or later: Ada, Hopper)")
    # what the estimate refuses (fp8 on a system without an fp8 peak) fails before the training run
    check_compatible(model, single_device_strategy(seq_len, mbs, mbc, fp8_recipe=fp8_recipe), system)
    real = train_steps(model, seq_len, mbs, mbc, steps, warmup, dev, profile=profile, compile=compile,
                       fp8_recipe=fp8_recipe, sync_phases=sync_phases)
    # predicted after the run: whether torch fused the fp32 weight-gradient accumulation is known then
    strategy = single_device_strategy(seq_len, mbs, mbc, wgrad_fused=fp32_accumulation_fused(), fp8_recipe=fp8_recipe)
    est = Estimate(model, strategy, system)
    cost, mem = est.cost(), est.memory()
    pred_mem = mem.peak_mem
    return {
        "model": model.model_name, "layers": model.layer_num, "hidden": model.hidden_size, "seq_len": seq_len,
        "mbs": mbs, "mbc": mbc, "system": system.sys_name, "device": device_name(dev), "compiled": compile,
        "fp8_recipe": fp8_recipe, "sync_phases": sync_phases,
        "params_real": real.params, "params_predicted": est.params.total,
        "step_time_real": real.step_seconds, "step_time_predicted": cost.duration_time_per_iter,
        "time_error": relative_error(cost.duration_time_per_iter, real.step_seconds),
        "peak_mem_real": real.max_allocated, "peak_mem_predicted": pred_mem,
        "mem_error": relative_error(pred_mem, real.max_allocated),
        "phase_time_real": real.phase_seconds,
        "phase_time_predicted": {"fwd": cost.breakdown["fwd"], "bwd": cost.breakdown["bwd"] + cost.breakdown["recompute"],
                                 "optimizer": cost.breakdown["optimizer"] + cost.breakdown["dp_comm"]},
        "model_state_bytes_real": real.model_state_bytes,
        "activation_bytes_real": real.saved_activation_bytes or None,
        "activation_bytes_predicted": max(s.fwd_activation_cache_per_micro_batch for s in mem.stages),
        "model_state_bytes_predicted": max(s.model_mem for s in mem.stages),
        "misses": sum(cost.efficiency_lookups.get("misses", {}).values()),
        "kernel_seconds_predicted": predicted_seconds_by_kind(est, cost.breakdown["optimizer"]),
        "kernel_seconds_real": _by_kind(real.kernels) if real.kernels else None,
        "wgrad_accumulation_fused": fp32_accumulation_fused(),
        "clocks_real": real.clocks,  # NVML over the timed steps (cost/power.py's mechanism)
        "tensor_core_rate_predicted": cost.stages[0].tensor_core_rate,
        # the host's issue time of one micro-batch (forward + backward): measured with the GPU
        # kept busy, and StageCost.host_issue (the IR's launches x system.host_op_us)
        "host_issue_real": real.host_issue_seconds, "host_issue_launches_real": real.host_issue_launches,
        "host_issue_predicted": cost.stages[0].host_issue,
        "measurement": real.to_dict(),
    }


def _by_kind(kernels: list[dict[str, Any]]) -> dict[str, float]:
    out = {"gemm": 0.0, "attention": 0.0, "memory_bound": 0.0, "optimizer": 0.0}
    for k in kernels:
        if not str(k["name"]).startswith("shape:"):  # per-shape GEMM rows repeat kernel time
            out[kernel_kind(str(k["name"]))] += float(k["seconds"])
    return out
