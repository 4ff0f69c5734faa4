"""FP8 as each TransformerEngine recipe runs it: the quantize kernels in front of every FP8
GEMM, the weight casts, the scales kept beside the FP8 data, and the amax reductions.

Recipes (Megatron ``--fp8-recipe``, TE ``transformer_engine.common.recipe``):

* ``delayed`` (DelayedScaling): each tensor is cast with the scale from the amax history
  of earlier steps; the cast kernel computes the new amax on the way (TE's fused
  cast-transpose). At the end of every forward and backward of an ``fp8_autocast`` region
  (a Megatron TransformerBlock, so one model chunk) TE all-reduces the amaxes over the
  amax-reduction group (data x tensor x context parallel) and updates the scales.
* ``tensorwise`` (Float8CurrentScaling): the scale comes from the tensor itself, so its
  amax is read in a pass of its own before the cast; a sequence-parallel input gathered
  over TP all-reduces its amax over TP first.
* ``blockwise`` (Float8BlockScaling, DeepSeek-V3 style, Hopper and later): one fp32 scale
  per 1 x 128 tile of activations and gradients (per 128 x 128 block of weights), computed
  in the cast itself.
* ``mxfp8`` (MXFP8BlockScaling, Blackwell): one E8M0 byte scale per 32 elements, computed
  in the cast itself.

* ``nvfp4`` (NVFP4BlockScaling, Blackwell; Megatron ``--fp4-recipe nvfp4``): E2M1 values
  (half a byte) with an E4M3 scale per 16 elements of activations and gradients and per
  16 x 16 block of weights (plus one fp32 scale per tensor); GEMMs in the ``fp4_*``
  families. The random Hadamard transform TE applies to weight-gradient operands is fused
  into their cast.

Every cast reads the bf16 tensor and writes the low-precision copy in both layouts
(row-wise for the forward or data-gradient GEMM, column-wise for the weight-gradient GEMM),
plus its scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from simumax.graph.kernels import MemBound, op_label

if TYPE_CHECKING:
    from simumax.graph.ops import Op

Fp8RecipeName = Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]


@dataclass(frozen=True, slots=True)
class Fp8Recipe:
    name: str
    amax_pass: bool  # current scaling: an extra read of the tensor for its amax before the cast
    act_scale_bytes: float  # scale bytes per element of an activation / gradient, one layout
    weight_scale_bytes: float  # scale bytes per weight element, one layout
    history_amax: bool  # delayed scaling: amax all-reduce + scale update per fp8_autocast region
    elem_bytes: float = 1.0  # bytes of one quantized element
    family: str = "fp8"  # GEMM families fp8_matmul / fp4_matmul (and *_group_matmul)


RECIPES: dict[str, Fp8Recipe] = {
    "delayed": Fp8Recipe("delayed", False, 0.0, 0.0, True),
    "tensorwise": Fp8Recipe("tensorwise", True, 0.0, 0.0, False),
    "blockwise": Fp8Recipe("blockwise", False, 4.0 / 128, 4.0 / (128 * 128), False),
    "mxfp8": Fp8Recipe("mxfp8", False, 1.0 / 32, 1.0 / 32, False),
    "nvfp4": Fp8Recipe("nvfp4", False, 1.0 / 16, 1.0 / 256, False, elem_bytes=0.5, family="fp4"),
}


def recipe(name: str) -> Fp8Recipe:
    return RECIPES[name]


def quantize_bytes(r: Fp8Recipe, elems: float, in_bytes: int, layouts: int = 2) -> float:
    """HBM traffic of casting ``elems`` bf16 elements to FP8 in both layouts (one: row-wise
    only, when the weight gradient runs in BF16): read them (twice with current scaling's
    amax pass), write 1 B and the scales per layout."""
    reads = in_bytes * (2 if r.amax_pass else 1)
    return elems * (reads + layouts * (r.elem_bytes + r.act_scale_bytes))


def weight_cast_bytes(r: Fp8Recipe, params: float, in_bytes: int) -> float:
    """Casting the bf16 weights to their FP8 copies (both layouts)."""
    reads = in_bytes * (2 if r.amax_pass else 1)
    return params * (reads + 2 * (r.elem_bytes + r.weight_scale_bytes))


def saved_input_bytes(r: Fp8Recipe, elems: float) -> float:
    """What a linear keeps of its input for the weight gradient: the column-wise FP8 copy
    and its scales."""
    return elems * (r.elem_bytes + r.act_scale_bytes)


def weight_copy_bytes_per_param(r: Fp8Recipe) -> float:
    """TE's FP8 weight copies kept between micro-batches: both layouts and their scales."""
    return 2 * (r.elem_bytes + r.weight_scale_bytes)


AMAX_BYTES_PER_TENSOR = 4.0  # one fp32 amax per FP8 tensor (input, weight, output gradient)


def low_precision_linear(op: "Op") -> bool:
    """Whether an op is a TE linear running fp8 / fp4 GEMMs (not one kept in BF16)."""
    return bool(op.weight_shapes) and any(
        getattr(k, "family", "").startswith(("fp8_", "fp4_")) for k in op.fwd if not isinstance(k, MemBound)
    )


def linear_casts(r: Fp8Recipe, name: str, in_elems: float, grad_elems: float, weight_params: float, in_bytes: int,
                 weight_caching: bool, wgrad_fp8: bool = True) -> tuple[list[MemBound], list[MemBound]]:
    """(forward, backward) quantize kernels of one fp8 linear (dense or grouped): its input
    in forward (and its weights too when they are not cached across micro-batches), its
    output gradient in backward. Without an fp8 weight gradient (TE override_linear_precision
    .wgrad) the input and the gradient are cast row-wise only: their column-wise copies feed
    only that GEMM; the weights keep both layouts (the column-wise one feeds the data gradient)."""
    layouts = 2 if wgrad_fp8 else 1
    fwd = [MemBound(f"{op_label(name)}.quantize_input", quantize_bytes(r, in_elems, in_bytes, layouts))]
    if not weight_caching:
        fwd.append(MemBound(f"{op_label(name)}.cast_weight", weight_cast_bytes(r, weight_params, in_bytes)))
    return fwd, [MemBound(f"{op_label(name)}.quantize_grad", quantize_bytes(r, grad_elems, in_bytes, layouts))]
