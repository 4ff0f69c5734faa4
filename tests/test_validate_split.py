"""The per-micro-batch / per-iteration split of `simumax validate` (validate_split.py)."""

from __future__ import annotations

import json

import pytest

from simumax.validate import CaseResult, run_file
from simumax.validate_split import fit_line, step_group, step_split
from tests.conftest import VALIDATION, needs_shared, run_cli


def _case(cid: str, mbc: int, real: float, pred: float, group: str = "g", timed: bool = True) -> CaseResult:
    return CaseResult(cid, real if timed else None, pred if timed else None, (pred / real - 1) if timed else None, None,
                      None, None, None, None, micro_batches=mbc, step_group=group)


def test_line_by_hand() -> None:
    exact = fit_line([2, 4, 8], [5, 9, 17])  # 1 + 2x
    assert exact.fixed == pytest.approx(1.0) and exact.per_micro_batch == pytest.approx(2.0)
    assert exact.max_residual == pytest.approx(0.0, abs=1e-12)
    # (0, 1), (1, 2), (2, 4): slope = sum (x - 1)(y - 7/3) / 2 = (4/3 + 5/3) / 2 = 1.5, intercept 7/3 - 1.5 = 5/6;
    # residuals 1/6, -1/3, 1/6 over the times 1, 2, 4: the largest is (1/3) / 2 and (1/6) / 1
    ls = fit_line([0, 1, 2], [1, 2, 4])
    assert ls.per_micro_batch == pytest.approx(1.5) and ls.fixed == pytest.approx(5 / 6)
    assert ls.max_residual == pytest.approx(1 / 6)
    with pytest.raises(ValueError):
        fit_line([4, 4], [1.0, 1.1])


def test_groups_by_hand() -> None:
    results = [
        # group a: real 0.5 + 0.2 m, predicted 0.3 + 0.22 m
        _case("a1", 4, 0.5 + 0.8, 0.3 + 0.88, "a"), _case("a2", 8, 0.5 + 1.6, 0.3 + 1.76, "a"),
        _case("a3", 32, 0.5 + 6.4, 0.3 + 7.04, "a"),
        _case("a4", 16, 1.0, 1.0, "a", timed=False),  # no time: left out
        _case("b1", 8, 2.0, 2.1, "b"), _case("b2", 8, 2.2, 2.1, "b"),  # one micro-batch count: no line
        _case("c1", 4, 1.0, 1.0, ""),  # no group
    ]
    rows = step_split(results)
    assert len(rows) == 1
    g = rows[0]
    assert g["cases"] == ["a1", "a2", "a3"] and g["micro_batches"] == [4, 8, 32]
    assert g["real"]["per_micro_batch"] == pytest.approx(0.2) and g["real"]["fixed"] == pytest.approx(0.5)
    assert g["predicted"]["per_micro_batch"] == pytest.approx(0.22) and g["predicted"]["fixed"] == pytest.approx(0.3)
    assert g["per_micro_batch_error"] == pytest.approx(0.1)
    assert g["fixed_difference"] == pytest.approx(-0.2)


def test_group_key_frees_only_micro_batches_and_gpus() -> None:
    base = {"model": "m.json", "system": "s.json",
            "strategy": {"seq_len": 4096, "tp_size": 2, "micro_batch_num": 4, "world_size": 8}}
    more = json.loads(json.dumps(base))
    more["strategy"].update(micro_batch_num=32, world_size=64)
    assert step_group(base) == step_group(more)
    for change in ({"tp_size": 4}, {"seq_len": 8192}):
        other = json.loads(json.dumps(base))
        other["strategy"].update(change)
        assert step_group(other) != step_group(base)
    assert step_group({**base, "model_overrides": {"layer_num": 2}}) != step_group(base)
    assert step_group({**base, "system": "t.json"}) != step_group(base)


@needs_shared
@pytest.mark.parametrize("name", ["a100_pcie_megatron.jsonl", "b200_megatron.jsonl"])
def test_measured_files_steady_state(name: str) -> None:
    """Each job of the measured files ran at 4, 8 and 32 micro-batches: the prediction's
    per-micro-batch time is within 6 % of the measured line's on every one (it prints them)."""
    results = run_file(VALIDATION / name)
    rows = step_split(results)
    assert len(rows) >= 6 and all(g["micro_batches"] == [4, 8, 32] for g in rows)
    for g in rows:
        print(f"\n{g['cases'][0]}: per micro-batch {g['per_micro_batch_error']:+.1%}, "
              f"fixed {g['fixed_difference'] * 1e3:+.0f} ms")
        # the predicted points lie on their line: a pipeline adds one steady micro-batch at a time
        assert g["predicted"]["max_residual"] < 0.01
        assert abs(g["per_micro_batch_error"]) <= 0.06


@needs_shared
def test_cli_prints_and_returns_the_split() -> None:
    r = run_cli("validate", str(VALIDATION / "published_public.jsonl"), "--json")
    assert r.returncode == 0, r.stderr
    split = json.loads(r.stdout)["micro_batch_split"]
    # MegaScale's 175B strong-scaling rows (Table 2) and its ablation baseline (Table 3) run one job
    assert len(split) == 1 and len(split[0]["cases"]) == 9
    text = run_cli("validate", str(VALIDATION / "published_public.jsonl"), env={"COLUMNS": "400"}).stdout
    assert "per micro-batch vs per iteration (1 group of runs" in text
