"""GEMMs told to leave 16 SMs free (cuBLASLt's SM count target, what TransformerEngine's
userbuffers set with ``set_sm_margin``; torch reaches it for ``addmm`` through
``torch._C._set_sm_carveout_experimental``), alone and beside a persistent 16-CTA kernel,
against the same GEMM unannounced beside it (docs/calibration.md, "Compute beside a kernel
holding SMs"; cost/userbuffers.py charges SMs / (SMs - 16)). Rows count only where the side
kernel outlasted the loop. Writes ``$OUT/sm_margin_addmm.json``.
"""

import json
import os
import time

import torch
from simumax.calibrate import sm_hold_kernels as kern
from simumax.calibrate.sm_hold import _timed
dev = torch.device("cuda"); sms = torch.cuda.get_device_properties(dev).multi_processor_count
carve = torch._C._set_sm_carveout_experimental
main_s, side_s = torch.cuda.Stream(), torch.cuda.Stream()
sink = torch.empty(16 * 1024, device=dev)
kern.spin[(1,)](sink, 1000, BLOCK=1024, num_warps=32)
t_spin = _timed(lambda: kern.spin[(1,)](sink, 200_000, BLOCK=1024, num_warps=32), side_s)
rows = []
for m, k, n in [(8192, 8192, 8192), (4096, 4096, 14336), (4096, 14336, 4096), (16384, 7168, 2048)]:
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16); b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
    f = lambda: torch.addmm(bias, a, b)
    def loop(c):
        for _ in range(c): f()
    one = _timed(lambda: loop(3), main_s) / 3; count = max(3, int(0.02 / one))
    iters = int(200_000 * 12 * count * one / t_spin)  # ~12x the loop: it must outlast it
    def run(cv, beside):
        carve(cv)
        try:
            loop(2); torch.cuda.synchronize(); time.sleep(0.3)
            if beside:
                with torch.cuda.stream(side_s):
                    kern.spin[(16,)](sink, iters, BLOCK=1024, num_warps=32)
            t = _timed(lambda: loop(count), main_s) / count
            out = not side_s.query() if beside else True
            torch.cuda.synchronize()
            return t, out
        finally:
            carve(None)
    r = {k2: run(*v) for k2, v in {"alone": (None, False), "carve": (16, False), "carve_beside": (16, True), "beside": (None, True)}.items()}
    base = r["alone"][0]
    print(f"{m}x{k}x{n}: carveout {r['carve'][0]/base:.3f}x, carveout+beside {r['carve_beside'][0]/base:.3f}x (outlasted {r['carve_beside'][1]}), beside {r['beside'][0]/base:.3f}x (outlasted {r['beside'][1]}); SMs/(SMs-16) {sms/(sms-16):.3f}")
    rows.append({"gemm": [m, k, n], **{k2: v[0] for k2, v in r.items()}, "outlasted": [r['carve_beside'][1], r['beside'][1]]})
json.dump({"device": torch.cuda.get_device_name(), "sms": sms, "rows": rows}, open(os.path.join(os.environ.get("OUT", "."), "sm_margin_addmm.json"), "w"), indent=1)
