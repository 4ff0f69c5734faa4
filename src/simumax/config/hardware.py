"""Hardware presets from datasheet numbers (``python docs/make_hardware_presets.py`` writes
them to config/presets/system/; a test keeps the files equal to this table).

Peaks are dense (no sparsity) per GPU from the vendors' datasheets; memory is what the
driver reports (MiB / 1024). Efficiency: where a measured table exists it is used (B200:
the SimuMax reference tables; H100: our own calibration, docs/calibration.md), and every
other shape goes through the fitted / default curves of cost/efficiency_fit.py, whose
asymptotes below are typical achieved fractions of peak for large problems (cuBLAS/hipBLASLt
GEMMs, FlashAttention in the table-FLOP convention, STREAM-like copies), not values tuned to
any run. Networks: NVLink/NVSwitch (or Infinity Fabric) per GPU and direction inside the
node (NVL72: the whole rack), one scale-out NIC per GPU; collective efficiencies are
typical NCCL bus-bandwidth fractions (nccl-tests) and latencies.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Datasheet:
    """Vendor facts of one accelerator; ``match`` is a substring of torch's device name
    (the first matching row wins, so more specific names come first)."""

    match: str
    bf16_tflops: float  # dense
    hbm_gbps: float
    scaleup_gbps: float  # per GPU, one direction: NVLink / Infinity Fabric, PCIe for PCIe cards
    arch: str = ""  # ampere, ada, hopper, blackwell, cdna3: which FP8 recipes its tensor cores run

    @property
    def fp8_recipes(self) -> tuple[str, ...]:
        return FP8_RECIPES_BY_ARCH.get(self.arch, ())


# FP8 tensor cores: none on Ampere; per-tensor scaling from Ada / Hopper / CDNA3; 1 x 128
# block scales (DeepSeek-V3 / TE Float8BlockScaling) need Hopper's TMA-era GEMMs; MX
# block scaling is Blackwell's (its tensor cores apply the E8M0 scales)
FP8_RECIPES_BY_ARCH = {
    "ampere": (),
    "ada": ("delayed", "tensorwise"),
    "cdna3": ("delayed", "tensorwise"),
    "hopper": ("delayed", "tensorwise", "blockwise"),
    "blackwell": ("delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"),
}

DATASHEETS = (
    Datasheet("H200 NVL", 835.5, 4800.0, 64.0, "hopper"),  # PCIe card; NVLink bridges join 2 or 4
    Datasheet("H200", 989.4, 4800.0, 450.0, "hopper"),
    Datasheet("H100 NVL", 835.5, 3900.0, 64.0, "hopper"),  # PCIe card, 94 GB; NVLink bridge pairs
    Datasheet("H100 PCIe", 756.0, 2000.0, 64.0, "hopper"),
    Datasheet("H100", 989.4, 3350.0, 450.0, "hopper"),
    Datasheet("H800", 989.4, 3350.0, 200.0, "hopper"),
    Datasheet("GB300", 2500.0, 8000.0, 900.0, "blackwell"),  # Blackwell Ultra: BF16 / FP8 as GB200, FP4 x1.5
    Datasheet("B300", 2250.0, 8000.0, 900.0, "blackwell"),
    Datasheet("GB200", 2500.0, 8000.0, 900.0, "blackwell"),
    Datasheet("B200", 2250.0, 8000.0, 900.0, "blackwell"),
    Datasheet("A100-PCIE", 312.0, 1935.0, 32.0, "ampere"),
    Datasheet("A100", 312.0, 2039.0, 300.0, "ampere"),
    Datasheet("A800", 312.0, 2039.0, 200.0, "ampere"),
    Datasheet("L40S", 362.0, 864.0, 32.0, "ada"),
    Datasheet("MI300X", 1307.4, 5300.0, 448.0, "cdna3"),
)


def datasheet(device_name: str) -> Datasheet | None:
    """The datasheet row of a device name (e.g. torch.cuda.get_device_name(), or a system
    name such as ``a100_pcie_bf16``: underscores read as dashes), else None."""
    name = device_name.lower().replace("_", "-")
    return next((d for d in DATASHEETS if d.match.lower() in name), None)


def _sheet(match: str) -> Datasheet:
    return next(d for d in DATASHEETS if d.match == match)


@dataclass(frozen=True)
class Gpu:
    name: str
    sheet: Datasheet
    fp8_tflops: float
    mem_gib: float
    sm_count: int
    num_per_node: int  # GPUs sharing the scale-up fabric (a node; NVL72: the rack)
    nic_gbps: float  # scale-out per GPU, one direction (GB/s)
    gemm_eff: float  # asymptotes of the default curves
    group_gemm_eff: float
    attn_fwd_eff: float
    attn_bwd_eff: float
    hbm_eff: float
    scaleup_eff: dict[str, float]  # collective -> bus-bandwidth fraction on the scale-up fabric
    measured_base: str | None = None  # a preset whose measured tables this one reuses
    # those tables were timed on a sibling whose kernels run at other rates (GB200 on B200's:
    # the same die under a larger power budget), not on this device (accelerator.tables_from);
    # the H200 keeps the H100's as its own: the same SMs, clocks and 700 W
    sibling_tables: bool = False
    note: str = ""
    # backward FLOPs per forward FLOP the attention efficiencies are stated in
    # (kernels.Attention.table_flops): 2.0 for our own measurements and asymptotes;
    # the B200 numbers are SimuMax's tables and asymptotes, measured at 2.5
    attn_bwd_flops_ratio: float = 2.0
    # sustained fp8 GEMM fraction of the fp8 peak for large problems (the fp8 families'
    # asymptote; shapes follow the bf16 family, cost/efficiency.ComputeModel._fp8_from_bf16);
    # None: the bf16 fraction. Devices without fp8 units (fp8_tflops 0) get no fp8 families.
    fp8_gemm_eff: float | None = None
    fp4_tflops: float = 0.0  # dense FP4 (NVFP4) peak; 0: no fp4 families
    host_link_gbps: float = 25.0  # GPU <-> host, per GPU, one direction (PCIe Gen4 x16 ~25, Gen5 ~50, NVLink-C2C)
    host_mem_gbps: float = 50.0  # host DRAM bandwidth / GPUs of the node
    # the board's own measured power response (cost/power.py), over the measured base's
    power_curve: tuple[tuple[float, float], ...] | None = None
    # the bf16 peak of the device the measured base was timed on, when that is a sibling of
    # this one with the same die and a lower datasheet rate (GB200 on B200's tables: the
    # same 148 SMs; GB200's 2.5 PFLOP/s is its 1200 W budget against B200's 1000 W): every
    # compute efficiency and asymptote is rescaled by table_tflops / bf16_tflops, so a
    # kernel takes the time measured on the sibling. What the larger power budget gains
    # under a training load is not measured for either board (no power curve).
    table_tflops: float | None = None
    # NCCL's default cap on a collective's CTAs on this GPU where its fabric lets NCCL use
    # them all (NVSwitch): megatron-core parallel_state.get_nccl_options gives max_ctas = 32
    # for Hopper; the overlapped DP collectives hold that many SMs (cost/nccl_sms.py)
    nccl_max_ctas: int | None = None

    @property
    def bf16_tflops(self) -> float:
        return self.sheet.bf16_tflops

    @property
    def hbm_gbps(self) -> float:
        return self.sheet.hbm_gbps

    @property
    def scaleup_gbps(self) -> float:
        return self.sheet.scaleup_gbps


NVLINK_EFF = {"all_reduce": 0.80, "all_gather": 0.80, "reduce_scatter": 0.80, "all2all": 0.60, "p2p": 0.80}
# PCIe Gen5 x16 through the host's switches: nccl-tests bus bandwidth ~ 70 % of 64 GB/s
PCIE_EFF = {"all_reduce": 0.70, "all_gather": 0.70, "reduce_scatter": 0.70, "all2all": 0.60, "p2p": 0.75}
XGMI_EFF = {"all_reduce": 0.70, "all_gather": 0.70, "reduce_scatter": 0.70, "all2all": 0.55, "p2p": 0.70}
NIC_EFF = {"all_reduce": 0.85, "all_gather": 0.85, "reduce_scatter": 0.85, "all2all": 0.70, "p2p": 0.90}
# Collective latency = fixed per call + per ring step / tree level (cost/network.py; the
# form of NCCL's tuning model: base latency + steps x hardware latency).
SCALEUP_FIXED_US, SCALEUP_STEP_US = 8.0, 2.0
NIC_FIXED_US, NIC_STEP_US = 20.0, 5.0

# Hopper fp8 GEMMs sustain ~1.3 PFLOP/s of the 1979 datasheet peak on large problems
# (cuBLAS 12 / CUTLASS 3 results published for H100 SXM: ~1,300-1,350 TFLOP/s fp8 vs
# ~750 bf16 at 8192^3): the tensor cores draw more power per clock in fp8 and the 700 W
# limit lowers the clock, so fp8 reaches ~0.67 of its peak where bf16 reaches ~0.72-0.76.
H100_FP8_GEMM_EFF = 0.67
# The same at full clock, for presets whose tables are timed at full clock and carry the
# measured power response (accelerator.power_curve, cost/power.py), which lowers the rate
# by the step's own tensor-core share: 8192^3 GEMMs from an idle H100 SXM ran at 784 TFLOP/s
# bf16 (0.79 of 989.4) and 1483 fp8 (0.75 of 1978.9), and 675 / 1281 back to back
# (benchmarks/sustained_gemm.py, docs/calibration.md "Power-limited clocks").
H100_FULL_CLOCK_GEMM_EFF, H100_FULL_CLOCK_FP8_GEMM_EFF = 0.79, 0.75
# The H200 runs the H100's SMs and clocks at the same 700 W, but its HBM3e copies (4.2 TB/s)
# draw more: on the lent H200 the limiter slowed the 8192^3 GEMM already at a 42 % share,
# where the H100 held full clock (docs/calibration/h200_2026-11-24/duty_cycle_8192.json; full
# clock 783 TFLOP/s, as the H100's 784)
H200_POWER_CURVE = ((0.421, 0.948), (0.607, 0.892), (0.76, 0.871), (0.865, 0.861), (0.999, 0.847))

# Memory-bound kernels of a Megatron / TE step (norms with their reductions, cast-transposes,
# softmax, dropout, activations) run below a STREAM-like copy's 85-94 % of the datasheet
# bandwidth: the generic memory-bound lines SimuMax fitted on its two measured Megatron
# systems are 0.75 of the datasheet on the A100 80GB PCIe (0.91 x 1600 GB/s of 1935) and 0.67
# on the B200 (0.666 x 8000 of 8000), and with those lines both files' real steps are
# predicted within ~3 % (docs/validation.md change 19). A preset takes its architecture's
# measured fraction, the mean of the two where none was measured (a test re-derives them
# from the shipped files).
MEMBOUND_EFF_AMPERE, MEMBOUND_EFF_BLACKWELL = 0.75, 0.67
MEMBOUND_EFF_UNMEASURED = 0.71

# megatron-core parallel_state.get_nccl_options: "The default values for Hopper GPUs are ...
# cga_cluster_size = 4, max_ctas = 32, min_ctas = 1"
HOPPER_NCCL_MAX_CTAS = 32

GPUS = (
    Gpu("a100-sxm-80gb", _sheet("A100"), 0.0, 80.0, 108, 8, 25.0, 0.80, 0.65, 0.95, 0.75, MEMBOUND_EFF_AMPERE, NVLINK_EFF,
        note="A100 SXM4 80GB; no FP8 units (no fp8 families: fp8 is refused); HDR 200 Gb/s per GPU", host_link_gbps=25.0, host_mem_gbps=51.0),
    Gpu("h100-sxm-80gb", _sheet("H100"), 1978.9, 79.65, 132, 8, 50.0, H100_FULL_CLOCK_GEMM_EFF, 0.70, 0.93, 0.60,
        MEMBOUND_EFF_UNMEASURED, NVLINK_EFF, measured_base="nvidia_h100_80gb_hbm3",
        note="H100 SXM5; NDR 400 Gb/s per GPU; tables measured at full clock, with the measured power response "
             "(docs/calibration.md)",
        fp8_gemm_eff=H100_FULL_CLOCK_FP8_GEMM_EFF, host_link_gbps=50.0, host_mem_gbps=77.0, nccl_max_ctas=HOPPER_NCCL_MAX_CTAS),
    Gpu("h200-sxm-141gb", _sheet("H200"), 1978.9, 140.4, 132, 8, 50.0, H100_FULL_CLOCK_GEMM_EFF, 0.70, 0.93, 0.62,
        MEMBOUND_EFF_UNMEASURED, NVLINK_EFF, measured_base="nvidia_h100_80gb_hbm3",
        note="H200 SXM: the H100's SMs, clocks and 700 W with HBM3e, so the H100 compute tables; its own measured "
             "power response; NDR 400 Gb/s per GPU",
        fp8_gemm_eff=H100_FULL_CLOCK_FP8_GEMM_EFF, host_link_gbps=50.0, host_mem_gbps=77.0,
        power_curve=H200_POWER_CURVE, nccl_max_ctas=HOPPER_NCCL_MAX_CTAS),
    Gpu("b200-sxm-180gb", _sheet("B200"), 4500.0, 179.06, 148, 8, 50.0, 0.60, 0.45, 0.70, 0.69, MEMBOUND_EFF_BLACKWELL, NVLINK_EFF,
        measured_base="b200_bf16_ceperm", note="B200 (HGX/DGX B200); reference measured tables, true memory; 400 Gb/s per GPU",
        attn_bwd_flops_ratio=2.5, fp4_tflops=9000.0, host_link_gbps=50.0, host_mem_gbps=90.0),
    Gpu("gb200-nvl72", _sheet("GB200"), 5000.0, 184.0, 148, 72, 100.0, 0.60, 0.45, 0.70, 0.69, MEMBOUND_EFF_BLACKWELL, NVLINK_EFF,
        measured_base="b200_bf16_ceperm",
        note="GB200 NVL72: 72 GPUs on one NVLink domain (placed as one node); ConnectX-8 800 Gb/s per GPU to other racks; "
             "the B200 die, so B200's measured kernel times",
        attn_bwd_flops_ratio=2.5, fp4_tflops=10000.0, host_link_gbps=225.0, host_mem_gbps=256.0, table_tflops=2250.0,
        sibling_tables=True),
    Gpu("b300-sxm-288gb", _sheet("B300"), 4500.0, 288.0, 148, 8, 100.0, 0.60, 0.45, 0.70, 0.69, MEMBOUND_EFF_BLACKWELL, NVLINK_EFF,
        note="B300 (HGX B300, Blackwell Ultra): 288 GB HBM3e (nominal), ConnectX-8 800 Gb/s per GPU",
        attn_bwd_flops_ratio=2.5, fp4_tflops=13500.0, host_link_gbps=50.0, host_mem_gbps=90.0),
    Gpu("gb300-nvl72", _sheet("GB300"), 5000.0, 288.0, 148, 72, 100.0, 0.60, 0.45, 0.70, 0.69, MEMBOUND_EFF_BLACKWELL, NVLINK_EFF,
        note="GB300 NVL72: 72 Blackwell Ultra GPUs on one NVLink domain (placed as one node), 288 GB HBM3e (nominal); "
             "ConnectX-8 800 Gb/s per GPU to other racks; the B300 die, so B300's kernel rates",
        attn_bwd_flops_ratio=2.5, fp4_tflops=15000.0, host_link_gbps=225.0, host_mem_gbps=256.0, table_tflops=2250.0),
    Gpu("h100-pcie-80gb", _sheet("H100 PCIe"), 1513.0, 79.65, 114, 8, 50.0, 0.72, 0.70, 0.93, 0.60, MEMBOUND_EFF_UNMEASURED, PCIE_EFF,
        note="H100 PCIe: 114 SMs, 350 W, PCIe Gen5 x16 between the cards (no NVLink); 400 Gb/s per GPU",
        fp8_gemm_eff=H100_FP8_GEMM_EFF, host_link_gbps=50.0, host_mem_gbps=77.0),
    Gpu("h100-nvl-94gb", _sheet("H100 NVL"), 1671.0, 93.0, 132, 8, 50.0, 0.72, 0.70, 0.93, 0.60, MEMBOUND_EFF_UNMEASURED, PCIE_EFF,
        note="H100 NVL: PCIe card, 94 GB HBM3, 3.9 TB/s; modelled with PCIe Gen5 between cards (its NVLink bridge "
             "joins pairs only); 400 Gb/s per GPU", fp8_gemm_eff=H100_FP8_GEMM_EFF, host_link_gbps=50.0, host_mem_gbps=77.0),
    Gpu("h200-nvl-141gb", _sheet("H200 NVL"), 1671.0, 140.4, 132, 8, 50.0, 0.74, 0.70, 0.93, 0.62, MEMBOUND_EFF_UNMEASURED, PCIE_EFF,
        note="H200 NVL: PCIe card, 141 GB HBM3e, 4.8 TB/s; modelled with PCIe Gen5 between cards (its NVLink bridges "
             "join 2 or 4); 400 Gb/s per GPU", fp8_gemm_eff=H100_FP8_GEMM_EFF, host_link_gbps=50.0, host_mem_gbps=77.0),
    Gpu("mi300x", _sheet("MI300X"), 2614.9, 192.0, 304, 8, 50.0, 0.50, 0.40, 0.60, 0.45, MEMBOUND_EFF_UNMEASURED, XGMI_EFF,
        note="MI300X OAM; 7 Infinity Fabric links x 64 GB/s per GPU; 400 Gb/s per GPU", host_link_gbps=50.0, host_mem_gbps=115.0),
)


def _family(tflops: float, eff: float, table: dict[str, float] | None = None) -> dict[str, Any]:
    return {"tflops": tflops, "efficient_factor": eff, "accurate_efficient_factor": dict(table or {})}


def collective_tier(gbps: float, fixed_us: float, step_us: float, effs: dict[str, float] | None = None) -> dict[str, Any]:
    """A network tier dict: per op its ring shape, efficiency (the tier's 1.0 when None)
    and latency (fixed per call + per step)."""
    shape = {"all_reduce": (2, -1), "all_gather": (1, -1), "reduce_scatter": (1, -1), "all2all": (1, -1), "p2p": (1, 0)}
    ops: dict[str, Any] = {}
    for op, (sc, off) in shape.items():
        ops[op] = {"scale": sc, "offset": off, "latency_us": step_us, "fixed_latency_us": fixed_us}
        if effs is not None:
            ops[op]["efficient_factor"] = effs[op]
    return {"processor_usage": 0.0, "provenance": "datasheet", "gbps_unit": "GB",
            "bandwidth": {"efficient_factor": 1.0, "gbps": gbps, "latency_us": fixed_us}, "op": ops}


def build(gpu: Gpu, measured: dict[str, Any] | None = None) -> dict[str, Any]:
    """The system config of one preset; ``measured`` is the measured_base preset's dict."""
    tables = {}
    if measured is not None:
        tables = {name: spec.get("accurate_efficient_factor", {}) for name, spec in measured["accelerator"]["op"].items()}
    if gpu.table_tflops is not None:  # a sibling's kernel times: same seconds at this peak
        k = gpu.table_tflops / gpu.bf16_tflops
        tables = {name: {key: round(v * k, 6) for key, v in t.items()} for name, t in tables.items()}
        gpu = replace(gpu, gemm_eff=round(gpu.gemm_eff * k, 6), group_gemm_eff=round(gpu.group_gemm_eff * k, 6),
                      attn_fwd_eff=round(gpu.attn_fwd_eff * k, 6), attn_bwd_eff=round(gpu.attn_bwd_eff * k, 6))
    ops = {
        "default": _family(gpu.bf16_tflops, gpu.gemm_eff),
        "matmul": _family(gpu.bf16_tflops, gpu.gemm_eff, tables.get("matmul")),
        "group_matmul": _family(gpu.bf16_tflops, gpu.group_gemm_eff, tables.get("group_matmul")),
        "sdp_fwd": _family(gpu.bf16_tflops, gpu.attn_fwd_eff, tables.get("sdp_fwd")),
        "sdp_bwd": {**_family(gpu.bf16_tflops, gpu.attn_bwd_eff, tables.get("sdp_bwd")), "bwd_flops_ratio": gpu.attn_bwd_flops_ratio},
    }
    if gpu.fp4_tflops > 0:  # shapes from bf16, asymptote the bf16 fraction (no public FP4 GEMM survey yet)
        ops["fp4_matmul"] = _family(gpu.fp4_tflops, gpu.gemm_eff, tables.get("fp4_matmul"))
        ops["fp4_group_matmul"] = _family(gpu.fp4_tflops, gpu.group_gemm_eff, tables.get("fp4_group_matmul"))
    if gpu.fp8_tflops > 0:
        # fp8 tables are rarely measured: the fp8 families take each shape's efficiency from
        # the bf16 one, with the fp8 asymptote (fp8_gemm_eff; the bf16 fraction when unknown)
        fp8_eff = gpu.fp8_gemm_eff if gpu.fp8_gemm_eff is not None else gpu.gemm_eff
        ops["fp8_matmul"] = _family(gpu.fp8_tflops, fp8_eff, tables.get("fp8_matmul"))
        ops["fp8_group_matmul"] = _family(gpu.fp8_tflops, round(gpu.group_gemm_eff * fp8_eff / gpu.gemm_eff, 4),
                                          tables.get("fp8_group_matmul"))
    bandwidth = {"default": {"efficient_factor": gpu.hbm_eff, "gbps": gpu.hbm_gbps, "latency_us": 5.0}}
    if measured is not None:
        # measured memory-bound families (permute, cross-entropy) keep their fits as a
        # fraction of the bandwidth their file states, applied to this device's HBM
        for fam, spec in measured["accelerator"]["bandwidth"].items():
            if fam != "default":
                bandwidth[fam] = {**copy.deepcopy(spec), "gbps": gpu.hbm_gbps}
    accelerator: dict[str, Any] = {
        "backend": "rocm" if gpu.name.startswith("mi") else "cuda",
        "mem_gbs": gpu.mem_gib,
        "mode": "roofline",
        "sm_count": gpu.sm_count,
        "op": ops,
        "bandwidth": bandwidth,
    }
    if gpu.power_curve is not None:
        accelerator["power_curve"] = [list(p) for p in gpu.power_curve]
    elif measured is not None and measured["accelerator"].get("power_curve"):
        # tables timed at full clock come with the clock's response to the power limit
        # (cost/power.py); the same board at the same limit shares it
        accelerator["power_curve"] = copy.deepcopy(measured["accelerator"]["power_curve"])
    if gpu.nccl_max_ctas:
        accelerator["nccl_max_ctas"] = gpu.nccl_max_ctas
    if gpu.sibling_tables and gpu.measured_base:
        accelerator["tables_from"] = gpu.measured_base
    if measured is not None and measured["accelerator"].get("sm_contention") and measured["accelerator"].get("sm_count") in (None, gpu.sm_count):
        # the same SM array: a GEMM beside a kernel holding SMs leaves the same tail
        accelerator["sm_contention"] = copy.deepcopy(measured["accelerator"]["sm_contention"])
    return {
        "sys_name": gpu.name,
        "num_per_node": gpu.num_per_node,
        # the scale-out fabric as users state it: one NIC per GPU (DGX / HGX, NVL72 racks)
        "nics_per_node": gpu.num_per_node,
        "nic_gbps": gpu.nic_gbps * 8,
        "host_link_gbps": gpu.host_link_gbps,
        "host_mem_gbps": gpu.host_mem_gbps,
        "accelerator": accelerator,
        "networks": {
            "intra_with_pcie": False,
            "high_intra_node": collective_tier(gpu.scaleup_gbps, SCALEUP_FIXED_US, SCALEUP_STEP_US, gpu.scaleup_eff),
            "inter_node": collective_tier(gpu.nic_gbps, NIC_FIXED_US, NIC_STEP_US, NIC_EFF),
        },
    }


# Where each shipped system preset's efficiency numbers come from (`simumax presets system`)
SIMUMAX_MEASURED = {
    "a100_pcie": "measured: SimuMax's reference tables, 8x A100 80GB PCIe",
    "b200_bf16_ceperm": "measured: SimuMax's reference tables, 8x B200 (its file says 80 GB)",
    "nvidia_h100_80gb_hbm3": "measured: our simumax calibrate run on one H100 SXM, at full clock (docs/calibration.md)",
}


def _measured_curves(preset: str) -> tuple[bool, bool]:
    """Whether a shipped system preset carries a power curve (cost/power.py) and an SM
    contention curve (``accelerator.sm_contention``): its file says."""
    from simumax.config.loader import load_system  # the loader reads presets; this module only describes them

    acc = load_system(preset).accelerator
    return acc.power_curve is not None, acc.sm_contention is not None


def preset_provenance(name: str) -> str:
    """One line: measured tables, or datasheet peaks with which tables / default curves, and
    whether a power curve and an SM contention curve come with them."""
    gpu = next((g for g in GPUS if g.name == name), None)
    if gpu is None and name not in SIMUMAX_MEASURED:
        return "user file"
    power, sms = _measured_curves(name)
    contention = "; its SM contention" if sms else ""
    if gpu is None:
        return SIMUMAX_MEASURED[name] + ("; with its measured power curve" if power else "") + contention
    if gpu.measured_base:
        power_note = ("; its own measured power curve" if gpu.power_curve else "; its power curve" if power else "")
        same = " as that device's kernel times (the same die)" if gpu.table_tflops else ""
        return f"derived: datasheet peaks and fabric, compute tables of {gpu.measured_base}{same}{power_note}{contention}"
    if gpu.table_tflops:
        return (f"derived: datasheet peaks and fabric, default efficiency curves at the kernel rates of its "
                f"{gpu.table_tflops:g} TFLOP/s sibling (the same die; no table)")
    return "derived: datasheet peaks and fabric, default efficiency curves (no table)"
