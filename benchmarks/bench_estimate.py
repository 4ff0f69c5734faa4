"""Time run_estimate + analysis_* per validation case (issue 26 asks a median <= 2 ms; 3.9 ms in
session 13 on 2 cores, 4.1 in session 12, docs/search.md).

    python benchmarks/bench_estimate.py [../shared/validation/*.jsonl]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from simumax.api import PerfLLM
from simumax.errors import ConfigError
from simumax.validate import default_reference_root, estimate_for_case, load_cases

HERE = Path(__file__).resolve().parent
DEFAULT = sorted((HERE.parent.parent / "shared" / "validation").glob("*.jsonl"))


def main(files: list[Path]) -> None:
    rows = []
    for f in files:
        root = default_reference_root(f)
        for case in load_cases(f):
            try:
                est = estimate_for_case(case, root)
                est.stages  # MoE cases are not modelled yet
            except ConfigError:
                continue
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                p = PerfLLM().configure(model_config=est.model, strategy_config=est.strategy, system_config=est.system)
                p.run_estimate()
                p.analysis_cost()
                p.analysis_mem()
                times.append(time.perf_counter() - t0)
            rows.append((case["id"], statistics.median(times)))
    width = max(len(r[0]) for r in rows)
    for name, t in rows:
        print(f"{name:{width}s}  {t * 1e3:7.2f} ms")
    med = statistics.median(t for _, t in rows)
    print(f"{'median over ' + str(len(rows)) + ' cases':{width}s}  {med * 1e3:7.2f} ms  (issue 26 target <= 2 ms)")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or DEFAULT)
