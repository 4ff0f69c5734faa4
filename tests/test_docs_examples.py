"""The printed examples in README.md and docs/tutorial.md are what the CLI prints today
(regenerate them with ``python docs/make_examples.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_and_tutorial_examples_are_current() -> None:
    spec = importlib.util.spec_from_file_location("make_examples", ROOT / "docs" / "make_examples.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    readme, tutorial = mod.render()
    assert (ROOT / "README.md").read_text() == readme, "run python docs/make_examples.py"
    assert (ROOT / "docs" / "tutorial.md").read_text() == tutorial, "run python docs/make_examples.py"
