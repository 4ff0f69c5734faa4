

def test_tables_keep_every_figure_whole_at_80_columns() -> None:
    """A narrow terminal wraps headers and labels, never a number ("14.…"); the memory table
    abbreviates its headers there and says what they stand for."""
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    code = ("import sys; from rich.console import Console; import simumax.cli as c; "
            "c.out_console = Console(width=80, force_terminal=False); sys.argv = sys.argv[1:]; c.main()")
    for argv in (["perf", "-m", "deepseek-v3", "-y", "b200-sxm-180gb", "-s", "ep8_pp1_dp8_mbs1", "--world-size", "256", "--set",
                  "pp_size=4", "--set", "num_layers_in_first_pipeline_stage=16", "--set", "num_layers_in_last_pipeline_stage=15",
                  "--set", "ep_size=64"],
                 ["search", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp1_pp2_dp4_mbs1", "--world-size", "8", "--gbs", "64",
                  "--top", "3"]):
        out = subprocess.run([sys.executable, "-c", code, "simumax", *argv], capture_output=True, text=True, env=env).stdout
        assert "…" not in out, out
        table_lines = [line for line in out.splitlines() if any(ch in line for ch in "│┃━─")]
        assert table_lines and max(len(line) for line in table_lines) <= 80
        if argv[0] == "perf":
            assert "wts weights" in out and re.search(r"202\.33\s+215\.24", out)


def test_several_overrides_after_one_set() -> None:
    """``--set a=1 b=2`` is ``--set a=1 --set b=2``; a flag, a file or ``--`` ends the list."""
    import json

    from simumax.cli import expand_sets
    from tests.conftest import run_cli

    assert expand_sets(["perf", "--set", "tp_size=2", "model.layer_num=4", "system.accelerator.mem_gbs=96", "-m", "x"]) == [
        "perf", "--set", "tp_size=2", "--set", "model.layer_num=4", "--set", "system.accelerator.mem_gbs=96", "-m", "x"]
    assert expand_sets(["--set=a=1", "b=[1, 2]", "runs/k=v.jsonl"]) == ["--set=a=1", "--set", "b=[1, 2]", "runs/k=v.jsonl"]
    assert expand_sets(["--set", "a=1", "--", "b=2"]) == ["--set", "a=1", "--", "b=2"]
    assert expand_sets(["validate", "cases.jsonl", "b=2"]) == ["validate", "cases.jsonl", "b=2"]  # no --set before it
    job = ["perf", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp1_pp2_dp4_mbs1", "--json"]
    listed = run_cli(*job, "--set", "strategy.zero_state=0", "seq_len=2048", "model.layer_num=8")
    repeated = run_cli(*job, "--set", "strategy.zero_state=0", "--set", "seq_len=2048", "--set", "model.layer_num=8")
    assert listed.returncode == repeated.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == json.loads(repeated.stdout)
    plain = json.loads(run_cli(*job).stdout)
    assert json.loads(listed.stdout)["cost"]["duration_time_per_iter"] != plain["cost"]["duration_time_per_iter"]


def test_set_without_a_key_is_one_line() -> None:
    from tests.conftest import run_cli

    for item in ("=3", "tp_size"):
        r = run_cli("perf", "-m", "llama3-8b", "-y", "a100_pcie", "-s", "tp1_pp2_dp4_mbs1", "--set", item)
        assert r.returncode == 2 and r.stderr == f"error: --set: expected key=value, got {item!r}\n", r.stderr
