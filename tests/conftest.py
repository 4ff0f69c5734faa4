from __future__ import annotations

import argparse
import os
import subprocess
import sys
import typing
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from hypothesis import settings

# The same examples on every run, so CI's verdict does not hang on the draw (a rare draw broke a
# property about once in a hundred runs); `--hypothesis-profile explore` draws new ones.
settings.register_profile("repeatable", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

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


@pytest.fixture(scope="session")
def megatron_training() -> SimpleNamespace:
    """Megatron-LM 0.19's training module (shipped in the megatron-core wheel): ``parser``, its
    argument parser with every flag, and ``num_floating_point_operations``; skipped without it."""
    pytest.importorskip("megatron.core")
    added = not hasattr(typing, "override")
    if added:  # megatron.training imports typing.override (Python 3.12); a no-op decorator before it
        typing.override = lambda f: f  # type: ignore[attr-defined]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
            from megatron.training.arguments import add_megatron_arguments
            from megatron.training.training import num_floating_point_operations
    except ImportError as exc:
        pytest.skip(f"megatron.training does not import here: {exc}")
    finally:
        if added:
            del typing.override  # type: ignore[attr-defined]
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    add_megatron_arguments(parser)
    return SimpleNamespace(parser=parser, num_floating_point_operations=num_floating_point_operations)
