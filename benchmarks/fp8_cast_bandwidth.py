"""How fast an fp8 quantize runs against a plain copy (docs/calibration.md, "An fp8 step").

TransformerEngine casts every fp8 GEMM input and output gradient into both layouts (row-wise
and the transposed column-wise copy); the op IR costs that as memory traffic on the
device's memory-bound line (graph/fp8.py). TE itself cannot travel to the lent GPU, so this
times what can: on bf16 tensors of Llama shapes, a copy of the same bytes (the line's
reference), the row-wise cast alone, amax alone, both layouts from torch.compile, and the
package's TE-like kernel (calibrate/fp8_cast.py: tiled, both layouts, the amax fused, the
structure of TE's cast-transpose for delayed scaling; what calibrate and check-step --fp8
run). Effective bandwidth = bytes the
kernel must move / time. Prints and writes ``$OUT/fp8_cast_bandwidth.json``.
"""

from __future__ import annotations

import json
import os

import torch

from simumax.calibrate.fp8_cast import cast_transpose, triton_kernel

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


def main() -> None:
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    c_row, c_both, c_amax = (torch.compile(f, dynamic=False) for f in (rowwise, both, amax))
    tri = triton_kernel()
    rows = []
    for m, n in SHAPES:
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        s = torch.ones((), device=dev)
        y = torch.empty_like(x)
        e = m * n
        r = {"shape": [m, n], "bytes_per_elem": {"copy": 4, "rowwise": 3, "amax": 2, "both": 4, "te_like": 4}}
        t = {"copy": bench(lambda: y.copy_(x)), "rowwise": bench(lambda: c_row(x, s)),
             "amax": bench(lambda: c_amax(x)), "both": bench(lambda: c_both(x, s))}
        if tri is not None:  # the package's TE-like kernel (calibrate/fp8_cast.py), as calibrate times it
            t["te_like"] = bench(lambda: cast_transpose(x, E4M3, s))
            ref = both(x, s)
            got = cast_transpose(x, E4M3, s)
            r["te_like_max_diff_vs_torch"] = max(float((a.float() - b.float()).abs().max()) for a, b in zip(got[:2], ref))
            r["te_like_amax_diff"] = float((got[2] - x.abs().amax().float()).abs())
        r["seconds"] = t
        r["tb_per_s"] = {k: r["bytes_per_elem"][k] * e / v / 1e12 for k, v in t.items()}
        r["time_over_copy_bytes"] = {k: v / (t["copy"] * r["bytes_per_elem"][k] / 4) for k, v in t.items()}
        rows.append(r)
        print(m, n, " ".join(f"{k} {v:.2f} TB/s" for k, v in r["tb_per_s"].items()), flush=True)
    with open(os.path.join(out_dir, "fp8_cast_bandwidth.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
