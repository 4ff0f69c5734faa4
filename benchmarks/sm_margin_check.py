"""GEMMs told to leave 16 SMs free (cuBLASLt's SM count target, what TransformerEngine's
userbuffers set with ``set_sm_margin``; torch reaches it for ``addmm`` through
``torch._C._set_sm_carveout_experimental``), alone and beside a persistent 16-CTA kernel,
against the same GEMM unannounced beside it (docs/calibration.md, "Compute beside a kernel
holding SMs"; cost/userbuffers.py charges SMs / (SMs - 16)). A "beside" reading counts only
where the side kernel outlasted the loop. Writes ``$OUT/sm_margin_addmm.json``.
"""

from __future__ import annotations

import json
import os
import time

import torch

from simumax.calibrate import sm_hold_kernels as kern
from simumax.calibrate.sm_hold import _timed

GEMMS = [(8192, 8192, 8192), (4096, 4096, 14336), (4096, 14336, 4096), (16384, 7168, 2048)]
MARGIN = 16


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    carve = torch._C._set_sm_carveout_experimental
    main_s, side_s = torch.cuda.Stream(), torch.cuda.Stream()
    sink = torch.empty(MARGIN * 1024, device=dev)
    kern.spin[(1,)](sink, 1000, BLOCK=1024, num_warps=kern.THREADS_WARPS)
    t_spin = _timed(lambda: kern.spin[(1,)](sink, 200_000, BLOCK=1024, num_warps=kern.THREADS_WARPS), side_s)
    rows = []
    for m, k, n in GEMMS:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16)  # addmm with a bias: the cuBLASLt path

        def loop(count: int) -> None:
            for _ in range(count):
                torch.addmm(bias, a, b)

        one = _timed(lambda: loop(3), main_s) / 3
        count = max(3, int(0.02 / one))
        iters = int(200_000 * 12 * count * one / t_spin)  # ~12x the loop: it must outlast it

        def run(carveout: int | None, beside: bool) -> tuple[float, bool]:
            carve(carveout)
            try:
                loop(2)
                torch.cuda.synchronize()
                time.sleep(0.3)
                if beside:
                    with torch.cuda.stream(side_s):
                        kern.spin[(MARGIN,)](sink, iters, BLOCK=1024, num_warps=kern.THREADS_WARPS)
                t = _timed(lambda: loop(count), main_s) / count
                outlasted = not side_s.query() if beside else True
                torch.cuda.synchronize()
                return t, outlasted
            finally:
                carve(None)

        r = {"alone": run(None, False), "carve": run(MARGIN, False), "carve_beside": run(MARGIN, True),
             "beside": run(None, True)}
        base = r["alone"][0]
        print(f"{m}x{k}x{n}: carveout {r['carve'][0] / base:.3f}x, carveout+beside {r['carve_beside'][0] / base:.3f}x "
              f"(outlasted {r['carve_beside'][1]}), beside {r['beside'][0] / base:.3f}x (outlasted {r['beside'][1]}); "
              f"SMs/(SMs-{MARGIN}) {sms / (sms - MARGIN):.3f}")
        rows.append({"gemm": [m, k, n], **{key: v[0] for key, v in r.items()},
                     "outlasted": [r["carve_beside"][1], r["beside"][1]]})
    with open(os.path.join(os.environ.get("OUT", "."), "sm_margin_addmm.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "sms": sms, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
