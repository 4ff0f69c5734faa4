"""The malformed-input corpus (tests/corpus/malformed_inputs.json): each case breaks one
rule — a missing or mistyped field, a negative or zero size, a divisibility rule, an
unknown name, bad JSON, a missing file. Each must give one ConfigError naming the field
(``field``) and the rule; the CLI prints exactly one line, exits 2, prints nothing on
stdout and writes nothing.

Case format: ``model`` / ``strategy`` / ``system`` each one of {"preset", "set",
"set_path", "delete"} (a shipped preset edited), {"raw": text} (file contents), {"path"}
(a file that does not exist), {"name"} (a preset name); ``args``: extra CLI arguments.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from simumax.cli import main
from simumax.config.loader import load_model, load_strategy, load_system

CORPUS = json.loads((Path(__file__).parent / "corpus" / "malformed_inputs.json").read_text())
DEFAULTS = {"model": "llama3-8b", "strategy": "tp1_pp2_dp4_mbs1", "system": "a100_pcie"}
LOADERS = {"model": load_model, "strategy": load_strategy, "system": load_system}


def _materialise(kind: str, spec: dict[str, Any] | None, tmp: Path) -> str:
    """A CLI argument for one config: a preset name, or a JSON file written to tmp."""
    if spec is None:
        return DEFAULTS[kind]
    if "name" in spec:
        return spec["name"]
    if "path" in spec:
        return spec["path"]
    path = tmp / f"{kind}.json"
    if "raw" in spec:
        path.write_text(spec["raw"])
        return str(path)
    data = LOADERS[kind](spec["preset"]).to_dict()
    data.update(spec.get("set", {}))
    for dotted, value in spec.get("set_path", {}).items():
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value
    for name in spec.get("delete", []):
        data.pop(name)
    path.write_text(json.dumps(data))
    return str(path)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["simumax", *argv])
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def test_corpus_is_large_and_ids_unique() -> None:
    ids = [c["id"] for c in CORPUS]
    assert len(ids) >= 250 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", CORPUS, ids=[c["id"] for c in CORPUS])
def test_malformed_input_one_line_exit_2_nothing_written(case: dict[str, Any], tmp_path: Path) -> None:
    args = {k: _materialise(k, case.get(k), tmp_path) for k in ("model", "strategy", "system")}
    out_dir = tmp_path / "out"
    argv = ["perf", "-m", args["model"], "-s", args["strategy"], "-y", args["system"], "--out", str(out_dir), *case.get("args", [])]
    code, stdout, stderr = _run(argv)
    assert code == 2, (stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr and stdout == ""
    assert case["field"] in lines[0], f"expected field {case['field']!r} named in: {lines[0]}"
    assert not out_dir.exists()
