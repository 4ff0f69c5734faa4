"""The MoE router's GEMMs in bf16 and with ``--moe-router-dtype fp32`` (docs/modeling.md,
"Router dtype"), timed on a GPU.

Megatron-Core's ``RouterGatingLinearFunction`` (``transformer/moe/moe_utils.py``) runs the
gating GEMM on the bf16 input and weight with an fp32 output, and in backward casts the
weight and the input to fp32 and runs both gradient GEMMs on fp32 operands, which cuBLAS
runs on TF32 tensor cores when allowed (TransformerEngine's GEMM does so for fp32 inputs).
The op IR prices such a GEMM at the bf16 efficiency of its shape against half the bf16 peak
(every NVIDIA datacenter part since Ampere has TF32 at half its dense BF16 rate), with
4-byte operands in its roofline floor. This times, for router shapes (tokens x hidden x
experts of DeepSeek-V3/V2, Qwen3-30B-A3B, Mixtral), the bf16 and the TF32 data- and
weight-gradient GEMMs (torch.mm, ``allow_tf32``), the fp32 GEMM without TF32 for reference,
and the forward's bf16 GEMM with an fp32 output. Prints and writes
``$OUT/router_gemm_dtype.json``.
"""

from __future__ import annotations

import json
import os

import torch

SHAPES = [  # (tokens, hidden, experts)
    (4096, 7168, 256), (16384, 7168, 256), (4096, 5120, 160), (16384, 5120, 160),
    (4096, 2048, 128), (16384, 2048, 128), (8192, 4096, 8), (8192, 4096, 64),
]


def bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100) * 1e-3  # seconds


def timed_mm(a: torch.Tensor, b: torch.Tensor, tf32: bool) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return bench(lambda: torch.mm(a, b))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def main() -> None:
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    dev = torch.device("cuda")
    rows = []
    for t, h, e in SHAPES:
        x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
        w = torch.randn(e, h, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(t, e, device=dev, dtype=torch.bfloat16)
        x32, w32, dy32 = x.float(), w.float(), dy.float()
        r = {"tokens": t, "hidden": h, "experts": e, "seconds": {
            # dgrad: dY [t, E] @ W [E, h]; wgrad: dY^T [E, t] @ X [t, h]
            "dgrad_bf16": timed_mm(dy, w, False), "dgrad_tf32": timed_mm(dy32, w32, True),
            "dgrad_fp32": timed_mm(dy32, w32, False),
            "wgrad_bf16": timed_mm(dy.t(), x, False), "wgrad_tf32": timed_mm(dy32.t(), x32, True),
            "wgrad_fp32": timed_mm(dy32.t(), x32, False),
            "fwd_bf16": bench(lambda: torch.mm(x, w.t())),
            "cast_input_fp32": bench(lambda: x.float()),
        }}
        try:  # bf16 operands, fp32 output (torch >= 2.9), as TE's gating GEMM writes the logits
            r["seconds"]["fwd_bf16_out_fp32"] = bench(lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
        except (TypeError, RuntimeError):
            pass
        s = r["seconds"]
        print(f"t={t:6d} h={h:5d} E={e:4d}  dgrad bf16 {s['dgrad_bf16']*1e6:7.1f} tf32 {s['dgrad_tf32']*1e6:7.1f} "
              f"fp32 {s['dgrad_fp32']*1e6:7.1f} us | wgrad bf16 {s['wgrad_bf16']*1e6:7.1f} tf32 {s['wgrad_tf32']*1e6:7.1f} "
              f"fp32 {s['wgrad_fp32']*1e6:7.1f} us | fwd {s['fwd_bf16']*1e6:6.1f} us | cast {s['cast_input_fp32']*1e6:6.1f} us")
        rows.append(r)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}
    with open(os.path.join(out_dir, "router_gemm_dtype.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
