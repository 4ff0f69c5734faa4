"""Power-limited clocks (cost/power.py): the curve, its fixed point, and what it does to a
chunk's times (docs/calibration.md, "Power-limited clocks")."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.cost.power import curve_rate, throttle_rate, throttled
from simumax.cost.stage_time import PhaseTime, StageTime
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.graph.ops import PHASES

H100_CURVE = load_system("nvidia_h100_80gb_hbm3").accelerator.power_curve


def _without_curve(system):
    return system.with_updates({"accelerator": {**system.accelerator.model_dump(), "power_curve": None}})


def test_curve_interpolates_from_full_rate_and_is_flat_past_the_last_point() -> None:
    pts = [[0.5, 0.9], [1.0, 0.8]]
    assert curve_rate(pts, 0.0) == 1.0
    assert curve_rate(pts, 0.25) == pytest.approx(0.95)  # halfway from (0, 1) to (0.5, 0.9)
    assert curve_rate(pts, 0.75) == pytest.approx(0.85)
    assert curve_rate([[0.6, 0.9]], 0.9) == 0.9
    # a measured point above its neighbour to the left is noise, not a faster clock
    assert curve_rate([[0.5, 0.9], [1.0, 0.95]], 1.0) == 0.9


def test_fixed_point_by_hand() -> None:
    # all tensor-core work: the back-to-back rate
    assert throttle_rate([[1.0, 0.87]], 1.0, 0.0) == pytest.approx(0.87)
    # r = 1 - 0.13 s with s = (1/r) / (1/r + 1) = 1 / (1 + r): r (1 + r) = 1 + r - 0.13, so r^2 = 0.87
    assert throttle_rate([[1.0, 0.87]], 1.0, 1.0) == pytest.approx(math.sqrt(0.87), abs=1e-9)
    assert throttle_rate([[1.0, 0.87]], 0.0, 1.0) == 1.0
    # under the curve's first share nothing slows down if the curve says 1 there
    assert throttle_rate([[0.4, 1.0], [1.0, 0.8]], 1.0, 9.0) == 1.0


@settings(max_examples=60, deadline=None)
@given(compute=hst.floats(1e-6, 10.0), other=hst.floats(0.0, 10.0), more=hst.floats(0.0, 10.0))
def test_rate_is_on_the_curve_and_rises_with_other_work(compute: float, other: float, more: float) -> None:
    r = throttle_rate(H100_CURVE, compute, other)
    share = (compute / r) / (compute / r + other)
    assert min(p[1] for p in H100_CURVE) - 1e-9 <= r <= 1.0
    assert r == pytest.approx(curve_rate(H100_CURVE, share), abs=1e-6)
    assert throttle_rate(H100_CURVE, compute, other + more) >= r - 1e-9


def test_throttled_stage_time_slows_compute_only_and_keeps_its_sums() -> None:
    def phase(c: float, m: float, comm: float) -> PhaseTime:
        return PhaseTime(c + m + comm, c, m, {"tp": comm} if comm else {}, 1e12, 1e9)

    fwd, bi, bw = phase(3e-3, 1e-3, 5e-4), phase(4e-3, 1e-3, 0.0), phase(2e-3, 0.0, 0.0)
    t = StageTime(fwd, bi, bw, PhaseTime(), 1e-4)
    t.add_op_times(["a", "b"], [{"fwd": fwd, "bwd_input": bi}, {"bwd_weight": bw}])
    before = {ph: (getattr(t, ph).total, getattr(t, ph).compute) for ph in PHASES}
    out = throttled(t, [[1.0, 0.8]])
    r = throttle_rate([[1.0, 0.8]], 9e-3, 2.5e-3)
    assert r < 1
    for ph in PHASES:
        p, q = getattr(t, ph), getattr(out, ph)
        assert (p.total, p.compute) == before[ph]  # the profile cache's object is untouched
        assert q.compute == pytest.approx(p.compute / r) and q.membound == p.membound and q.comm == p.comm
        assert q.total == pytest.approx(p.total + q.compute - p.compute)
    # the ops carry the same slowed phases (traces, the simulator)
    assert sum(d[ph].total for _, d in out.op_times for ph in d) == pytest.approx(out.total)
    assert out.p2p == t.p2p


def test_an_estimate_under_the_power_curve_is_slower_by_its_own_mix() -> None:
    m = load_model("llama3-8b")
    st = load_strategy("tp2_pp1_dp4_mbs1")
    sysc = load_system("h100-sxm-80gb")
    slowed, table_rate = Estimate(m, st, sysc).cost(), Estimate(m, st, _without_curve(sysc)).cost()
    ratio = slowed.duration_time_per_iter / table_rate.duration_time_per_iter
    assert 1.0 < ratio < 1 / min(p[1] for p in H100_CURVE)
    assert sum(v for k, v in slowed.breakdown.items() if k != "total") == pytest.approx(slowed.duration_time_per_iter)


def test_presets_with_the_h100_tables_carry_its_power_curve() -> None:
    assert H100_CURVE and H100_CURVE == sorted(H100_CURVE)
    assert load_system("h100-sxm-80gb").accelerator.power_curve == H100_CURVE
    # the H200 has the H100's tables but its own response (HBM3e copies draw more power)
    h200 = load_system("h200-sxm-141gb").accelerator.power_curve
    assert h200 and h200 != H100_CURVE and curve_rate(h200, 0.5) < curve_rate(H100_CURVE, 0.5)
    for name in ("a100-sxm-80gb", "b200-sxm-180gb", "a100_pcie", "h100-pcie-80gb"):
        assert load_system(name).accelerator.power_curve is None


@pytest.mark.parametrize("curve,rule", [
    ([[0.5, 0.9, 1.0]], "[share, rate] points"),
    ([], "[share, rate] points"),
    ([[0.0, 0.9]], "share in (0, 1]"),
    ([[0.5, 1.2]], "rate in (0, 1]"),
    ([[0.8, 0.9], [0.5, 0.95]], "shares must increase"),
])
def test_bad_power_curves_name_the_field_and_rule(curve, rule) -> None:
    sysc = load_system("a100_pcie")
    with pytest.raises(ConfigError) as e:
        sysc.with_updates({"accelerator": {**sysc.accelerator.model_dump(), "power_curve": curve}})
    assert "power_curve" in str(e.value) and rule in str(e.value)


def test_presets_say_which_carry_a_power_curve_and_sm_contention() -> None:
    from simumax.config.hardware import preset_provenance

    assert "power curve" in preset_provenance("nvidia_h100_80gb_hbm3")
    assert preset_provenance("h100-sxm-80gb").endswith("; its power curve; its SM contention")
    assert preset_provenance("h200-sxm-141gb").endswith("; its own measured power curve; its SM contention")
    others = preset_provenance("b200-sxm-180gb") + preset_provenance("a100_pcie")
    assert "power curve" not in others and "SM contention" not in others


def test_each_stage_reports_the_rate_its_chunks_ran_at() -> None:
    m = load_model("llama3-8b")
    st = load_strategy("tp1_pp2_dp4_mbs1")
    sysc = load_system("h100-sxm-80gb")
    est = Estimate(m, st, sysc)
    rates = [s.tensor_core_rate for s in est.cost().stages]
    # the rate is the fixed point of each chunk's own unslowed mix
    table_rate = Estimate(m, st, _without_curve(sysc))
    for r, t in zip(rates, table_rate.chunk_times):
        compute = sum(getattr(t, ph).compute for ph in PHASES)
        assert r == pytest.approx(throttle_rate(H100_CURVE, compute, t.total - compute), rel=1e-9)
    assert all(s.tensor_core_rate == 1.0 for s in table_rate.cost().stages)
