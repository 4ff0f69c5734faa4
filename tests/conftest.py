from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference" / "simumax_configs"
VALIDATION = SHARED / "validation"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not beside the checkout")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m simumax.cli ARGS`` from the repository root (``env`` added to the environment)."""
    return subprocess.run([sys.executable, "-m", "simumax.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=ROOT)


@pytest.fixture
def a100():
    from simumax.config.loader import load_system

    return load_system("a100_pcie")
