"""Human formatting, used only at print time."""

from __future__ import annotations

from rich import box
from rich.table import Table

from simumax.config.model import ModelConfig
from simumax.config.model_blocks import HYBRID_BLOCKS
from simumax.config.strategy import StrategyConfig
from simumax.cost.network import NetworkModel
from simumax.dp.sharding_plan import ShardingPlan
from simumax.report.results import CostResult, MemResult, SimResult

GIB = 2**30


def gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def zero_label(zero_state: int, fsdp_impl: str) -> str:
    """``zero3``, or ``zero3/deepspeed`` when the implementation is not Megatron's own (the
    default at every level): one label in perf titles and search rows."""
    return f"zero{zero_state}" + (f"/{fsdp_impl}" if fsdp_impl != "megatron_fsdp" else "")


def layer_mix(model: ModelConfig) -> str | None:
    """One line saying what the layers are, for a model whose layers differ in kind: a hybrid
    stack's blocks per symbol (and its MTP depths' blocks), Gated DeltaNet beside softmax
    attention, or DSA layers that run their indexer beside those that share one; None for a
    model of one layer kind."""
    if model.hybrid_layer_pattern is not None:
        syms = model.hybrid_symbols
        counts = ", ".join(f"{syms.count(c)} {name}" for c, name in HYBRID_BLOCKS.items() if c in syms)
        mtp = model.hybrid_mtp_pattern
        depth = f"; {model.mtp_num_layers} MTP depth(s) of {', '.join(HYBRID_BLOCKS[c] for c in mtp)}" if mtp else ""
        return f"{len(syms)} blocks: {counts}{depth}"
    if model.experimental_attention_variant == "gated_delta_net":
        soft = model.softmax_attention_layers
        return f"{model.layer_num} layers: {model.layer_num - soft} Gated DeltaNet, {soft} softmax attention"
    if model.experimental_attention_variant == "dsa":
        n = model.layer_num
        own = sum(model.dsa_computes_topk(i) for i in range(n))
        shared = f", {n - own} reuse an earlier layer's top-k" if own < n else ""
        return f"{n} DeepSeek sparse attention layers (top-{model.dsa_indexer_topk} keys): {own} run the indexer{shared}"
    return None


def run_title(model_name: str, sys_name: str, st: StrategyConfig) -> str:
    """One line naming the run: model | system | the parallel sizes that are not 1 (tp, pp, dp always)."""
    sizes = [f"tp{st.tp_size}", f"pp{st.pp_size}"]
    sizes += [f"{k}{v}" for k, v in (("vp", st.interleaving_size), ("cp", st.cp_size), ("ep", st.ep_size), ("etp", st.etp_size)) if v > 1]
    sizes += [f"dp{st.dp_size}", f"mbs{st.micro_batch_size}", f"mbc{st.micro_batch_num}"]
    if st.zero_state:
        sizes.append(zero_label(st.zero_state, st.fsdp_impl))
    if st.recompute_mode != "none":
        sizes.append(f"recompute={st.recompute_mode}")
    if st.document_groups:  # documents packed into each sequence: "docs 2x3000+2192"
        sizes.append("docs " + "+".join(f"{n}x{length}" if n > 1 else str(length) for length, n in st.document_groups))
    return f"{model_name} | {sys_name} | {' '.join(sizes)}"


def out_of_memory(mem: MemResult) -> str | None:
    """A one-line warning when the busiest stage needs more than the device has."""
    if mem.fits:
        return None
    worst = max(mem.stages, key=lambda s: s.peak_mem_with_reserved)
    return (f"does not fit: stage {worst.stage} needs {gib(worst.peak_mem_with_reserved)} GiB reserved, the device has "
            f"{gib(mem.capacity)} GiB (recompute, more TP/PP/EP/CP or ZeRO cut it; simumax search finds what fits)")


# overlap options and the group whose tier's processor_usage slows the compute beside them
# (tp_comm_overlap is not one: TE's userbuffers plan their GEMMs for the SMs they leave,
# cost/userbuffers.py)
OVERLAP_GROUPS = (("overlap_grad_reduce", "dp"), ("overlap_param_gather", "dp"),
                  ("overlap_moe_expert_parallel_comm", "ep"), ("moe_shared_expert_overlap", "ep"))


def _sharded_per_layer(st: StrategyConfig) -> bool:
    """ZeRO-2/3 collectives run per layer and micro-batch, beside the compute (graph/sharding.py)."""
    return st.zero_state >= 2 and ShardingPlan.of(st).per_micro_batch


def free_overlap(st: StrategyConfig, network: NetworkModel) -> str | None:
    """A one-line note when communication the strategy overlaps with compute runs on a tier
    whose ``processor_usage`` is 0: the estimate then takes the overlap as free (nothing
    taken from the GEMMs beside it), which real NCCL kernels are not."""
    def free(group: str) -> bool:
        return network.groups[group].size > 1 and network.compute_usage(group) == 0

    on = [opt for opt, g in OVERLAP_GROUPS if getattr(st, opt) and free(g)]
    if _sharded_per_layer(st) and free("dp"):  # its per-layer collectives
        on.append(f"zero_state {st.zero_state}")
    if not on:
        return None
    return (f"{', '.join(on)}: the overlapped communication takes nothing from the compute beside it here "
            "(processor_usage 0 on its tier and, for data-parallel collectives, no accelerator.nccl_max_ctas, as in "
            "the non-Hopper presets; on an H100, GEMMs beside a kernel holding 8-32 SMs take 17-37 % longer, "
            "docs/calibration.md); give the tier's comm_sms (NCCL's channel count) or measure it with "
            "`simumax calibrate-comm`")


def nccl_sms_note(st: StrategyConfig, network: NetworkModel) -> str | None:
    """One line when overlapped data-parallel collectives are charged the SMs their NCCL
    kernels hold (cost/nccl_sms.py): how many, and what it costs the compute beside them."""
    if network.groups["dp"].size <= 1 or not (st.overlap_grad_reduce or st.overlap_param_gather or _sharded_per_layer(st)):
        return None
    held = {kind: network.nccl_sms("dp", kind) for kind in ("reduce", "gather")}
    if not all(held.values()):
        return None
    source = "--use-nccl-ub's registered buffers" if st.nccl_ub else "NCCL's conventional kernels"
    parts = ", ".join(f"{kind} {n} SMs (+{network.compute_usage('dp', kind):.0%})" for kind, n in held.items())
    return (f"overlapped DP collectives ({source}): {parts} on the compute they overlap "
            "(docs/modeling.md, \"NCCL's SMs beside the overlapped data-parallel collectives\")")


APPROXIMATE_MECHANISMS = {
    "moe_routing": "dropless MoE routing (tokens per expert: uniformly random routing's x moe_load_imbalance {imb:g})",
    "mamba_ssd": "Mamba-2's fused conv + chunked scan (its Triton kernels as batched GEMMs and memory passes)",
    "gdn_scan": "Gated DeltaNet's chunked delta rule (FLA's Triton kernels as batched GEMMs and memory passes)",
}


def approximate_note(cost: CostResult, imbalance: float) -> str | None:
    """One line when part of the compute and collective time rests on a mechanism the
    configs do not fix (Op.approximate): which, and its share; the band counts it as
    unmeasured (simumax/uncertainty.py)."""
    approx = cost.efficiency_lookups.get("approximate") or {}
    seconds = cost.efficiency_lookups.get("seconds", {})
    total = sum(t for fam, by in seconds.items() if not fam.startswith("memory/") for t in by.values())
    if not approx or total <= 0:
        return None
    parts = "; ".join(f"{t / total:.0%} on {APPROXIMATE_MECHANISMS.get(m, m).format(imb=imbalance)}"
                      for m, t in approx.items())
    return f"of the GEMM / attention / collective time, {parts}: counted as unmeasured in the 80 % band"


def host_issue_note(cost: CostResult, host_op_us: float) -> str | None:
    """One line when the host needs at least half the GPU time to issue a rank's passes
    (StageCost.host_issue against its forward, backward and recompute): the time takes the GPU
    as never waiting for the host, which small passes break."""
    s = max(cost.stages, key=lambda s: s.host_issue_share, default=None)
    if s is None or s.host_issue_share < 0.5:
        return None
    ratio = s.host_issue_share
    return (f"the host issues stage {s.stage}'s kernels of a micro-batch in {ms(s.host_issue)} ms at {host_op_us:g} us "
            f"each (system.host_op_us), {ratio:.0%} of their GPU time: near or past 100 % the step is host-bound, "
            "which the time does not include (CUDA graphs remove it; docs/modeling.md)")


def summary_table(cost: CostResult, mem: MemResult) -> Table:
    t = Table(show_header=False)
    t.add_column("metric")
    t.add_column("value", justify="right")
    band = lambda iv, f: f" (80 %: {f(iv[0])}–{f(iv[1])})" if iv else ""  # noqa: E731
    t.add_row("iteration time (ms)", ms(cost.duration_time_per_iter) + band(cost.duration_time_interval, ms))
    t.add_row("MFU (causal attention)", f"{cost.mfu:.1%}" + band(cost.mfu_interval, lambda x: f"{x:.1%}"))
    t.add_row("MFU (SimuMax 6ND + attn)", f"{cost.mfu_6nd_with_attn:.1%}")
    t.add_row("TFLOP/s per GPU", f"{cost.tflops_per_gpu:.1f}")
    t.add_row("TFLOP/s per GPU (Megatron-LM's log)", f"{cost.tflops_per_gpu_megatron:.1f}")
    t.add_row("tokens/s per GPU", f"{cost.throughput_per_accelerator:.0f}" + band(cost.throughput_interval, lambda x: f"{x:.0f}"))
    t.add_row("peak allocated (GiB, max stage)",
              f"{gib(mem.peak_mem)} (stage {mem.peak_stage})" + band(mem.peak_mem_interval, gib))
    t.add_row("peak reserved (GiB)", f"{gib(mem.peak_mem_with_reserved)} of {gib(mem.capacity)}")
    rates = [s.tensor_core_rate for s in cost.stages]
    if min(rates, default=1.0) < 1.0:  # the system carries a power curve (cost/power.py)
        shown = f"{min(rates):.2f}" if max(rates) - min(rates) < 0.005 else f"{min(rates):.2f}–{max(rates):.2f}"
        t.add_row("tensor-core clock (power limit)", f"{shown} of table rate")
    return t


def breakdown_table(cost: CostResult) -> Table:
    t = Table(title="critical rank, per iteration")
    t.add_column("part")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    for k, v in cost.breakdown.items():
        t.add_row(k, ms(v), f"{v / cost.duration_time_per_iter:.1%}")
    return t


def readable(t: Table, text_columns: tuple[int, ...] = ()) -> Table:
    """Narrow terminals (80 columns): numbers are never cut ("14.…"); headers and the text
    columns named wrap instead, so every figure stays whole."""
    for i, col in enumerate(t.columns):
        if i in text_columns:
            col.overflow = "fold"
            col.min_width = min(8, max((len(str(c)) for c in col.cells), default=1))
            continue
        cells = [str(c) for c in col.cells]
        col.min_width = max((len(c) for c in cells), default=1)
        col.no_wrap = False
        col.overflow = "fold"  # headers fold; no number is wider than its column
    return t


# (header, header under 110 columns, what the short one stands for)
MEMORY_COLUMNS = (("stage", "st", "stage"), ("layers", "L", "layers"), ("weights", "wts", "weights"), ("grads", "grd", "grads"),
                  ("optimizer", "opt", "optimizer"), ("TE buf", "TE", "TE buffers"), ("act/mb", "act", "activations per micro-batch"),
                  ("in-flight", "mb", "micro-batches in flight"), ("peak", "peak", "peak"), ("reserved", "resv", "reserved"),
                  ("peak at", "at", "peak at"))


def memory_table(mem: MemResult, width: int | None = None) -> Table:
    """``width``: the console's; under 110 columns the headers are abbreviated, with a legend."""
    narrow = width is not None and width < 110
    legend = ", ".join(f"{short} {meaning}" for long, short, meaning in MEMORY_COLUMNS if short != long) if narrow else None
    t = Table(title="memory per pipeline stage (GiB)", caption=legend)
    if narrow:  # no rules between columns: the figures fit 80 columns whole
        t.box, t.pad_edge, t.padding = box.SIMPLE_HEAD, False, (0, 1, 0, 0)
    for long, short, _ in MEMORY_COLUMNS:
        t.add_column(short if narrow else long, justify="right" if long != "peak at" else "left")
    for s in mem.stages:
        t.add_row(
            str(s.stage), str(s.layers), gib(s.weights), gib(s.grads), gib(s.optimizer), gib(s.te_buffers),
            gib(s.fwd_activation_cache_per_micro_batch), f"{round(s.peak_path['in_flight'], 2):g}", gib(s.peak_mem),
            gib(s.peak_mem_with_reserved), f"{s.peak_path['phase']} {s.peak_path['op']}",
        )
    return readable(t, text_columns=(10,))


def search_table(rows: list, capacity: float, gmi_error_gib: float, reserved: bool = True) -> Table:
    """``reserved``: the rows' peaks are reserved bytes (allocated / mem_factor), else allocated."""
    t = Table(title=f"best strategies (capacity {capacity / GIB:.2f} GiB, {gmi_error_gib:g} GiB kept free)")
    peak = f"peak {'reserved' if reserved else 'allocated'} GiB per stage"
    for col in ("#", "strategy", "iter ms", "MFU", "tokens/s per GPU", peak, "headroom GiB"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    host_bound = False
    for i, r in enumerate(rows, 1):
        stages = " ".join(f"{x / GIB:.1f}" for x in r.peak_mem_per_stage)
        if r.fits:
            mark = "*" if (r.host_issue_share or 0.0) >= 1.0 else ""
            host_bound = host_bound or bool(mark)
            t.add_row(str(i), r.label, f"{r.iter_time * 1e3:.1f}{mark}", f"{r.mfu:.1%}", f"{r.tokens_per_s_per_gpu:.0f}", stages,
                      f"{r.headroom / GIB:.1f}")
        else:
            t.add_row(str(i), r.label, "does not fit", "-", "-", stages, f"{r.headroom / GIB:.1f}")
    if host_bound:
        t.caption = ("* the host issues a rank's kernels slower than the GPU runs them (kernel launches x system.host_op_us): "
                     "host-bound, slower than shown")
    return readable(t, text_columns=(1, 5))


def simulation_table(res: SimResult) -> Table:
    t = Table(
        title=f"{res.schedule}: simulated {ms(res.duration_time_per_iter)} ms per iteration "
        f"(analysis_cost {ms(res.closed_form_time_per_iter)} ms)"
    )
    for col in ("rank", "passes end ms", "iteration end ms", "busy ms", "bubble", "peak alloc GiB"):
        t.add_column(col, justify="right")
    for r in res.ranks:
        t.add_row(str(r.rank), ms(r.end_of_backward), ms(r.end), ms(r.busy), f"{r.bubble_fraction:.1%}", gib(r.peak_mem))
    return t


def calibration_table(report: dict) -> Table:
    """Per family: kernels measured and their efficiency range; memory-bound fits."""
    t = Table(title=f"calibration on {report['device']} (peak {report['peak_tflops']:.1f} TFLOP/s, {report['peak_source']})")
    for col in ("family", "kernels", "eff min", "eff median", "eff max"):
        t.add_column(col, justify="left" if col == "family" else "right")
    by: dict[str, list[float]] = {}
    for k in report["kernels"]:
        by.setdefault(k["family"], []).append(k["flops"] / (k["seconds"] * report["peak_tflops"] * 1e12))
    for fam, effs in by.items():
        effs.sort()
        t.add_row(fam, str(len(effs)), f"{effs[0]:.3f}", f"{effs[len(effs) // 2]:.3f}", f"{effs[-1]:.3f}")
    for fam, fit in report["bandwidth"].items():
        gbps = 1 / fit["seconds_per_byte"] / 1e9
        t.add_row(f"{fam} (memory)", str(len(fit["points"])), "", f"{gbps:.0f} GB/s, {fit['latency'] * 1e6:.1f} us", "")
    return t


def comm_table(report: dict, system: dict) -> Table:
    tier = system["networks"][report["tier"]]
    t = Table(title=f"{report['backend']} collectives, {report['world_size']} ranks -> tier {report['tier']} ({tier['bandwidth']['gbps']} GB/s)")
    for col in ("op", "efficiency", "latency us"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op, spec in tier["op"].items():
        if "latency_us" in spec and spec.get("efficient_factor") is not None:
            t.add_row(op, f"{spec['efficient_factor']:.3f}", f"{spec['latency_us']:.1f}")
    if report.get("processor_usage") is not None:
        beside = ", ".join(f"{p['op']} {p['usage']:.2f}" for p in report.get("contention", []))
        t.caption = f"GEMMs beside a collective: processor_usage {report['processor_usage']:.3f} ({beside})"
    return t


def check_step_table(row: dict) -> Table:
    fp8 = f", fp8 {row['fp8_recipe']}" if row.get("fp8_recipe") else ""
    t = Table(title=f"{row['model']} ({row['layers']} layers, h {row['hidden']}{fp8}) seq {row['seq_len']} mbs {row['mbs']} "
                    f"mbc {row['mbc']} on {row['device']}")
    for col in ("", "measured", "predicted", "error"):
        t.add_column(col, justify="left" if not col else "right")
    t.add_row("step time (ms)", ms(row["step_time_real"]), ms(row["step_time_predicted"]), f"{row['time_error']:+.1%}")
    if row["peak_mem_real"]:
        t.add_row("peak allocated (GiB)", gib(row["peak_mem_real"]), gib(row["peak_mem_predicted"]), f"{row['mem_error']:+.1%}")
    else:
        t.add_row("peak allocated (GiB)", "- (CPU)", gib(row["peak_mem_predicted"]), "")
    t.add_row("parameters", f"{row['params_real']:,}", f"{row['params_predicted']:,}", "")
    clocks = row.get("clocks_real")
    if clocks or row.get("tensor_core_rate_predicted", 1.0) < 1.0:
        real = (f"SM {clocks['sm_mhz']:.0f} MHz, {clocks['power_w']:.0f} W, {clocks['power_capped_share']:.0%} capped"
                if clocks else "-")
        t.add_row("clock under load", real, f"tensor cores at {row.get('tensor_core_rate_predicted', 1.0):.2f}", "")
    if row.get("host_issue_real"):  # one micro-batch issued with the GPU busy: host seconds per launch
        launches = row.get("host_issue_launches_real") or 0
        per = f" ({row['host_issue_real'] / launches * 1e6:.1f} us x {launches} launches)" if launches else ""
        t.add_row("host issue per micro-batch (ms)", ms(row["host_issue_real"]) + per, ms(row["host_issue_predicted"]),
                  f"{row['host_issue_predicted'] / row['host_issue_real'] - 1:+.1%}")
    # each phase, then (--profile) the device time per kernel kind, the prediction at the tables' full clock
    for suffix, real_key, pred_key, default in (("", "phase_time_real", "phase_time_predicted", None),
                                                 (" kernels", "kernel_seconds_real", "kernel_seconds_predicted", 0.0)):
        for part, real in (row.get(real_key) or {}).items():
            pred = row[pred_key].get(part, default)
            if pred is not None:
                t.add_row(f"  {part}{suffix} (ms)", ms(real), ms(pred), f"{pred / real - 1:+.1%}" if real > 0 else "")
    return t
