"""Mechanisms behind predictions outside the validation files (issue 19), each checked
against a hand derivation: the attention-backward FLOP convention of efficiency tables,
and the validation reader's memory conventions."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from simumax.calibrate.system_writer import merge_compute
from simumax.config.loader import load_system
from simumax.config.system import SystemConfig
from simumax.cost.efficiency import ComputeModel
from simumax.graph.kernels import Attention


def _attn(phase: str) -> Attention:
    return Attention(phase, batch=1, seq_len=4096, head_num=64, kv_head_num=8, qk_head_dim=128, v_head_dim=128)


# ---- attention backward FLOP convention --------------------------------------------------
def test_simumax_tables_count_attention_backward_as_two_and_a_half_forwards() -> None:
    """SimuMax's measuring script counts bwd = 5 x base against fwd = 2 x base: a measured
    sdp_bwd efficiency e means time = 2.5 x forward table FLOPs / (peak x e)."""
    y = load_system("a100_pcie")  # a SimuMax file: no bwd_flops_ratio, so 2.5
    spec = y.accelerator.op["sdp_bwd"]
    assert spec.bwd_flops_ratio is None and spec.sdp_bwd_ratio == 2.5
    key, eff = next(iter(spec.accurate_efficient_factor.items()))
    fields = dict(p.split("=") for p in key.split(", "))
    k = Attention("bwd", batch=int(fields["batch"]), seq_len=int(fields["seq_len"]), head_num=int(fields["head_num"]),
                  kv_head_num=int(fields["kv_head_num"]), qk_head_dim=int(fields["qk_head_dim"]),
                  v_head_dim=int(fields["v_head_dim"]), qkv_contiguous=fields["qkv_contiguous"] == "True")
    assert k.key == key
    s, h = k.seq_len, k.head_num
    fwd_flops = 2.0 * k.batch * h * s * s * (k.qk_head_dim + k.v_head_dim)  # QK^T and PV, whole score matrix
    t, _ = ComputeModel(y).compute(k)
    assert t == pytest.approx(2.5 * fwd_flops / (spec.tflops * 1e12 * eff), rel=1e-12)


def test_a_table_in_the_model_convention_says_so() -> None:
    data = load_system("a100_pcie").to_dict()
    data["accelerator"]["op"]["sdp_bwd"]["bwd_flops_ratio"] = 2.0
    y2 = SystemConfig.init_from_dict(data)
    k = _attn("bwd")
    t25, _ = ComputeModel(load_system("a100_pcie")).compute(k)
    t20, _ = ComputeModel(y2).compute(k)
    assert t20 == pytest.approx(t25 * 2.0 / 2.5, rel=1e-12)
    # forward attention does not depend on the convention
    assert ComputeModel(y2).compute(_attn("fwd"))[0] == ComputeModel(load_system("a100_pcie")).compute(_attn("fwd"))[0]


def test_field_absent_from_dumps_of_simumax_files() -> None:
    assert "bwd_flops_ratio" not in json.dumps(load_system("a100_pcie").to_dict())
    assert load_system("nvidia_h100_80gb_hbm3").accelerator.op["sdp_bwd"].sdp_bwd_ratio == 2.0  # calibrate's


def test_calibration_writes_in_the_familys_convention() -> None:
    """calibrate times the kernel and counts 2 x forward; merged into a SimuMax file (2.5) the
    entry is scaled so the estimate reproduces the measured time."""
    k = _attn("bwd")
    seconds = 0.0123
    cal = SimpleNamespace(timings=[SimpleNamespace(family="sdp_bwd", key=k.key, flops=k.table_flops(2.0), seconds=seconds)],
                          bandwidth={}, peak_tflops=312.0, hbm_gbps=1600.0)
    for base in ("a100_pcie", "nvidia_h100_80gb_hbm3"):
        merged = SystemConfig.init_from_dict(merge_compute(load_system(base).to_dict(), cal))
        assert ComputeModel(merged).compute(k)[0] == pytest.approx(seconds, rel=1e-5)
