"""The examples/ scripts run as a user would run them (fresh process, their own folder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPECT = {
    "perf_llama3_8b_tp1_pp2.py": "stage 1: peak",
    "deepseek_v2_ep4_pp2_selective.py": "peak per stage (GiB)",
    "llama3_70b_tp2_full_recompute.py": "full recompute:",
    "search_llama3_8b.py": "--tensor-model-parallel-size",
    "sharded_dp_llama3_70b.py": "ZeRO-3 deepspeed",
    "what_if_deepseek_v3_h100.py": "4 NICs per node",
}


def test_every_example_is_covered() -> None:
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == set(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs(name: str, tmp_path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert EXPECT[name] in r.stdout
    if name.startswith("llama3_70b"):
        assert (tmp_path / "out" / "llama3_70b_tp2" / "compute_result.json").is_file()
