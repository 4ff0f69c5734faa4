"""How fast does a GEMM run when memory-bound kernels share the step with it?

A power-capped GPU (H100 SXM: 700 W) lowers its SM clock while tensor-core kernels draw
more than the cap; memory-bound kernels draw less, so how much a GEMM slows in a training
step depends on what runs around it. This prints what `simumax calibrate` measures as
`accelerator.power_curve` (calibrate/power.py: one bf16 GEMM alternated with r copies, r = 0
GEMMs back to back), with the SM clock and board power read through NVML at each mix.

    python3 benchmarks/gemm_duty_cycle.py --ratios 0,1,2,4,8 --seconds 12 --json out.json
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    import torch

    from simumax.calibrate.nvml import open_device, reading
    from simumax.calibrate.power import duty_cycle_rows

    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192, help="m = k = n of the bf16 GEMM")
    ap.add_argument("--copy-mb", type=float, default=512.0, help="bytes each memory-bound copy reads (and writes)")
    ap.add_argument("--ratios", default="0,1,2,4,8", help="copies per GEMM")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda", 0)
    nv, h = open_device()
    rows = duty_cycle_rows(dev, a.seconds, a.size, int(a.copy_mb * 2**20), tuple(int(v) for v in a.ratios.split(",")),
                           reading=lambda: reading(nv, h))
    for row in rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "size": a.size, "rows": rows}, f)


if __name__ == "__main__":
    main()
