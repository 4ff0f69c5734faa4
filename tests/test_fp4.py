"""NVFP4 (issue 22 part 4): the recipe's quantize bytes, scales and weight copies by hand,
FP4 GEMM families against the FP4 peak, and the refusals Megatron / the hardware impose."""

from __future__ import annotations

import pytest

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.export.megatron_flags import megatron_flags
from simumax.graph import fp8
from simumax.graph.kernels import Gemm, GroupGemm, MemBound
from simumax.importers.megatron_args import parse_megatron_args
from tests.conftest import run_cli

BASE = {"seq_len": 4096, "world_size": 8, "tp_size": 8, "enable_sequence_parallel": True, "micro_batch_num": 4}


def _est(model: str = "llama3-70b", system: str = "b200-sxm-180gb", **st) -> Estimate:
    return Estimate(load_model(model).with_updates({"layer_num": 2}), load_strategy({**BASE, **st}), load_system(system))


def test_nvfp4_bytes_by_hand() -> None:
    """E2M1 is half a byte; an E4M3 scale per 16 activation elements, per 16 x 16 weight
    block. A cast reads bf16 (2 B) and writes both layouts with their scales."""
    r = fp8.recipe("nvfp4")
    assert fp8.quantize_bytes(r, 1000, 2) == pytest.approx(1000 * (2 + 2 * (0.5 + 1 / 16)))
    assert fp8.weight_copy_bytes_per_param(r) == pytest.approx(2 * (0.5 + 1 / 256))
    assert fp8.saved_input_bytes(r, 1000) == pytest.approx(1000 * (0.5 + 1 / 16))


def test_fp4_linears_use_the_fp4_families() -> None:
    est = _est(fp4=True)
    kernels = [k for s in est.chunks for o in s.ops for ph in ("fwd", "bwd_input", "bwd_weight") for k in o.kernels(ph)]
    fams = {k.family for k in kernels if isinstance(k, (Gemm, GroupGemm))}
    assert fams == {"fp4_matmul", "matmul"}  # the LM head stays bf16
    assert any(isinstance(k, MemBound) and k.name.endswith("quantize_input") for k in kernels)
    bf16, f8, f4 = _est(), _est(fp8=True, fp8_recipe="mxfp8"), _est(fp4=True)
    assert f4.cost().duration_time_per_iter < f8.cost().duration_time_per_iter < bf16.cost().duration_time_per_iter
    # weight copies: fp4 keeps 2 x (0.5 + 1/256) B per TE-linear parameter, mxfp8 2 x (1 + 1/32)
    assert f4.memory().stages[0].te_buffers < f8.memory().stages[0].te_buffers
    moe = _est("mixtral-8x7b", fp4=True, tp_size=1, ep_size=8, enable_sequence_parallel=False)
    assert any(isinstance(k, GroupGemm) and k.family == "fp4_group_matmul" for s in moe.chunks for o in s.ops for k in o.fwd)


def test_fp4_refusals_and_flags() -> None:
    with pytest.raises(ConfigError, match=r"fp4.*no FP4 peak \(accelerator.op.fp4_matmul\); turn fp4 off$"):
        _est(system="h100-sxm-80gb", fp4=True).stages  # Hopper: no FP4 units
    # a Blackwell file without an FP4 rate: the device has the units, the file lacks the field
    with pytest.raises(ConfigError, match=r"the device \(B200, blackwell\) has FP4 units .* add accelerator.op.fp4_matmul"):
        _est(system="b200_bf16_ceperm", fp4=True).stages
    with pytest.raises(ConfigError, match="cannot be combined with fp8"):
        load_strategy({**BASE, "fp4": True, "fp8": True})
    with pytest.raises(ConfigError, match="mxfp8 needs Blackwell"):
        _est(system="h100-sxm-80gb", fp8=True, fp8_recipe="mxfp8").stages
    st = load_strategy({**BASE, "fp4": True})
    flags = " ".join(megatron_flags(st))
    assert "--fp4-format e2m1" in flags and "--fp4-recipe nvfp4" in flags
    model = ("--num-layers 2 --hidden-size 8192 --num-attention-heads 64 --ffn-hidden-size 28672 --vocab-size 128256 "
             "--seq-length 4096 --micro-batch-size 1 ")
    assert parse_megatron_args(model + flags)[1].fp4


def test_first_and_last_layers_in_bf16() -> None:
    """Megatron's --first-last-layers-bf16: under fp8 / fp4 the first and last layers keep
    BF16 GEMMs: no casts, no fp8 weight copies there, slower than all-fp8, faster than none."""
    m = load_model("llama3-70b").with_updates({"layer_num": 6})
    st = {**BASE, "fp8": True, "fp8_recipe": "mxfp8", "micro_batch_num": 4}
    sy = load_system("b200-sxm-180gb")
    mixed = Estimate(m, load_strategy({**st, "first_last_layers_bf16": True, "num_layers_at_end_in_bf16": 2}), sy)
    fams = {L: {k.family for o in mixed.stages[0].ops if o.layer == L for k in o.fwd if isinstance(k, Gemm)} for L in range(6)}
    assert fams == {0: {"matmul"}, 1: {"fp8_matmul"}, 2: {"fp8_matmul"}, 3: {"fp8_matmul"}, 4: {"matmul"}, 5: {"matmul"}}
    full, bf16 = Estimate(m, load_strategy(st), sy), Estimate(m, load_strategy({**BASE, "micro_batch_num": 4}), sy)
    t = lambda e: e.cost().duration_time_per_iter  # noqa: E731
    assert t(full) < t(mixed) < t(bf16)
    assert mixed.memory().stages[0].te_buffers < full.memory().stages[0].te_buffers
    flags = " ".join(megatron_flags(mixed.strategy))
    assert "--first-last-layers-bf16" in flags and "--num-layers-at-end-in-bf16 2" in flags


def test_naming_the_fp4_recipe_turns_fp4_on() -> None:
    """`--set fp4_recipe=nvfp4` alone (as one says "with fp4_recipe=nvfp4") runs FP4."""
    out = run_cli("perf", "-m", "llama3-70b", "-s", "tp8_pp1_dp1_mbs1", "-y", "b200-sxm-180gb", "--set", "layer_num=2",
                  "--set", "fp4_recipe=nvfp4", "--json")
    assert out.returncode == 0, out.stderr
    on = load_strategy({**BASE, "fp4_recipe": "nvfp4"})
    assert on.fp4_on and on.lp_recipe == "nvfp4" and not load_strategy(BASE).fp4_on
    bad = run_cli("perf", "-m", "llama3-70b", "-s", "tp8_pp1_dp1_mbs1", "-y", "h100-sxm-80gb", "--set", "fp4_recipe=nvfp4")
    assert bad.returncode == 2 and "fp4" in bad.stderr


def test_naming_an_fp8_recipe_turns_fp8_on() -> None:
    """`--set fp8_recipe=mxfp8`: FP8 with MXFP8 on Blackwell, exit 2 on H100 (no MXFP8)."""
    args = ["perf", "-m", "llama3-70b", "-s", "tp8_pp1_dp1_mbs1", "--set", "layer_num=2", "--set", "fp8_recipe=mxfp8"]
    assert run_cli(*args, "-y", "b200-sxm-180gb").returncode == 0
    bad = run_cli(*args, "-y", "h100-sxm-80gb")
    assert bad.returncode == 2 and "mxfp8 needs Blackwell" in bad.stderr
    assert load_strategy({**BASE, "fp8_recipe": "blockwise"}).fp8_on and not load_strategy(BASE).fp8_on
