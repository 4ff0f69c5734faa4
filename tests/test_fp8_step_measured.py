"""The fp8 step measured on the lent H100 (docs/calibration.md, "An fp8 step"; raw files in
docs/calibration/fp8_step_2026-11-27/) against the op IR's fp8 description: the in-step fp8
GEMMs and the cast kernels. Each test prints the measured error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simumax.calibrate.check_step import single_device_strategy
from simumax.config.loader import load_model, load_system
from simumax.estimate import Estimate
from simumax.graph import fp8
from simumax.graph.kernels import Gemm, MemBound

DATA = Path(__file__).resolve().parent.parent / "docs" / "calibration" / "fp8_step_2026-11-27" / "h100"
# cuBLASLt's fp8 kernels on Hopper (the profile's names): e4m3 x e4m3 with fast accumulation
# is TE's forward; the e5m2-gradient GEMMs with split accumulation its dgrad and wgrad
FPROP, BACKWARD = "nvjet_sm90_qqtst", "nvjet_sm90_qrtst"


def _step(name: str, folder: str = "h100") -> dict:
    return json.loads((DATA.parent / folder / name).read_text())


def _kernel_seconds(row: dict, fragment: str) -> float:
    return sum(k["seconds"] for k in row["measurement"]["kernels"]
               if fragment in k["name"] and not k["name"].startswith("shape:"))


@pytest.mark.parametrize(("model", "folder"), [("llama2-7b", "h100"), ("llama3-8b", "h100_llama3")])
@pytest.mark.parametrize("preset", ["nvidia_h100_80gb_hbm3", "h100-sxm-80gb"])
def test_fp8_gemms_in_a_real_step_are_the_ir_fp8_gemms(model: str, folder: str, preset: str) -> None:
    """Llama2-7B and Llama3-8B shapes, 4 layers, seq 4096, 2 micro-batches, delayed scaling:
    the fp8 GEMMs of one profiled step against the IR's, forward (fast accumulation) and
    data/weight-gradient (split accumulation) apart. The GPU ran at 90-96 % of its full clock
    there, so the real time lies between the prediction at full clock and at the power
    curve's rate: each within 10 % of one of the two, and the measured preset (each shape's
    bf16 efficiency at the fp8 peak) fast at full clock, the derived one (the 8192^3 fp8
    asymptote) slow with the curve."""
    row = _step(f"fp8_step_{model.split('-')[0]}_delayed.json", folder)
    m = load_model(model).with_updates({"layer_num": 4}, source="test")
    est = Estimate(m, single_device_strategy(4096, 1, 2, wgrad_fused=False, fp8_recipe="delayed"), load_system(preset))
    rate = est.cost().stages[0].tensor_core_rate
    full = {"TN": 0.0, "back": 0.0}
    for k in (k for c in est.chunks for k in c.kernels()):
        if isinstance(k, Gemm) and k.family == "fp8_matmul":
            full["TN" if k.layout == "TN" else "back"] += est.compute_model.compute(k)[0] * 2
    real = {"TN": _kernel_seconds(row, FPROP), "back": _kernel_seconds(row, BACKWARD)}
    for part in full:
        at_full, curved = full[part] / real[part] - 1, full[part] / rate / real[part] - 1
        print(f"{model} {preset} fp8 {part}: real {real[part] * 1e3:.2f} ms, predicted {at_full:+.1%} at full clock, "
              f"{curved:+.1%} at the curve's rate {rate:.3f}")
        assert min(abs(at_full), abs(curved)) < 0.10, part
        assert (at_full < 0 if preset == "nvidia_h100_80gb_hbm3" else curved > 0), part


@pytest.mark.parametrize("preset", ["h100-sxm-80gb", "nvidia_h100_80gb_hbm3"])
def test_fp8_casts_against_the_measured_cast_transpose(preset: str) -> None:
    """The IR's cast of a bf16 tensor into both fp8 layouts (4 B per element on the
    memory-bound line) against the TE-like tiled kernel timed on the H100 at six Llama shapes.
    The derived preset's line (0.71 of the datasheet) is within 15 % of every shape (9-12 %
    slow on the large ones); the measured preset's line (its bf16 add, 0.94) 15-17 % fast
    there, 34 % on the 4096 x 4096 one, whose 39 us hold the launch and allocation: casts
    are ~5 % of an fp8 step, so under 1 % of it (docs/calibration.md, "An fp8 step")."""
    bench = json.loads((DATA / "fp8_cast_bandwidth.json").read_text())
    cm = Estimate(load_model("llama2-7b"), single_device_strategy(4096, 1, 1), load_system(preset)).compute_model
    errs = []
    for r in bench["rows"]:
        m, n = r["shape"]
        pred = cm.membound(MemBound("cast", fp8.quantize_bytes(fp8.recipe("delayed"), m * n, 2)))
        errs.append(pred / r["seconds"]["te_like"] - 1)
        print(f"{preset} {m}x{n}: measured {r['seconds']['te_like'] * 1e6:.1f} us, predicted {pred * 1e6:.1f} us ({errs[-1]:+.1%})")
    if preset == "h100-sxm-80gb":
        assert all(abs(e) < 0.15 for e in errs)
    else:
        assert all(-0.35 < e < 0.0 for e in errs)
