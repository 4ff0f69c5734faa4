"""Hardware config (SimuMax ``system/*.json`` format): accelerator peaks, kernel
efficiency tables and network tiers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, PrivateAttr, field_validator, model_serializer, model_validator

from simumax.compat.config_methods import SimuMaxSystemMethods
from simumax.config.base import ConfigBase
from simumax.config.simumax_fields import system_input
from simumax.errors import ConfigError
from simumax.graph.kernels import SIMUMAX_SDP_BWD_RATIO

# Measured efficiencies may exceed 1 a little (the reference B200 and our H100 tables reach
# 1.21 where a kernel beats the FLOP or byte count it is credited with); more is a typo.
MAX_EFFICIENCY = 1.5
MAX_LINK_EFFICIENCY = 2.0  # fitted bus-bandwidth fractions (the reference B200 file has 1.45)
# SimuMax's collective time divides bytes by gbps x 2^30: only so do our estimates of its
# two systems' jobs track its published predictions as TP and DP traffic grow (docs/compat.md)
SIMUMAX_LINK_GB = float(2**30)


def link_bytes_per_gb(unit: str | None) -> float:
    """Bytes in one "GB" of a network tier's bandwidth figures, by its ``gbps_unit``
    (unset: SimuMax's files, 2^30)."""
    return 1e9 if unit == "GB" else SIMUMAX_LINK_GB


def _without_unset(out: dict[str, Any], field: str) -> dict[str, Any]:
    """A dump without ``field`` while it is unset: SimuMax files do not have it."""
    if out.get(field) is None:
        out.pop(field, None)
    return out


class ComputeOpSpec(ConfigBase):
    """Peak and efficiency of one compute kernel family (matmul, sdp_fwd, ...)."""

    tflops: float = Field(ge=0, le=1e6, description="Peak dense TFLOP/s for this family (0: none, e.g. no FP8 units).")
    efficient_factor: float = Field(
        ge=0, le=MAX_EFFICIENCY, description="Fallback fraction of peak when no table entry matches (0: none)."
    )
    accurate_efficient_factor: dict[str, float] = Field(
        default_factory=dict, description="Measured efficiency per shape key (SimuMax key strings)."
    )
    bwd_flops_ratio: float | None = Field(
        None, gt=0, le=10,
        description="sdp_bwd: backward FLOPs per (non-causal) forward FLOP this family's efficiencies were computed "
        "with. Unset: SimuMax's convention, 2.5; simumax calibrate writes 2.0.",
    )

    @field_validator("accurate_efficient_factor")
    @classmethod
    def _entries(cls, table: dict[str, float]) -> dict[str, float]:
        for key, eff in table.items():
            if not (0 < eff <= MAX_EFFICIENCY):
                raise ConfigError(f"accurate_efficient_factor[{key!r}]", f"must be in (0, {MAX_EFFICIENCY}] (got {eff})")
        return table

    @property
    def sdp_bwd_ratio(self) -> float:
        return SIMUMAX_SDP_BWD_RATIO if self.bwd_flops_ratio is None else self.bwd_flops_ratio

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        return _without_unset(handler(self), "bwd_flops_ratio")


class BandwidthSpec(ConfigBase):
    """A memory-bound kernel family or a link: bandwidth, efficiency and per-call latency."""

    gbps: PositiveFloat = Field(le=1e7, description="Bandwidth in GB/s (1e9 bytes/s).")
    efficient_factor: float = Field(1.0, gt=0, le=MAX_EFFICIENCY, description="Achieved fraction of gbps.")
    latency_us: float = Field(
        0.0, ge=0, le=1e6, description="Microseconds per kernel (memory families) or per call (network tiers, for ops without their own)."
    )


def _points(field: str, pts: list[list[float]] | None, what: str) -> list[list[float]] | None:
    """A curve given as [x, y] points, as floats (None: unset)."""
    if pts is None:
        return None
    if not pts or any(len(p) != 2 for p in pts):
        raise ConfigError(field, f"give [{what}] points (at least one), or leave it unset")
    return [[float(a), float(b)] for a, b in pts]


class AcceleratorConfig(ConfigBase):
    backend: str = Field("cuda", description="Runtime backend name (informational).")
    mem_gbs: PositiveFloat = Field(le=1e6, description="Device memory in GiB.")
    mode: str = Field("roofline", description="Cost mode; only roofline is defined.")
    sm_count: PositiveInt | None = Field(
        None, description="Streaming multiprocessors (CUs): wave quantisation in the fitted and default efficiency curves."
    )
    op: dict[str, ComputeOpSpec] = Field(description="Compute families: matmul, group_matmul, sdp_fwd, sdp_bwd, fp8_*, default.")
    bandwidth: dict[str, BandwidthSpec] = Field(
        description="Memory-bound families: default, permute_fwd, permute_bwd, ce, ce_fusion."
    )
    power_curve: list[list[float]] | None = Field(
        None,
        description="Power-limited clocks: [tensor-core time share, tensor-core rate vs the tables] points, measured "
        "by simumax calibrate on a GPU whose tables it timed at full clock (docs/calibration.md). Unset: tensor-core "
        "kernels run at their table rate whatever their share.",
    )

    sm_contention: list[list[float]] | None = Field(
        None,
        description="Compute beside a kernel that holds SMs: [SMs held, extra GEMM time per second of overlap] "
        "points, measured with benchmarks/sm_share_contention.py (GEMMs planned for every SM leave a tail when some "
        "are taken). Unset: c / (SMs - c), the GEMM on the SMs left. Used for the flex (DeepEP / HybridEP) "
        "dispatcher's moe_flex_dispatcher_num_sms, a tier's comm_sms and the overlapped data-parallel collectives' "
        "NCCL kernels (nccl_max_ctas, cost/nccl_sms.py).",
    )

    tables_from: str | None = Field(
        None, description="The sibling device (same die) whose measured kernel tables this system reuses where its "
        "kernels run at other rates (GB200 on the B200's: a larger power budget): the kernels keep those times, and "
        "the uncertainty band counts them as unmeasured. simumax calibrate clears it.",
    )
    nccl_max_ctas: PositiveInt | None = Field(
        None, description="NCCL's default cap on the CTAs (channels) a collective launches on this GPU (max_ctas; "
        "megatron-core: 32 on Hopper). With it, overlapped data-parallel collectives on NVLink hold that many SMs and "
        "slow the compute beside them by slowdown_beside (cost/nccl_sms.py). Unset: taken as free unless a tier gives "
        "processor_usage or comm_sms.",
    )

    @field_validator("sm_contention")
    @classmethod
    def _sm_contention(cls, pts: list[list[float]] | None) -> list[list[float]] | None:
        pts = _points("accelerator.sm_contention", pts, "SMs held, slowdown")
        if pts is not None:
            held = [p[0] for p in pts]
            if held != sorted(set(held)) or held[0] <= 0 or any(u < 0 for _, u in pts):
                raise ConfigError("accelerator.sm_contention",
                                  "SMs held must increase from point to point from above 0, and slowdowns be >= 0")
        return pts

    def slowdown_beside(self, sms_held: float) -> float:
        """Extra compute time per second of overlap with a kernel holding ``sms_held`` SMs:
        the measured ``sm_contention`` points, linear between them and from (0, 0), the last
        segment carried on past the last point; without them c / (SMs - c). At most 1, and 0
        without an SM count."""
        if sms_held <= 0 or not self.sm_count:
            return 0.0
        pts = self.sm_contention
        if not pts:
            left = self.sm_count - sms_held
            return 1.0 if left <= 0 else min(1.0, sms_held / left)
        xs, ys = [0.0, *(p[0] for p in pts)], [0.0, *(p[1] for p in pts)]
        i = next((j for j in range(1, len(xs)) if sms_held <= xs[j]), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, min(1.0, y0 + (y1 - y0) * (sms_held - x0) / (x1 - x0)))

    @field_validator("power_curve")
    @classmethod
    def _power_curve(cls, pts: list[list[float]] | None) -> list[list[float]] | None:
        pts = _points("accelerator.power_curve", pts, "share, rate")
        if pts is None:
            return None
        for share, rate in pts:
            if not 0 < share <= 1 or not 0 < rate <= 1:
                raise ConfigError("accelerator.power_curve",
                                  f"points are [share, rate] with share in (0, 1] and rate in (0, 1] (got [{share:g}, {rate:g}])")
        shares = [p[0] for p in pts]
        if shares != sorted(set(shares)):
            raise ConfigError("accelerator.power_curve", "shares must increase from point to point")
        return pts

    @model_validator(mode="after")
    def _defaults(self) -> "AcceleratorConfig":
        if "default" not in self.op:
            raise ConfigError("accelerator.op.default", "required (fallback peak for ops without a family)")
        if "default" not in self.bandwidth:
            raise ConfigError("accelerator.bandwidth.default", "required (HBM bandwidth)")
        return self


class CollectiveSpec(ConfigBase):
    """α-β parameters of one collective on one tier.

    time = bytes * scale * (n + offset) / n / (gbps * efficient_factor)
           + steps * latency + fixed latency,
    steps = scale * (n + offset): the ring's hops (2(n-1) all-reduce, n-1 all-gather /
    reduce-scatter / all-to-all, 1 p2p; across nodes all-reduce takes 2*ceil(log2 nodes)).
    """

    scale: float = Field(1.0, gt=0, le=16, description="Bytes multiplier (2 for ring all-reduce).")
    offset: float = Field(-1.0, ge=-1, le=16, description="Ring factor (n + offset) / n; -1 gives (n-1)/n (>= 0 for n >= 1).")
    efficient_factor: float | None = Field(None, gt=0, le=MAX_LINK_EFFICIENCY, description="Link efficiency; default the tier's.")
    latency_us: float | None = Field(
        None, ge=0, le=1e6, description="Latency per ring step (see steps above); unset: the tier's latency once per call."
    )
    fixed_latency_us: float = Field(0.0, ge=0, le=1e6, description="Extra constant per call.")
    fixed_latency_us_by_comm_num: dict[str, float] = Field(
        default_factory=dict, description="Extra constant per call by group size (overrides fixed_latency_us)."
    )
    dp_fixed_bw: dict[str, float] = Field(
        default_factory=dict, description="Measured bus bandwidth (GB/s) by group size for DP collectives."
    )

    @field_validator("fixed_latency_us_by_comm_num", "dp_fixed_bw")
    @classmethod
    def _by_size(cls, table: dict[str, float], info: Any) -> dict[str, float]:
        positive = info.field_name == "dp_fixed_bw"
        for key, v in table.items():
            if not key.isdigit() or int(key) < 1:
                raise ConfigError(f"{info.field_name}[{key!r}]", "keys are group sizes (positive integers)")
            if (v <= 0 if positive else v < 0) or v > 1e6:
                raise ConfigError(f"{info.field_name}[{key!r}]", f"must be {'> 0' if positive else '>= 0'} and <= 1e6 (got {v})")
        return table


class NetworkTier(ConfigBase):
    processor_usage: float = Field(0.0, ge=0, le=1, description="Compute slowdown while this tier communicates.")
    comm_sms: PositiveInt | None = Field(
        None, description="SMs this tier's collectives hold while they run: NCCL's channel count (its NCCL_DEBUG=INFO "
        "'coll channels', or NCCL_MIN_CTAS / NCCL_MAX_CTAS). With it and no processor_usage above 0, the compute "
        "they overlap slows by accelerator.slowdown_beside(comm_sms) (the measured sm_contention curve).",
    )
    provenance: Literal["measured", "datasheet"] | None = Field(
        None, description="Where the tier's numbers come from: measured (simumax calibrate-comm) or datasheet (a "
        "preset's fabric; an inter_node bandwidth set from nics_per_node x nic_gbps). Unset: as a file gives them, "
        "counted as measured. Time on datasheet tiers widens the uncertainty band.",
    )
    gbps_unit: Literal["GB", "GiB"] | None = Field(
        None, description="What a 'GB' of this tier's bandwidth.gbps and dp_fixed_bw is: GB (1e9 bytes) or GiB (2^30 "
        "bytes). Unset: GiB, as SimuMax's estimates read its files (docs/compat.md); the presets, calibrate-comm and "
        "a bandwidth derived from nics_per_node x nic_gbps say GB.",
    )
    bandwidth: BandwidthSpec = Field(description="Link bandwidth per GPU.")
    op: dict[str, CollectiveSpec] = Field(
        default_factory=dict, description="all_reduce, all_gather, reduce_scatter, all2all, p2p."
    )

    @property
    def measured(self) -> bool:
        return self.provenance != "datasheet"

    @property
    def bytes_per_gb(self) -> float:
        """Bytes per second in one unit of ``gbps``."""
        return link_bytes_per_gb(self.gbps_unit)

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        return _without_unset(_without_unset(handler(self), "provenance"), "gbps_unit")


class NetworksConfig(ConfigBase):
    """Network tiers by name; SimuMax stores them flat next to ``intra_with_pcie``."""

    intra_with_pcie: bool = Field(False, description="Intra-node links are PCIe (tiers intra_node_pcie_<n>x).")
    tiers: dict[str, NetworkTier] = Field(default_factory=dict, description="Tier name -> tier.")

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tiers" not in data:
            data = dict(data)
            flag = data.pop("intra_with_pcie", False)
            return {"intra_with_pcie": flag, "tiers": data}
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        return {"intra_with_pcie": out["intra_with_pcie"], **out["tiers"]}


class SystemConfig(SimuMaxSystemMethods, ConfigBase):
    """One node type: ``num_per_node`` accelerators and the networks joining them."""

    sys_name: str = Field("system", description="Name shown in reports.")
    num_per_node: PositiveInt = Field(8, description="Accelerators per node.")
    accelerator: AcceleratorConfig
    networks: NetworksConfig
    FC8: bool = Field(False, description="SimuMax flag kept for compatibility; no effect.")
    nics_per_node: PositiveInt | None = Field(
        None, description="Scale-out NICs per node (DGX A100 / H100: 8). With nic_gbps it sets the inter_node tier's "
        "bandwidth per GPU: nics_per_node x nic_gbps / 8 / num_per_node GB/s.",
    )
    nic_gbps: PositiveFloat | None = Field(
        None, description="Line rate of one scale-out NIC in Gb/s (HDR 200, NDR 400, XDR / ConnectX-8 800)."
    )
    nvlink_domain: PositiveInt | None = Field(
        None, description="GPUs on one scale-up (NVLink / NVSwitch) fabric when it spans more than a node (NVL72: 72); "
        "groups inside it use the intra-node tiers. Default num_per_node.",
    )
    rail_optimized: bool = Field(
        True, description="Scale-out fabric rail-optimised (DGX SuperPOD: NIC i of every node on leaf switch i); false: "
        "every NIC of a node on one top-of-rack leaf. With leaf_radix it sets how many nodes one leaf serves.",
    )
    leaf_radix: PositiveInt | None = Field(
        None, le=4096, description="Ports of a leaf switch (NDR QM9700: 64). Cross-leaf traffic then shares the leaf's "
        "uplinks (cost/fabric.py); null: one non-blocking fabric, no leaf layer modelled.",
    )
    leaf_oversubscription: float = Field(
        1.0, ge=1.0, le=64.0, description="Leaf down:up bandwidth ratio (1 non-blocking, 2 for 2:1 ...): traffic leaving a "
        "leaf gets 1/ratio of the NIC rate when every NIC sends (needs leaf_radix).",
    )
    host_link_gbps: PositiveFloat = Field(
        25.0, le=1e5, description="GPU <-> host bandwidth per GPU, one direction, GB/s achieved (PCIe Gen4 x16 ~25, "
        "Gen5 ~50, NVLink-C2C on GH200 / GB200 ~450): optimizer CPU offload moves gradients and parameters over it.",
    )
    host_mem_gbps: PositiveFloat = Field(
        50.0, le=1e5, description="Host memory bandwidth per GPU (the node's DRAM bandwidth / GPUs), GB/s: the offloaded "
        "optimizer step is bound by it.",
    )
    host_op_us: NonNegativeFloat = Field(
        30.0, le=1e5, description="Host time to issue one PyTorch op from Python (dispatch, allocation, launch), us: "
        "bounds steps that loop over weights op by op (Muon's); per kernel launch, the host time of a rank's passes "
        "that perf reports (not added to the time). Measured on two lent H100 machines: 13-33 us per op of "
        "Muon's step, median 30 (a plain in-place add: 16).",
    )
    host_sync_us: NonNegativeFloat = Field(
        130.0, le=1e6, description="GPU idle per host wait inside a pass, us: a device-to-host read the host waits for, "
        "then the host issuing work again (the dropless MoE dispatchers' token counts, Megatron's loss NaN check, its "
        "batched pipeline exchange). Measured on the lent H100's host: 91-231 us per MoE layer, 136 between large "
        "GEMMs (77 us round trip on an idle GPU); 0: no waits.",
    )
    _warned: set[str] = PrivateAttr(default_factory=set)

    @model_validator(mode="before")
    @classmethod
    def _simumax_input(cls, data: Any) -> Any:
        return system_input(data)

    def first_warning(self, key: str) -> bool:
        """True the first time ``key`` is asked of this config: a warning about a loaded
        system is logged once, not once per estimate of a search."""
        new = key not in self._warned
        self._warned.add(key)
        return new

    @model_validator(mode="after")
    def _tiers(self) -> "SystemConfig":
        if not self.networks.tiers:
            raise ConfigError("networks", "needs at least one tier")
        if (self.nics_per_node is None) != (self.nic_gbps is None):
            missing = "nic_gbps" if self.nic_gbps is None else "nics_per_node"
            raise ConfigError(missing, "the scale-out fabric needs both nics_per_node and nic_gbps (Gb/s per NIC)")
        if self.nics_per_node is not None:
            gbps = self.inter_node_gbps_per_gpu
            tier = self.networks.tiers.get("inter_node")
            if tier is None:
                from simumax.config.hardware import NIC_EFF, NIC_FIXED_US, NIC_STEP_US, collective_tier

                self.networks.tiers["inter_node"] = NetworkTier.model_validate(collective_tier(gbps, NIC_FIXED_US, NIC_STEP_US, NIC_EFF))
            elif tier.bandwidth.gbps != gbps or tier.gbps_unit != "GB":
                tier.bandwidth.gbps = gbps
                tier.gbps_unit = "GB"  # line rates in Gb/s over 8: decimal GB/s
                tier.provenance = "datasheet"  # the bandwidth now comes from the NICs' line rate
        if self.leaf_oversubscription != 1.0 and self.leaf_radix is None:
            raise ConfigError("leaf_oversubscription", "needs leaf_radix (the leaf switch's port count)")
        if self.nvlink_domain is not None and self.nvlink_domain < self.num_per_node:
            raise ConfigError("nvlink_domain", f"must be >= num_per_node ({self.num_per_node})")
        return self

    @property
    def inter_node_gbps_per_gpu(self) -> float:
        """GB/s each GPU gets of its node's NICs (every GPU of a node runs its own group's
        collective at once, so each uses its share)."""
        assert self.nics_per_node is not None and self.nic_gbps is not None
        return self.nics_per_node * self.nic_gbps / 8 / self.num_per_node

    @property
    def scaleup_size(self) -> int:
        """GPUs one scale-up fabric joins: the NVLink domain, else the node."""
        return self.nvlink_domain or self.num_per_node

    @property
    def mem_bytes(self) -> int:
        return int(self.accelerator.mem_gbs * 2**30)
