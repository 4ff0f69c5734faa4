"""Regenerate the printed examples of README.md and docs/tutorial.md from real runs, so their
numbers never go stale (tests/test_docs_examples.py fails when they differ).

    python docs/make_examples.py          # rewrite both files in place
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_CMD = ["perf", "--model", "llama3-8b", "--system", "a100_pcie", "--strategy", "tp1_pp2_dp4_mbs1"]
TUTORIAL_CMD = ["perf", "-m", "llama3-8b", "-s", "tp2_pp1_dp4_mbs1", "-y", "h100-sxm-80gb"]
TUTORIAL_ROWS = ("iteration time", "MFU (causal", "tokens/s per GPU", "peak allocated")
FENCE = re.compile(r"```text\n(.*?)```", re.S)


def run(argv: list[str]) -> str:
    """The CLI's stdout as a 120-column terminal shows it."""
    env = {**os.environ, "COLUMNS": "120"}
    code = "import sys, simumax.cli as c; from rich.console import Console; c.out_console = Console(width=120); sys.argv = sys.argv[1:]; c.main()"
    out = subprocess.run([sys.executable, "-c", code, "simumax", *argv], capture_output=True, text=True, env=env, check=True).stdout
    return "\n".join(line.rstrip() for line in out.splitlines()) + "\n"


def readme_block() -> str:
    return run(README_CMD)


def tutorial_block() -> str:
    out = run(TUTORIAL_CMD).splitlines()
    rows = [line for line in out if line.startswith("│") and line.lstrip("│ ").startswith(TUTORIAL_ROWS)]
    return f"$ simumax {' '.join(TUTORIAL_CMD)} --out result/\n  {out[0]}\n" + "\n".join(rows) + "\n"


def rewrite(text: str, marker: str, block: str) -> str:
    """``text`` with the first ```text fence after ``marker`` replaced by ``block``."""
    at = text.index(marker)
    m = FENCE.search(text, at)
    assert m is not None, marker
    return text[: m.start(1)] + block + text[m.end(1):]


README_MARKER = "Example (`simumax perf --model llama3-8b --system a100_pcie --strategy tp1_pp2_dp4_mbs1`):"
TUTORIAL_MARKER = "## 2. Estimate one iteration"


def render() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text()
    tutorial = (ROOT / "docs" / "tutorial.md").read_text()
    return rewrite(readme, README_MARKER, readme_block()), rewrite(tutorial, TUTORIAL_MARKER, tutorial_block())


if __name__ == "__main__":
    readme, tutorial = render()
    (ROOT / "README.md").write_text(readme)
    (ROOT / "docs" / "tutorial.md").write_text(tutorial)
