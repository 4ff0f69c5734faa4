"""TransformerEngine's fp8 linear in plain torch, for ``check-step --fp8`` (issues 19, 20).

TE itself cannot travel to the lent GPU machines (its wheels are several times the 64 MiB a
call may carry), so this rebuilds what a TE ``Linear`` does per GEMM in fp8, with the same
kernels in the same places, to time a real fp8 step against the op IR's fp8 description
(``graph/fp8.py``):

* forward: the input cast to E4M3 in both layouts (row-wise for the forward GEMM, the
  transposed copy kept for the weight gradient), the fp8 GEMM with cuBLASLt's fast
  accumulation, bf16 out;
* backward: the output gradient cast to E5M2 in both layouts (Megatron's ``--fp8-format
  hybrid``), the data-gradient GEMM against the weight's transposed fp8 copy and the
  weight-gradient GEMM, both with split accumulation (TE ``module/base.py``:
  ``_2X_ACC_FPROP = False``, ``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``);
* weights cast to fp8 (both layouts) on the first micro-batch of a step and kept for the
  others (TE's ``is_first_microbatch``, which Megatron-Core sets per step);
* scaling per recipe: ``tensorwise`` (Float8CurrentScaling) reads the tensor's amax in a pass
  of its own before the cast; ``delayed`` (DelayedScaling) casts with the scale from the
  previous amax and computes the new one on the way.

On a GPU every cast is one tiled Triton kernel writing both layouts with the amax fused
(``fp8_cast``, TE's cast-transpose), current scaling's amax pass a compiled reduction; torch
elsewhere. What differs from TE, and the prediction is told
(``single_device_strategy(fp8_recipe=...)``): ``torch._scaled_mm`` cannot accumulate into the
fp32 main gradient, so the weight gradient is written in bf16 and added, as Megatron without
gradient-accumulation fusion; the norm writes bf16 and a separate kernel quantizes it, where
TE's LayerNormLinear can write fp8 from the norm.
"""

from __future__ import annotations

from typing import Callable

import torch

from simumax.calibrate.fp8_cast import FP8_MAX, amax, cast_transpose

FP8_RECIPES = ("delayed", "tensorwise")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


class Fp8Quantizer:
    """Per-tensor scaling state and the quantize kernels: on a GPU TE's (``fp8_cast``: one
    tiled cast-transpose, the amax fused; current scaling's amax pass compiled), torch
    elsewhere."""

    def __init__(self, recipe: str, fused: bool) -> None:
        if recipe not in FP8_RECIPES:
            raise ValueError(f"fp8 recipe {recipe!r}: check-step runs {', '.join(FP8_RECIPES)}")
        self.recipe = recipe
        self._amax_fn: Callable = amax
        if fused and recipe == "tensorwise":
            # one specialisation per tensor shape: a Llama layer has ~8
            import torch._dynamo

            cfg = torch._dynamo.config
            name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, name, max(getattr(cfg, name), 64))
            self._amax_fn = torch.compile(amax, dynamic=False)
        self._amax: dict[tuple[int, str], torch.Tensor] = {}  # delayed scaling: last amax per tensor

    def __call__(self, key: tuple[int, str], x: torch.Tensor, dtype: torch.dtype):
        """(fp8 data, transposed fp8 copy, scale_inv) of a 2-D bf16 tensor."""
        fmax = FP8_MAX[dtype]
        x = x.contiguous()
        if self.recipe == "tensorwise":  # current scaling: the amax in a pass of its own first
            scale = fmax / torch.clamp(self._amax_fn(x), min=1e-12)
            q, qt, _ = cast_transpose(x, dtype, scale)
        else:  # delayed: the last amax's scale (1 before any, as TE starts), the new amax on the way
            prev = self._amax.get(key)
            scale = torch.ones((), device=x.device) if prev is None else fmax / torch.clamp(prev, min=1e-12)
            q, qt, self._amax[key] = cast_transpose(x, dtype, scale)
        return q, qt, 1.0 / scale


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, lin: "Fp8Linear") -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xq, xqt, x_inv = lin.quantizer((id(lin), "input"), x2, E4M3)
        wq, wqt, w_inv = lin.weight_fp8()
        y = torch._scaled_mm(xq, wq.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=x.dtype, use_fast_accum=True)
        ctx.save_for_backward(xqt, x_inv, wqt, w_inv)
        ctx.lin = lin
        return y.view(*x.shape[:-1], wq.shape[0])

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xqt, x_inv, wqt, w_inv = ctx.saved_tensors
        lin = ctx.lin
        dy2 = dy.reshape(-1, dy.shape[-1])
        gq, gqt, g_inv = lin.quantizer((id(lin), "grad"), dy2, E5M2)
        dx = torch._scaled_mm(gq, wqt.t(), scale_a=g_inv, scale_b=w_inv, out_dtype=dy.dtype, use_fast_accum=False)
        dw = torch._scaled_mm(gqt, xqt.t(), scale_a=g_inv, scale_b=x_inv, out_dtype=dy.dtype, use_fast_accum=False)
        lin.weight.main_grad.add_(dw)  # no in-GEMM accumulation into fp32 in torch (module docstring)
        return dx.view(*dy.shape[:-1], xqt.shape[0]), None


class Fp8Linear(torch.nn.Module):
    """y = x W^T with TE's fp8 kernels (module docstring). The weight's fp8 copies are made on
    the first forward after ``new_step()`` and kept until the next."""

    def __init__(self, linear: torch.nn.Linear, quantizer: Fp8Quantizer) -> None:
        super().__init__()
        self.weight, self.bias, self.quantizer = linear.weight, linear.bias, quantizer
        self._cached: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def new_step(self) -> None:
        self._cached = None

    def weight_fp8(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._cached is None:
            with torch.no_grad():
                self._cached = self.quantizer((id(self), "weight"), self.weight.detach(), E4M3)
        return self._cached

    @torch.compiler.disable  # its state (cached weights, delayed amaxes) stays out of a compiled layer
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Fp8LinearFn.apply(x, self)
        return y + self.bias if self.bias is not None else y
