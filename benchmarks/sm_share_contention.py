"""How much a GEMM slows beside a kernel that holds c SMs (docs/calibration.md, "Compute beside
a kernel holding SMs"): what ``simumax calibrate`` measures as ``accelerator.sm_contention``
(calibrate/sm_hold.py), printed per GEMM shape, SM count and side kernel against the SM share
c / SMs and the GEMM-on-the-SMs-left bound c / (SMs - c). Writes
``$OUT/sm_share_contention.json`` (the rows and the curve).
"""

from __future__ import annotations

import json
import os

import torch

from simumax.calibrate.sm_hold import contention_curve, measure_sm_contention


def main() -> None:
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    rows = measure_sm_contention(dev)
    for r in rows:
        m, k, n = r["gemm"]
        for b in r["beside"]:
            print(f"{m}x{k}x{n} {b['kind']:4s} c={b['ctas']:3d}: alone {r['alone_s']*1e3:.3f} ms beside "
                  f"{b['beside_s']*1e3:.3f} ms u={b['u']:+.3f} (c/SMs {b['share']:.3f}, c/(SMs-c) {b['sm_model']:.3f}) "
                  f"outlasted={b['side_outlasted']}")
    curve = contention_curve(rows)
    print("sm_contention:", curve)
    meta = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(dev).multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda}
    with open(os.path.join(out_dir, "sm_share_contention.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows, "curve": curve}, fh, indent=1)


if __name__ == "__main__":
    main()
