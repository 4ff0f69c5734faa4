"""Write measurements as a SimuMax-format system config (merged into a base when given).

Efficiencies are computed here against the peak of the family they are written into (the
base's ``tflops`` when it has the family), so a measured entry means the same thing as
the reference tables' entries: table FLOPs / (seconds * family peak).
"""

from __future__ import annotations

import copy
import logging
import statistics
from collections.abc import Callable
from typing import Any

from simumax.calibrate.fit import AlphaBeta
from simumax.config.hardware import (
    HOPPER_NCCL_MAX_CTAS, NIC_FIXED_US, NIC_STEP_US, SCALEUP_FIXED_US, SCALEUP_STEP_US, collective_tier, datasheet,
)
from simumax.config.system import MAX_LINK_EFFICIENCY, link_bytes_per_gb
from simumax.cost.network import DEFAULT_SPECS, ring_steps
from simumax.cost.efficiency import TF32_OF_BF16_PEAK
from simumax.graph.kernels import MODEL_SDP_BWD_RATIO, SIMUMAX_SDP_BWD_RATIO, TF32_PREFIX

log = logging.getLogger(__name__)

# placeholders for a device missing from the datasheet table (a collectives-only config)
PEAK_TFLOPS_UNKNOWN, HBM_GBPS_UNKNOWN, SCALEUP_GBPS_UNKNOWN = 100.0, 1000.0, 100.0
IB_GBPS_PER_GPU = 50.0  # one 400 Gb/s NIC per GPU


def nccl_max_ctas(compute_major: int | None, device_name: str) -> int | None:
    """NCCL's default CTA cap where a source states it: Hopper (compute capability 9.x) on
    NVSwitch (SXM; not the PCIe or NVL cards), megatron-core's ``get_nccl_options``
    (cost/nccl_sms.py)."""
    name = device_name.upper()
    if compute_major == 9 and "PCIE" not in name and "NVL" not in name:
        return HOPPER_NCCL_MAX_CTAS
    return None


def fresh_system(name: str, device_name: str, mem_gib: float, peak_tflops: float | None, hbm_gbps: float | None,
                 num_per_node: int, sm_count: int | None = None, compute_major: int | None = None) -> dict[str, Any]:
    """A system skeleton from datasheet numbers (peaks not given: the device's datasheet
    row); calibration fills the efficiencies. ``sm_count`` (the device's, when known) lets
    the table fit see wave quantisation and give tiny GEMMs a one-tile wave's time
    (docs/hardware.md); ``compute_major`` (its compute capability) gives NCCL's default CTA
    cap where one is stated (``nccl_max_ctas``)."""
    ctas = nccl_max_ctas(compute_major, device_name)
    sheet = datasheet(device_name)
    nvlink = sheet.scaleup_gbps if sheet else SCALEUP_GBPS_UNKNOWN
    peak_tflops = peak_tflops or (sheet.bf16_tflops if sheet else PEAK_TFLOPS_UNKNOWN)
    hbm_gbps = hbm_gbps or (sheet.hbm_gbps if sheet else HBM_GBPS_UNKNOWN)
    family = lambda tf: {"tflops": tf, "efficient_factor": 0.7, "accurate_efficient_factor": {}}  # noqa: E731
    return {
        "sys_name": name,
        "num_per_node": num_per_node,
        "accelerator": {
            "backend": "cuda",
            "mem_gbs": mem_gib,
            "mode": "roofline",
            "op": {
                "default": family(peak_tflops), "matmul": family(peak_tflops), "group_matmul": family(peak_tflops),
                "sdp_fwd": family(peak_tflops), "sdp_bwd": {**family(peak_tflops), "bwd_flops_ratio": MODEL_SDP_BWD_RATIO},
                "fp8_matmul": {"tflops": 2 * peak_tflops, "efficient_factor": 0, "accurate_efficient_factor": {}},
                "fp8_group_matmul": {"tflops": 2 * peak_tflops, "efficient_factor": 0, "accurate_efficient_factor": {}},
            },
            "bandwidth": {"default": {"efficient_factor": 0.8, "gbps": hbm_gbps, "latency_us": 5.0}},
            **({"sm_count": sm_count} if sm_count else {}),
            **({"nccl_max_ctas": ctas} if ctas else {}),
        },
        "networks": {"intra_with_pcie": False,
                     "high_intra_node": collective_tier(nvlink, SCALEUP_FIXED_US, SCALEUP_STEP_US),
                     "inter_node": collective_tier(IB_GBPS_PER_GPU, NIC_FIXED_US, NIC_STEP_US)},
    }


def merge_compute(system: dict[str, Any], cal: Any, mem_gib: float | None = None, set_fallbacks: bool = False) -> dict[str, Any]:
    """Measured kernel entries and memory-bound fits into a system dict (a new copy).

    ``cal`` is a calibrate.compute.ComputeCalibration. A family the system lacks (or every
    measured family, with ``set_fallbacks``: a fresh skeleton) gets the median measured
    efficiency as its fallback for shapes not measured; ``default`` follows matmul."""
    out = copy.deepcopy(system)
    acc = out["accelerator"]
    # timed on this device now: the base's sibling provenance goes (the job's shapes are
    # its own measurements; any base entry left beside them counts as measured too)
    acc.pop("tables_from", None)
    if mem_gib:
        acc["mem_gbs"] = round(mem_gib, 2)
    new_families: dict[str, list[float]] = {}
    for t in cal.timings:
        fam = acc["op"].get(t.family)
        if fam is None:
            # a TF32 family's peak is half the bf16 one (cost/efficiency.TF32_OF_BF16_PEAK)
            peak = cal.peak_tflops * (TF32_OF_BF16_PEAK if t.family.startswith(TF32_PREFIX) else 1.0)
            fam = acc["op"][t.family] = {"tflops": peak, "efficient_factor": 0.7, "accurate_efficient_factor": {}}
            if t.family == "sdp_bwd":
                fam["bwd_flops_ratio"] = MODEL_SDP_BWD_RATIO
            new_families[t.family] = []
        if set_fallbacks:
            new_families.setdefault(t.family, [])
        flops = t.flops
        if t.family == "sdp_bwd":  # timings count 2x the forward; write in the family's own convention
            ratio = fam.get("bwd_flops_ratio") or SIMUMAX_SDP_BWD_RATIO
            flops *= ratio / MODEL_SDP_BWD_RATIO
        eff = flops / (t.seconds * fam["tflops"] * 1e12)
        # six significant digits (not decimals: a CPU's efficiency against a GPU peak is tiny, never 0)
        fam.setdefault("accurate_efficient_factor", {})[t.key] = float(f"{eff:.6g}")
        if t.family in new_families:
            new_families[t.family].append(eff)
    for name, effs in new_families.items():  # a new family's fallback: the median measured shape
        acc["op"][name]["efficient_factor"] = float(f"{statistics.median(effs):.4g}")
    if set_fallbacks and "matmul" in new_families and "default" in acc["op"]:
        acc["op"]["default"]["efficient_factor"] = acc["op"]["matmul"]["efficient_factor"]
    for family, fit in cal.bandwidth.items():
        base = acc["bandwidth"].get(family) or acc["bandwidth"].get("default") or {"gbps": cal.hbm_gbps}
        gbps = float(base["gbps"])
        acc["bandwidth"][family] = {
            "efficient_factor": float(f"{fit.efficiency(gbps):.4g}"), "gbps": gbps, "latency_us": round(fit.latency * 1e6, 3),
        }
    return out


def merge_collectives(system: dict[str, Any], tier: str, fits: dict[str, AlphaBeta],
                      by_size: dict[str, dict[int, AlphaBeta]] | None = None,
                      usage: float | None = None, steps_of: Callable[[str, int], int] | None = None) -> dict[str, Any]:
    """Per-op efficiency and latency of one network tier (created at the measured
    bandwidth when the system lacks it), and its ``processor_usage`` when measured
    (``usage``, calibrate/contention.py; the base's otherwise).

    The cost model's latency is ``steps * latency_us + fixed`` (cost/network.py). With
    ``by_size`` (fits per group size), ``latency_us`` is the largest per-step latency no
    size exceeds (min over sizes of latency / steps) and each size's rest goes to
    ``fixed_latency_us_by_comm_num``, so every measured size keeps its own latency.
    Without it the joint fit's intercept is one fixed latency per call. ``steps_of(op, n)``:
    the latency steps the cost model charges a collective of that size on this tier
    (default a ring's over n ranks; across nodes, n nodes: ``network.node_steps``)."""
    out = copy.deepcopy(system)
    nets = out["networks"]
    if tier not in nets:
        best = max(1.0 / f.seconds_per_byte for f in fits.values()) / 1e9
        nets[tier] = collective_tier(round(best, 3), 0.0, 0.0)
    t = nets[tier]
    t["provenance"] = "measured"
    if usage is not None:
        t["processor_usage"] = usage
    to_gb = link_bytes_per_gb(t.get("gbps_unit")) / 1e9
    if to_gb != 1.0:  # a SimuMax tier (GiB): the same link in decimal GB/s, as fits measure
        t["bandwidth"]["gbps"] *= to_gb
        for spec in t.get("op", {}).values():
            if spec.get("dp_fixed_bw"):
                spec["dp_fixed_bw"] = {k: v * to_gb for k, v in spec["dp_fixed_bw"].items()}
        t["gbps_unit"] = "GB"
    gbps = float(t["bandwidth"]["gbps"])
    for op, fit in fits.items():
        spec = t["op"].setdefault(op, dict(collective_tier(1, 0, 0)["op"][op]))
        eff = fit.efficiency(gbps)
        if eff > MAX_LINK_EFFICIENCY:
            # times that barely grow with size (sizes too small for the link, or noise on a
            # busy host) fit a near-flat line: its bandwidth is not a measurement
            log.warning("calibrate-comm: %s on %s fits %.3g GB/s, over %g x the tier's %g GB/s: the sizes measured do "
                        "not resolve its bandwidth (measure larger sizes); written as %g", op, tier,
                        1.0 / fit.seconds_per_byte / 1e9, MAX_LINK_EFFICIENCY, gbps, MAX_LINK_EFFICIENCY)
            eff = MAX_LINK_EFFICIENCY
        spec["efficient_factor"] = float(f"{eff:.4g}")
        # the measurement supersedes the base's latencies and fixed DP bandwidths
        spec.pop("fixed_latency_us_by_comm_num", None)
        spec.pop("dp_fixed_bw", None)
        sizes = (by_size or {}).get(op, {})
        if not sizes:
            spec["latency_us"], spec["fixed_latency_us"] = 0.0, round(fit.latency * 1e6, 3)
            continue
        shape = DEFAULT_SPECS[op]
        steps = {n: steps_of(op, n) if steps_of else ring_steps(op, n, shape.scale, shape.offset) for n in sizes}
        per_step = min(f.latency / steps[n] for n, f in sizes.items())
        spec["latency_us"], spec["fixed_latency_us"] = round(per_step * 1e6, 3), 0.0
        if len(sizes) > 1:
            spec["fixed_latency_us_by_comm_num"] = {
                str(n): round(max(0.0, f.latency - per_step * steps[n]) * 1e6, 3) for n, f in sorted(sizes.items())
            }
    return out
