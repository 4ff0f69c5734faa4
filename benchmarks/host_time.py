"""Host time against GPU time of a Muon step per weight, and the host's round trip of the
dropless dispatcher's wait (session 36; follows benchmarks/muon_step.py and moe_host_sync.py).

For each weight shape, ``muon_step.muon_step`` is timed three ways: ``host_s``, the host's
time to issue one step while the GPU is kept busy by GEMMs queued before it (the host never
waits); ``gpu_s``, one step replayed from a CUDA graph (no host in the loop); ``eager_s``,
steps back to back as the optimizer runs them (CUDA events). ``kernels``: the CUDA kernels
of one step (profiler). ``wait_roundtrip_s``: the dispatcher's copy-and-wait
(``moe_host_sync.Waiter``) on an idle GPU, host wall time. Prints JSON lines
(docs/calibration.md, "Muon's step").
"""

from __future__ import annotations

import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from moe_host_sync import Waiter
from muon_step import muon_step, timed

SHAPES = {"router_128x2048": (128, 2048), "expert_2048x768": (2048, 768), "expert_1536x2048": (1536, 2048),
          "kv_1024x4096": (1024, 4096), "q_4096x4096": (4096, 4096)}
REPS = 10


def main() -> None:
    dev = torch.device("cuda")
    torch.set_float32_matmul_precision("medium")
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
    big = torch.randn(16384, 16384, device=dev, dtype=torch.bfloat16)
    for name, (rows, cols) in SHAPES.items():
        p32 = torch.randn(rows, cols, device=dev) * 0.02
        p16 = p32.to(torch.bfloat16)
        grad, buf = torch.randn_like(p32) * 1e-3, torch.zeros_like(p32)

        def step() -> None:
            muon_step(p32, p16, grad, buf, 5)
        eager = timed(step)
        for _ in range(12):  # ~12 x 9 ms of GPU work ahead of the host
            big @ big
        t0 = time.perf_counter()
        for _ in range(REPS):
            step()
        host = (time.perf_counter() - t0) / REPS
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        gpu = timed(g.replay)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        print(json.dumps({"name": name, "shape": [rows, cols], "eager_s": eager, "host_s": host, "gpu_s": gpu,
                          "kernels": kernels}), flush=True)
        del g, p32, p16, grad, buf
        torch.cuda.empty_cache()
    w, cnt = Waiter(1), torch.ones(1, dtype=torch.long, device=dev)
    torch.cuda.synchronize()
    w(cnt)
    t0 = time.perf_counter()
    for _ in range(100):
        w(cnt)
    print(json.dumps({"name": "wait_roundtrip", "wait_roundtrip_s": (time.perf_counter() - t0) / 100}))
    small = torch.ones(1024, device=dev)
    for _ in range(12):
        big @ big
    t0 = time.perf_counter()
    for _ in range(200):
        small.add_(1.0)
    print(json.dumps({"name": "add_issue", "host_s_per_op": (time.perf_counter() - t0) / 200}))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
