from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference" / "simumax_configs"
VALIDATION = SHARED / "validation"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not beside the checkout")


@pytest.fixture
def a100():
    from simumax.config.loader import load_system

    return load_system("a100_pcie")
