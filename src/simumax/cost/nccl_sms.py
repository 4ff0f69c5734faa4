"""SMs the data-parallel collectives' NCCL kernels hold while they overlap compute.

NCCL runs a collective as one CTA per channel, each resident on an SM for the collective's
whole run; GEMMs beside it plan their tiles for every SM and lose more than the SMs' share
(``AcceleratorConfig.slowdown_beside``: measured on an H100, 0.27 extra GEMM time per second
of overlap at 16 SMs held, 0.37 at 32). How many CTAs a gradient reduce-scatter or parameter
all-gather launches depends on NCCL's algorithm and the group's fabric:

* with ``nccl_ub`` (Megatron ``--use-nccl-ub``: DP/FSDP buffers registered with NCCL), the
  SM-efficient algorithms megatron-core's ``DistributedDataParallelConfig.nccl_ub`` states
  (0.19): NVLink only 4 (all-gather) / 5 (reduce-scatter); NVLink + IB 16 / 16, 6 / 6 with
  SHARP (``use_sharp``); IB only 1 / 4, 1 / 1 with SHARP;
* otherwise NCCL's conventional ring kernels, which on a group whose ranks share NVLink
  launch as many channels as NCCL may (``accelerator.nccl_max_ctas``: megatron-core's
  ``parallel_state.get_nccl_options`` gives NCCL's Hopper default max_ctas = 32), while over
  IB alone a NIC's bandwidth needs few: the table's IB ring figure (its reduce-scatter's 4)
  for all-gather and reduce-scatter alike (the registered all-gather's 1 SM is a different
  algorithm).

Without ``nccl_max_ctas`` (every non-Hopper preset, SimuMax files) NCCL's counts on the GPU
are not known (megatron-core states them for Hopper) and the overlap stays free, as before.
A tier's measured ``processor_usage`` or its ``comm_sms`` (NCCL's channel count as
NCCL_DEBUG=INFO prints it) replaces the conventional count, not the registered one.
"""

from __future__ import annotations

DP_GROUPS = frozenset({"dp", "edp", "dp_shard", "dp_rep"})

# megatron-core DistributedDataParallelConfig.nccl_ub: (all-gather, reduce-scatter) SMs
UB_SMS = {
    ("nvl", False): (4, 5), ("nvl", True): (4, 5),
    ("nvl+ib", False): (16, 16), ("nvl+ib", True): (6, 6),
    ("ib", False): (1, 4), ("ib", True): (1, 1),
}


def domain(size: int, stride: int, intra_node: bool, per_node: int, pcie: bool) -> str | None:
    """The fabric a group's collectives cross: 'nvl' (one NVLink domain), 'nvl+ib' (several
    ranks per node and several nodes), 'ib' (one rank per node, or nodes whose GPUs share
    PCIe, not NVLink); None inside a PCIe node."""
    if intra_node:
        return None if pcie else "nvl"
    return "ib" if stride >= per_node or size <= 1 or pcie else "nvl+ib"


def dp_collective_sms(fabric: str | None, kind: str, nccl_ub: bool, use_sharp: bool,
                      max_ctas: int | None) -> int:
    """SMs one DP collective holds: ``kind`` 'gather' (parameter all-gather) or 'reduce'
    (gradient reduce-scatter / all-reduce); 0 where nothing says (see the module docstring)."""
    if fabric is None or not max_ctas:
        return 0
    gather, reduce = UB_SMS[(fabric, use_sharp and nccl_ub)]
    if nccl_ub:
        return gather if kind == "gather" else reduce
    # conventional ring kernels: all-gather and reduce-scatter alike, as many channels as
    # the fabric lets NCCL fill (over IB alone the table's ring figure, its reduce-scatter)
    return reduce if fabric == "ib" else max_ctas
