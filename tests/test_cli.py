

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
