"""A Megatron-LM training log as a measured run (importers/megatron_log.py, `simumax import
megatron --log`), then `validate` and `fit-runs` on the runs it records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simumax.errors import ConfigError
from simumax.importers.megatron_log import parse_megatron_log
from tests.conftest import run_cli

ARGS = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --ffn-hidden-size 4096 --vocab-size 32000 "
        "--seq-length 2048 --micro-batch-size 1 --global-batch-size 64 --tensor-model-parallel-size 2 --bf16")


def _line(it: int, ms: float) -> str:
    # Megatron-LM 0.19 training.py's training_log line (fields as it prints them)
    return (f" [2026-11-29 06:40:{it:02d}.123456] iteration {it:8d}/     100 | consumed samples: {it * 64:12d} |"
            f" elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): 123.4 |"
            f" learning rate: 3.000000E-04 | global batch size:    64 | lm loss: 9.123456E+00 | loss scale: 1.0 |"
            f" grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _mem(rank: int, max_alloc_mib: float) -> str:
    # utils/common_utils.py report_memory, printed on data-parallel rank 0 of each stage
    return (f"[Rank {rank}] (after 10 iterations) memory (MB) | allocated: 1000.00 | max allocated: {max_alloc_mib:.2f}"
            f" | reserved: 50000.00 | max reserved: {max_alloc_mib + 2048:.2f}")


LOG = "\n".join([
    "using world size: 8, data-parallel size: 4, tensor-model-parallel size: 2",
    _line(10, 2500.0), _mem(0, 30000.0), _mem(1, 30720.0),
    _line(20, 1210.0), _line(30, 1190.0), _line(40, 1200.0),
    "[after training is done] datetime: 2026-11-29 06:41:00",
])


def test_step_time_is_the_median_after_start_up_and_memory_the_largest_rank() -> None:
    log, notes = parse_megatron_log(LOG)
    assert log.intervals[0] == (10, 2500.0)
    assert log.step_ms == 1200.0  # 1210 / 1190 / 1200: the first interval (start-up) left out
    assert log.max_allocated == 30720.0 * 2**20  # MiB, max over the ranks that reported
    assert log.max_reserved == (30720.0 + 2048) * 2**20
    assert notes == []


def test_what_a_log_lacks_is_said() -> None:
    log, notes = parse_megatron_log(_line(10, 2500.0))
    assert log.step_ms == 2500.0 and log.max_allocated is None
    assert any("one logged interval" in n for n in notes) and any("no 'memory (MB)' report" in n for n in notes)
    with pytest.raises(ConfigError, match="elapsed time per iteration"):
        parse_megatron_log("nothing here\n")


def test_import_records_runs_that_validate_and_fit_runs_read(tmp_path: Path) -> None:
    script, runs = tmp_path / "train.sh", tmp_path / "runs" / "mine.jsonl"
    script.write_text(f"torchrun --nproc-per-node 8 pretrain_gpt.py {ARGS}\n")
    for name, scale in (("tp2_a", 1.0), ("tp2_b", 1.02)):
        log = tmp_path / f"{name}.log"
        log.write_text(LOG.replace("1200.0", f"{1200.0 * scale:.1f}"))
        r = run_cli("import", "megatron", "--file", str(script), "--log", str(log), "--runs", str(runs), "-y", "a100_pcie")
        assert r.returncode == 0, r.stderr
        assert f"{name}: " in r.stderr and "added to" in r.stderr and r.stdout == ""
    cases = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [c["id"] for c in cases] == ["tp2_a", "tp2_b"]
    assert cases[0]["measured"] == {"iter_time_ms": 1200.0, "peak_alloc_gib": 30.0, "peak_reserved_gib": 32.0}
    assert (cases[0]["strategy"]["tp_size"], cases[0]["strategy"]["world_size"], cases[0]["system"]) == (2, 8, "a100_pcie")
    v = run_cli("validate", str(runs), "--json")
    assert v.returncode == 0, v.stderr
    got = json.loads(v.stdout)["cases"]
    assert got[0]["measured_time"] == pytest.approx(1.2) and got[0]["measured_mem"] == 30 * 2**30
    f = run_cli("fit-runs", str(runs), "--out", str(tmp_path / "mine.json"), "--json")
    assert f.returncode == 0, f.stderr
    assert len(json.loads(f.stdout)["runs"]) == 2
    again = run_cli("import", "megatron", "--file", str(script), "--log", str(tmp_path / "tp2_a.log"), "--runs", str(runs),
                    "-y", "a100_pcie")
    assert again.returncode == 2 and "'tp2_a' is already in the file" in again.stderr


def test_log_options_need_each_other(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(LOG)
    for extra, missing in ((["--log", str(log), "-y", "a100_pcie"], "--runs"),
                           (["--log", str(log), "--runs", str(tmp_path / "r.jsonl")], "--system"),
                           (["--runs", str(tmp_path / "r.jsonl")], "--log")):
        r = run_cli("import", "megatron", *extra, "--world-size", "8", "--", *ARGS.split())
        assert r.returncode == 2 and r.stderr.startswith(f"error: {missing}"), r.stderr
    r = run_cli("import", "megatron", "--log", str(log), "--runs", str(tmp_path / "r.jsonl"), "-y", "no-such-gpu",
                "--world-size", "8", "--", *ARGS.split())
    assert r.returncode == 2 and "no-such-gpu" in r.stderr and not (tmp_path / "r.jsonl").exists()
