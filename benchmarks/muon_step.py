"""One Muon step per weight, as megatron-core 0.19 runs it, timed on the GPU (session 36).

``TensorParallelMuon`` (megatron/core/optimizer/emerging_optimizers.py: nesterov on,
decoupled weight decay, ``fp32_matmul_prec="medium"``, quintic coefficients, spectral scale)
over emerging_optimizers' ``OrthogonalizedOptimizer.step``: per weight, the decoupled weight
decay of the fp32 master, the momentum ``lerp_``, the Nesterov ``lerp``, the Newton-Schulz
orthogonalisation (Frobenius normalise, then per step A = X Xᵀ, B = b A + c A A, X = a X + B X
on the short side), the scale, the update ``add_``, and the cast of the master to the bf16
parameter (Megatron's Float16OptimizerWithFloat16Params). Each weight shape is timed whole and
in parts (the Newton-Schulz GEMMs at the fp32 "medium" precision, at "highest" and in bf16;
the element-wise kernels), 20 repetitions after 3 warm-ups, CUDA events.

Prints one JSON object per shape; ``docs/calibration.md`` ("Muon's step") compares them
with ``dp/muon.py``'s kernels.
"""

from __future__ import annotations

import json
import sys

import torch

QUINTIC = (3.4445, -4.7750, 2.0315)
SHAPES = {
    # Llama3-8B per layer (QKV split): q, k / v, o, fused gate-up FC1, FC2
    "llama3_8b.q": (4096, 4096), "llama3_8b.kv": (1024, 4096), "llama3_8b.fc1": (28672, 4096),
    "llama3_8b.fc2": (4096, 14336),
    # Qwen3-30B-A3B expert (gate-up fused, down) and router; DeepSeek-V3 expert
    "qwen3_30b_a3b.expert_fc1": (1536, 2048), "qwen3_30b_a3b.expert_fc2": (2048, 768),
    "qwen3_30b_a3b.router": (128, 2048), "deepseek_v3.expert_fc1": (4096, 7168),
}


def timed(fn, reps: int = 20, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e-3


def newton_schulz(g: torch.Tensor, steps: int) -> torch.Tensor:
    x = g.mT if g.size(0) > g.size(1) else g
    x = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=1e-7)
    a, b, c = QUINTIC
    for _ in range(steps):
        s = x @ x.mT
        bb = torch.addmm(s, s, s, beta=b, alpha=c)
        x = torch.addmm(x, bb, x, beta=a, alpha=1.0)
    return x.mT if g.size(0) > g.size(1) else x


def muon_step(p32, p16, grad, buf, steps: int) -> None:
    p32.mul_(1 - 1e-4 * 0.01)  # decoupled weight decay
    buf.lerp_(grad, 1 - 0.95)  # momentum
    g = grad.lerp(buf, 0.95)  # nesterov
    orth = newton_schulz(g, steps)
    orth = (orth * max(1.0, p32.size(0) / p32.size(1)) ** 0.5) * 1.0  # spectral scale, then the extra factor
    p32.add_(orth, alpha=-1e-4)
    p16.copy_(p32)  # master -> bf16 parameter


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    dev = torch.device("cuda")
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": steps}))
    for name, (rows, cols) in SHAPES.items():
        p32 = torch.randn(rows, cols, device=dev) * 0.02
        p16 = p32.to(torch.bfloat16)
        grad, buf = torch.randn_like(p32) * 1e-3, torch.zeros_like(p32)
        out: dict[str, float | str | list[int]] = {"name": name, "shape": [rows, cols]}
        for prec in ("medium", "high", "highest"):
            torch.set_float32_matmul_precision(prec)
            out[f"step_{prec}"] = timed(lambda: muon_step(p32, p16, grad, buf, steps))
            out[f"ns_{prec}"] = timed(lambda: newton_schulz(grad, steps))
        torch.set_float32_matmul_precision("medium")
        g16 = grad.to(torch.bfloat16)
        out["ns_bf16"] = timed(lambda: newton_schulz(g16, steps))
        m, n = sorted((rows, cols))
        x = torch.randn(m, n, device=dev)
        s = torch.randn(m, m, device=dev)
        out["gemm_xxt_medium"] = timed(lambda: x @ x.mT)
        out["gemm_aa_medium"] = timed(lambda: torch.addmm(s, s, s, beta=0.5, alpha=0.5))
        out["gemm_bx_medium"] = timed(lambda: torch.addmm(x, s, x, beta=0.5, alpha=1.0))
        out["elementwise"] = timed(lambda: (p32.mul_(1.0), buf.lerp_(grad, 0.05), grad.lerp(buf, 0.95),
                                            torch.nn.functional.normalize(grad, p=2, dim=(-2, -1)),
                                            grad * 1.0, p32.add_(grad, alpha=-1e-9), p16.copy_(p32)))
        print(json.dumps(out), flush=True)
        del p32, p16, grad, buf, x, s, g16
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
