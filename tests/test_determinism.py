"""Same inputs, byte-identical outputs: across runs, across processes (different hash
seeds), for perf, simulate and search; and results are written atomically (a writer that
fails mid-way leaves neither a partial file nor a temp file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simumax.atomic import write_bytes_atomic, write_json_atomic
from tests.conftest import run_cli

PERF = ["perf", "-m", "deepseek-v2-lite", "-s", "ep4_pp2_dp4_mbs1", "-y", "a100_pcie", "--set", "layer_num=26", "--json"]
SIM = ["simulate", "-m", "llama3-8b", "-s", "tp1_pp4_vp2_sync_mbs1_mbc8_no_ckpt", "-y", "b200_bf16_ceperm", "--no-ops", "--json"]
SEARCH = ["search", "-m", "llama3-8b", "-s", "tp1_pp2_dp4_mbs1", "-y", "a100_pcie", "--world-size", "16", "--gbs", "32",
          "--set", "model.layer_num=8", "--vp", "1,2", "--zero", "0,1", "--json"]


def _cli(args: list[str], seed: str) -> str:
    r = run_cli(*args, env={"PYTHONHASHSEED": seed})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _files(folder: Path) -> dict[str, bytes]:
    # the Gantt PNG embeds no timestamp but matplotlib's renderer may differ by version: compare the data files
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix in (".json", ".jsonl", ".csv", ".txt", ".pickle")}


@pytest.mark.parametrize("args", [PERF, SEARCH], ids=["perf", "search"])
def test_stdout_identical_across_processes(args: list[str]) -> None:
    assert _cli(args, "1") == _cli(args, "4242")


FIT_REPR = """
from simumax.config.loader import load_system
from simumax.cost.efficiency_fit import TableFit
from simumax.graph.kernels import Gemm
t = load_system("b200_bf16_ceperm").accelerator.op["matmul"].accurate_efficient_factor
f = TableFit(t, 148)
print(repr([f.predict(Gemm(m, 4096, n, "TN").key) for m in (1000, 3000, 7000) for n in (1234, 5000, 14000)]))
"""


def test_fitted_efficiency_bit_identical_across_hash_seeds() -> None:
    """The fit sums squared distances over size names; summed in string-hash order the
    last bits changed with PYTHONHASHSEED (a resumed search differed from a fresh one in
    the 16th digit). Eight seeds, one result to the bit."""
    outs = set()
    for seed in range(1, 9):
        r = subprocess.run([sys.executable, "-c", FIT_REPR], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)})
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout)
    assert len(outs) == 1


def test_written_files_identical_across_processes(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    out_a = _cli([*SIM, "--out", str(a)], "7")
    out_b = _cli([*SIM, "--out", str(b)], "99")
    assert out_a.replace(str(a), "") == out_b.replace(str(b), "")
    fa, fb = _files(a), _files(b)
    assert fa and fa.keys() == fb.keys()
    for name in fa:
        assert fa[name] == fb[name], name
    sa, sb = tmp_path / "sa", tmp_path / "sb"
    _cli([*SEARCH, "--out", str(sa)], "3")
    _cli([*SEARCH, "--out", str(sb)], "5")
    assert _files(sa) == _files(sb)


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "result.json"

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(target, {"ok": 1, "bad": Unserialisable()})
    assert list(tmp_path.iterdir()) == []

    def crash(f) -> None:
        f.write(b"half a file")
        raise KeyboardInterrupt  # a signal arriving mid-write

    write_json_atomic(target, {"ok": 1})
    before = target.read_bytes()
    with pytest.raises(KeyboardInterrupt):
        write_bytes_atomic(target, crash)
    assert target.read_bytes() == before  # the old complete file stays
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]
