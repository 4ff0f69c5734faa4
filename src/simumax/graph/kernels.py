"""The kernels an op launches. Each knows its FLOPs and bytes; costing lives in cost/."""

from __future__ import annotations

from typing import Literal, NamedTuple

GemmLayout = Literal["TN", "NN", "NT"]  # fwd, dgrad, wgrad (cuBLAS column-major convention)
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "all2all", "p2p"]
# (experts, top-k, routing groups, groups chosen; 0 without group-limited routing): the
# routing of an all-to-all that sends each token once per destination (cost/moe_fanout.py)
Fanout = tuple[int, int, int, int]
Group = Literal["tp", "cp", "cp_a2a", "cp_p2p", "ep", "etp", "dp", "edp", "pp"]


_IN_BYTES = {False: 2, True: 1}  # operand bytes: bf16/fp16, fp8
_OUT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# A GEMM family on fp32 operands run on TF32 tensor cores (Megatron's fp32 router GEMMs):
# priced as its bf16 twin's shape at TF32's rate (cost/efficiency.py)
TF32_PREFIX = "tf32_"
# A MemBound of this family is no kernel: the GPU idles while the host waits for a
# device-to-host copy and then issues work again (system.host_sync_us; cost/efficiency.py)
HOST_SYNC = "host_sync"


def operand_bytes(family: str) -> int:
    """Bytes per GEMM operand element of a kernel family: fp8 1, TF32 (fp32 operands) 4, else 2."""
    if family.startswith(TF32_PREFIX):
        return 4
    return _IN_BYTES[family.startswith("fp8")]


def gemm_bytes(m: int, k: int, n: int, in_bytes: int, out_bytes: int, accumulate: bool) -> float:
    """Least HBM traffic of C[m, n] (+)= A[m, k] B[k, n]."""
    return float((m * k + k * n) * in_bytes + m * n * out_bytes * (2 if accumulate else 1))


class Gemm(NamedTuple):
    """C[m, n] = A[m, k] @ B[k, n]; m = tokens in fwd/dgrad, = out features in wgrad.
    ``fused``: a product inside a fused kernel (a Triton scan's), whose operands and result
    stay on chip: it moves no HBM bytes of its own (the kernel's traffic is a MemBound of its
    own), so only its tensor-core time counts."""

    m: int
    k: int
    n: int
    layout: GemmLayout
    accumulate: bool = False
    out_dtype: str = "bf16"
    b: int = 1
    family: str = "matmul"
    fused: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.b * self.m * self.k * self.n

    @property
    def bytes(self) -> float:
        """HBM traffic at the least: both operands read once, the output written (and read
        too when accumulating); operands 1 B in the fp8 family, 4 in a TF32 one, else 2;
        none for a product inside a fused kernel."""
        if self.fused:
            return 0.0
        return self.b * gemm_bytes(self.m, self.k, self.n, operand_bytes(self.family),
                                   _OUT_BYTES.get(self.out_dtype, 2), self.accumulate)

    @property
    def key(self) -> str:
        """SimuMax's shape-table key, so measured tables apply unchanged."""
        return (
            f"b={self.b}, m={self.m}, k={self.k}, n={self.n}, layout={self.layout}, "
            f"accumulate={self.accumulate}, out_dtype={self.out_dtype}"
        )


GroupStage = Literal["fwd", "bwd_grad_act", "bwd_grad_w"]


class GroupGemm(NamedTuple):
    """TransformerEngine grouped GEMM over ``ng`` local experts, each [M, K] @ [K, N].

    M, N, K are the forward shape in every stage (as SimuMax keys its measured table);
    ``stage`` says which product runs: forward, input gradient, or weight gradient
    (accumulated into the main-grad dtype).
    """

    ng: int
    M: int
    N: int
    K: int
    stage: GroupStage
    main_grad_dtype: str = "fp32"
    dtype: str = "bf16"  # "fp8" in the fp8 family
    family: str = "group_matmul"

    @property
    def flops(self) -> float:
        return 2.0 * self.ng * self.M * self.N * self.K

    @property
    def bytes(self) -> float:
        """Least HBM traffic over all groups (the product this stage runs, see ``Gemm.bytes``)."""
        M, N, K, inb = self.M, self.N, self.K, _IN_BYTES[self.dtype == "fp8"]
        if self.stage == "fwd":  # [M, K] @ [K, N]
            one = gemm_bytes(M, K, N, inb, 2, False)
        elif self.stage == "bwd_grad_act":  # dY [M, N] @ W^T [N, K]
            one = gemm_bytes(M, N, K, inb, 2, False)
        else:  # X^T [K, M] @ dY [M, N], accumulated into the main grad
            one = gemm_bytes(K, M, N, inb, _OUT_BYTES.get(self.main_grad_dtype, 4), True)
        return self.ng * one

    @property
    def key(self) -> str:
        grad = self.stage != "fwd"
        return (
            f"ng={self.ng}, M={self.M}, N={self.N}, K={self.K}, dtype={self.dtype}, out_dtype=bf16, "
            f"main_grad_dtype={self.main_grad_dtype}, stage={self.stage}, grad={grad}, "
            f"accumulate={self.stage == 'bwd_grad_w'}, use_split_accumulator={grad}, single_output={not grad}"
        )


# Backward FLOPs per forward FLOP in the convention a measured attention table was
# computed with: SimuMax's measuring script counts the flash-attention backward as 5 x
# base against the forward's 2 x base (2.5); ``simumax calibrate`` and the MFU convention
# count 2x (dS = dO V^T, dP, dQ = dS K, dK = dS^T Q, dV = P^T dO: four GEMMs to the forward's two).
SIMUMAX_SDP_BWD_RATIO = 2.5
MODEL_SDP_BWD_RATIO = 2.0


class Attention(NamedTuple):
    """Fused (flash) attention, one direction.

    ``flops`` counts what the model needs (causal: half the score matrix; backward 2x
    forward, the MFU convention). ``table_flops(ratio)`` is the convention efficiency
    tables are written in (no causal halving; backward ``ratio`` x forward, the ratio
    recorded per table: ``ComputeOpSpec.bwd_flops_ratio``).
    """

    phase: Literal["fwd", "bwd"]
    batch: int
    seq_len: int
    head_num: int
    kv_head_num: int
    qk_head_dim: int
    v_head_dim: int
    causal: bool = True
    qkv_contiguous: bool = True
    kv_seq_len: int | None = None  # keys per query when not seq_len (context-parallel blocks)
    window: int | None = None  # sliding window: keys each query attends at most, itself included
    # the forward kernel run again inside a backward for its output (DSA's SparseMLA): its time
    # counts, its FLOPs are a recomputation, not the model's
    rerun: bool = False

    @property
    def fwd_table_flops(self) -> float:
        """The forward's FLOPs over the whole (non-causal) score matrix; a sliding window
        scales it by the share of the causal triangle the band covers, so a window kernel
        costs its work at the efficiency of the causal kernel of its shape (flash attention
        skips the blocks outside the band)."""
        kv = self.kv_seq_len or self.seq_len
        full = 2.0 * self.batch * self.head_num * self.seq_len * kv * (self.qk_head_dim + self.v_head_dim)
        if self.window is None:
            return full
        return full * window_pairs(self.seq_len, self.window, kv) / causal_pairs(self.seq_len, kv)

    def table_flops(self, bwd_ratio: float = MODEL_SDP_BWD_RATIO) -> float:
        return self.fwd_table_flops if self.phase == "fwd" else bwd_ratio * self.fwd_table_flops

    @property
    def flops(self) -> float:
        if self.rerun:
            return 0.0
        s = self.seq_len
        if self.window is not None:  # table FLOPs already cover the band's (query, key) pairs only
            kv = self.kv_seq_len or s
            return self.table_flops() * causal_pairs(s, kv) / (s * kv)
        frac = (s + 1) / (2 * s) if self.causal else 1.0
        return self.table_flops() * frac

    @property
    def family(self) -> str:
        return "sdp_fwd" if self.phase == "fwd" else "sdp_bwd"

    @property
    def key(self) -> str:
        kv = f", kv_seq_len={self.kv_seq_len}" if self.kv_seq_len else ""
        # SimuMax's keys (all causal) stay as they are; a non-causal block says so: its
        # efficiency, in the FLOPs-over-the-whole-matrix convention, is half a causal one's
        causal = "" if self.causal else ", causal=False"
        return (
            f"batch={self.batch}, seq_len={self.seq_len}{kv}, head_num={self.head_num}, "
            f"kv_head_num={self.kv_head_num}, qk_head_dim={self.qk_head_dim}, "
            f"v_head_dim={self.v_head_dim}, qkv_contiguous={self.qkv_contiguous}{causal}"
        )


def window_pairs(s: int, w: int, kv: int | None = None) -> float:
    """(query, key) pairs of causal attention with a window of w keys (itself included):
    s queries over s tokens, or (``kv``) the last s of kv keys, as a query chunk sees the
    keys before it (flash attention's bottom-right alignment)."""
    offset = (kv or s) - s
    short = min(s, max(0, w - offset - 1))  # queries that see fewer than w keys
    return short * (offset + 1) + short * (short - 1) / 2 + (s - short) * w


def causal_pairs(s: int, kv: int | None = None) -> float:
    """(query, key) pairs of causal attention of the last s of kv (default s) keys."""
    return s * ((kv or s) - s) + s * (s + 1) / 2


class MemBound(NamedTuple):
    """A bandwidth-bound kernel (norm, activation, add, softmax, CE, optimizer ...), or a
    chain of ``launches`` such kernels that a family's measured line times as one unit
    (family ``HOST_SYNC``: no kernel but a host wait, ``host_wait``).

    ``bytes`` is what the kernels move. ``table_bytes``, when set, is the size in the
    convention a measured line of the family was fitted in (SimuMax's cross-entropy: one
    kernel reading the logits and making three fp32 passes); a family without a measured
    line runs on the default HBM line with ``bytes`` and a latency per launch."""

    name: str
    bytes: float
    family: str = "default"  # key into accelerator.bandwidth
    flops: float = 0.0
    table_bytes: float | None = None
    launches: int = 1


def host_wait(name: str) -> MemBound:
    """The GPU's idle while the host waits on a device-to-host copy in the middle of a pass."""
    return MemBound(name, 0.0, family=HOST_SYNC)


class Collective(NamedTuple):
    """One collective on a parallel group.

    ``bytes`` is the logical buffer: the gathered output for all_gather, the full input
    for reduce_scatter, the tensor for all_reduce, the send buffer for all2all / p2p.
    An all2all with a ``fanout`` is a token dispatch that sends each token once per
    destination rank and node (DeepEP, Megatron's flex dispatcher), ``bytes`` still one
    copy per routed expert.
    """

    op: CollectiveOp
    bytes: float
    group: Group
    fanout: Fanout | None = None

    flops = 0.0


Kernel = Gemm | GroupGemm | Attention | MemBound | Collective


def op_label(op_name: str) -> str:
    """An op's name without its layer ("L5.attn_norm" -> "attn_norm"), for kernel labels:
    the kernels of every layer of one kind are then equal, and those layers share them
    (graph/relabel.py)."""
    head, sep, rest = op_name.partition(".")
    return rest if sep and head[:1] == "L" and head[1:].isdigit() else op_name
