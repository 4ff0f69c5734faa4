"""How fast an fp8 quantize runs against a plain copy (docs/calibration.md, "An fp8 step").

TransformerEngine casts every fp8 GEMM input and output gradient into both layouts (row-wise
and the transposed column-wise copy); the op IR costs that as memory traffic on the
device's memory-bound line (graph/fp8.py). TE itself cannot travel to the lent GPU, so this
times what can: on bf16 tensors of Llama shapes, a copy of the same bytes (the line's
reference), the row-wise cast alone, amax alone, both layouts from torch.compile (what
check-step --fp8 runs) and both layouts from a tiled Triton kernel with the amax fused
(the structure of TE's cast-transpose for delayed scaling). Effective bandwidth = bytes the
kernel must move / time. Prints and writes ``$OUT/fp8_cast_bandwidth.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

SHAPES = [(4096, 4096), (4096, 11008), (4096, 14336), (8192, 4096), (4096, 28672), (8192, 14336)]
E4M3 = torch.float8_e4m3fn


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100) * 1e-3  # seconds


def rowwise(x, s):
    return torch.clamp(x.float() * s, -448.0, 448.0).to(E4M3)


def both(x, s):
    xs = torch.clamp(x.float() * s, -448.0, 448.0)
    return xs.to(E4M3), xs.t().contiguous().to(E4M3)


def amax(x):
    return x.abs().amax().float()


def triton_cast_transpose():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, q_ptr, qt_ptr, s_ptr, amax_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        x = tl.load(x_ptr + rm[:, None] * N + rn[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(x), axis=1), axis=0))
        y = tl.clamp(x * tl.load(s_ptr), -448.0, 448.0).to(tl.float8e4nv)
        tl.store(q_ptr + rm[:, None] * N + rn[None, :], y, mask=mask)
        tl.store(qt_ptr + rn[None, :] * M + rm[:, None], y, mask=mask)

    def run(x, s, q, qt, am, bm, bn, warps):
        m, n = x.shape
        kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](x, q, qt, s, am, m, n, BM=bm, BN=bn, num_warps=warps)

    return run


def main() -> None:
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    c_row, c_both, c_amax = (torch.compile(f, dynamic=False) for f in (rowwise, both, amax))
    try:
        tri = triton_cast_transpose()
    except Exception as exc:  # noqa: BLE001 (a benchmark: report and go on)
        print("no triton kernel:", exc, file=sys.stderr)
        tri = None
    rows = []
    for m, n in SHAPES:
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        s = torch.ones((), device=dev)
        y = torch.empty_like(x)
        e = m * n
        r = {"shape": [m, n], "bytes_per_elem": {"copy": 4, "rowwise": 3, "amax": 2, "both": 4, "triton_both_amax": 4}}
        t = {"copy": bench(lambda: y.copy_(x)), "rowwise": bench(lambda: c_row(x, s)),
             "amax": bench(lambda: c_amax(x)), "both": bench(lambda: c_both(x, s))}
        if tri is not None:
            q = torch.empty(m, n, device=dev, dtype=E4M3)
            qt = torch.empty(n, m, device=dev, dtype=E4M3)
            am = torch.zeros((), device=dev)
            best = None
            for bm, bn, warps in ((64, 64, 4), (64, 128, 4), (128, 64, 8), (128, 128, 8)):
                try:
                    tt = bench(lambda: tri(x, s, q, qt, am, bm, bn, warps))
                except Exception as exc:  # noqa: BLE001
                    print("triton", bm, bn, "failed:", str(exc).splitlines()[0] if str(exc) else exc, file=sys.stderr)
                    continue
                if best is None or tt < best[0]:
                    best = (tt, [bm, bn, warps])
            if best is not None:
                ref = both(x, s)
                diff = max(float((a.float() - b.float()).abs().max()) for a, b in ((q, ref[0]), (qt, ref[1])))
                t["triton_both_amax"], r["triton_tile"], r["triton_max_diff_vs_torch"] = best[0], best[1], diff
        r["seconds"] = t
        r["tb_per_s"] = {k: r["bytes_per_elem"][k] * e / v / 1e12 for k, v in t.items()}
        r["time_over_copy_bytes"] = {k: v / (t["copy"] * r["bytes_per_elem"][k] / 4) for k, v in t.items()}
        rows.append(r)
        print(m, n, " ".join(f"{k} {v:.2f} TB/s" for k, v in r["tb_per_s"].items()), flush=True)
    with open(os.path.join(out_dir, "fp8_cast_bandwidth.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
