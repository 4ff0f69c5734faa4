"""Fit the uncertainty bands (simumax/uncertainty.py) on the validation files and report
their leave-one-source-out coverage (run from the repo root with ../shared beside it):
python docs/make_uncertainty.py"""

from __future__ import annotations

import math
from pathlib import Path

from simumax.uncertainty import band_share, fit_band, leave_one_source_out
from simumax.validate import case_source, estimate_for_case, load_cases

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"
FILES = ("a100_pcie_megatron", "b200_megatron", "published_public")


def band_rows() -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
    """(time rows, memory rows): (source, unmeasured share, ln(real / predicted)) per case;
    the shipped files are one source each, the public file one per paper."""
    time_rows, mem_rows = [], []
    root = VALIDATION.parent / "reference"
    for name in FILES:
        for case in load_cases(VALIDATION / f"{name}.jsonl"):
            source = name if name != "published_public" else case_source(case["id"])
            measured = case.get("measured", {})
            est = estimate_for_case(case, root)
            if measured.get("iter_time_ms") is not None:
                u = band_share(est)
                time_rows.append((source, u, math.log(measured["iter_time_ms"] / 1e3 / est.cost().duration_time_per_iter)))
            if measured.get("peak_alloc_gib") is not None:
                mem_rows.append((source, 0.0, math.log(measured["peak_alloc_gib"] * 2**30 / est.memory().peak_mem)))
    return time_rows, mem_rows


def main() -> None:
    time_rows, mem_rows = band_rows()
    print("TIME_BAND =", fit_band(time_rows))
    print("MEMORY_BAND =", fit_band(mem_rows))
    for what, rows in (("time", time_rows), ("memory", mem_rows)):
        print(f"leave-one-source-out coverage of the 80 % {what} band:")
        for source, (inside, n) in leave_one_source_out(rows).items():
            print(f"  {source}: {inside}/{n} ({inside / n:.0%})")


if __name__ == "__main__":
    main()
