"""What fitting a system to one's own runs buys (simumax/fit_runs.py), on the validation
files, as markdown tables for docs/validation.md (run from the repo root with ../shared
beside it): python docs/make_fit_runs.py

* per cluster (each shipped file; each source of the public file: one cluster and one
  Megatron version each): the error on the base system, after the fit on all its runs, and
  each run predicted by a fit on the others (leave-one-out);
* with few runs: fit on k runs drawn at random (8 draws, fixed seed), error on the rest;
* across clusters: the A100 sources of the public file, each predicted by a fit on the
  other two."""

from __future__ import annotations

import random
from pathlib import Path

from simumax.config.loader import load_system
from simumax.fit_runs import Run, _times, fit_system, runs_from_file
from simumax.validate import case_source

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
FILES = ("b200_megatron", "a100_pcie_megatron", "published_public")
DRAWS = 8


def _errs(pred: list[float], runs: list[Run]) -> list[float]:
    return [p / r.seconds - 1 for p, r in zip(pred, runs)]


def _cell(e: list[float]) -> str:
    return f"{sum(map(abs, e)) / len(e):.1%} / {sum(e) / len(e):+.1%}"


def clusters() -> dict[tuple[str, str], list[Run]]:
    out: dict[tuple[str, str], list[Run]] = {}
    for name in FILES:
        runs, systems = runs_from_file(VALIDATION / f"{name}.jsonl")
        for r, s in zip(runs, systems):
            src = case_source(r.id) if name == "published_public" else name
            out.setdefault((src, s), []).append(r)
    return out


def main() -> None:
    by = clusters()
    print("| cluster (system) | runs | base: mean \\|err\\| / signed | fitted on all | each left out | max left out | factors (± 1 sd of ln) |")
    print("|---|---|---|---|---|---|---|")
    for (src, s), runs in by.items():
        res = fit_system(runs, load_system(s))
        loo = _errs([r.loo for r in res.rows], runs)
        factors = ", ".join(f"{k} x{f:.2f} ±{res.sd[k]:.2f}" for k, f in res.factors.items()
                            if not any(k.replace("_", "-") in n for n in res.notes))
        print(f"| {src} ({Path(s).stem}) | {len(runs)} | {_cell(_errs([r.before for r in res.rows], runs))} | "
              f"{_cell(_errs([r.after for r in res.rows], runs))} | {_cell(loo)} | {max(map(abs, loo)):.1%} | {factors} |")
    print()
    print("| cluster | base on the rest | fit on 1 run | fit on 3 runs |")
    print("|---|---|---|---|")
    rng = random.Random(0)
    for (src, s), runs in by.items():
        base = load_system(s)
        cells = []
        for k in (0, 1, 3):
            errs: list[float] = []
            for _ in range(DRAWS if k else 1):
                idx = rng.sample(range(len(runs)), k) if k else []
                train, test = [runs[i] for i in idx], [r for i, r in enumerate(runs) if i not in idx]
                system = fit_system(train, base).system if k else base
                errs += _errs(_times(test, system), test)
            cells.append(_cell(errs))
        print(f"| {src} | " + " | ".join(cells) + " |")
    print()
    print("| held-out A100 source | base | fitted on the other two | factors |")
    print("|---|---|---|---|")
    a100 = {src: runs for (src, s), runs in by.items() if s == "a100-sxm-80gb"}
    base = load_system("a100-sxm-80gb")
    for src, test in a100.items():
        train = [r for other, runs in a100.items() if other != src for r in runs]
        res = fit_system(train, base)
        factors = ", ".join(f"{k} x{f:.2f}" for k, f in res.factors.items())
        print(f"| {src} | {_cell(_errs(_times(test, base), test))} | {_cell(_errs(_times(test, res.system), test))} | {factors} |")


if __name__ == "__main__":
    main()
