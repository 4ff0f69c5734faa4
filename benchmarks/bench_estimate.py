"""Time run_estimate + analysis_* per validation case (issue 26 asks a median <= 2 ms).
Two medians: cold (fresh config copies each time) and with the same config objects;
session 13 on 2 cores: ~3.4 and ~2.7 ms (4.1-4.25 ms before, when both were the same);
session 14 (no per-layer ops, shortened chunk walks): ~2.8-3.5 and ~2.4-2.6 ms on a noisy
machine; session 15 (config snapshots, template ops, shared kernel costs): ~2.1-2.3 and
~1.8-1.9 ms; session 16 (the layer profiles kept with the system config; copies of a
config no longer carry its caches, so "cold" is cold): ~2.5-2.9 and ~0.74 ms on a slower
day; session 17 (cheaper change checks): ~2.3 and ~0.68 ms on a faster one; session 18
(table fits: one parse per key, one pool per class): ~2.5 and ~0.68 ms; session 19
(no reference cycles: a dropped estimate is freed at once): ~2.2-2.5 and ~0.69 ms; session 20
(kernels as named tuples, one snapshot per build): ~1.84-1.92 and ~0.55 ms, docs/search.md.

    python benchmarks/bench_estimate.py [../shared/validation/*.jsonl]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from simumax.api import PerfLLM
from simumax.errors import ConfigError
from simumax.validate import default_reference_root, estimate_for_case, load_cases

HERE = Path(__file__).resolve().parent
DEFAULT = sorted((HERE.parent.parent / "shared" / "validation").glob("*.jsonl"))


def _time(model: Any, strategy: Any, system: Any) -> float:
    t0 = time.perf_counter()
    p = PerfLLM().configure(model_config=model, strategy_config=strategy, system_config=system)
    p.run_estimate()
    p.analysis_cost()
    p.analysis_mem()
    return time.perf_counter() - t0


def main(files: list[Path]) -> None:
    """Per case, the median of 5: "cold" with fresh copies of the three configs each time
    (nothing cached anywhere: a one-shot CLI run), and "same configs" reusing the loaded
    config objects (a script estimating many strategies on one system shares the fits of
    its efficiency tables, which live with the accelerator config)."""
    rows = []
    for f in files:
        root = default_reference_root(f)
        for case in load_cases(f):
            try:
                est = estimate_for_case(case, root)
                est.stages
            except ConfigError:
                continue
            cold = []
            for _ in range(5):
                copies = [c.model_copy(deep=True) for c in (est.model, est.strategy, est.system)]
                cold.append(_time(*copies))
            same = [_time(est.model, est.strategy, est.system) for _ in range(5)]
            rows.append((case["id"], statistics.median(cold), statistics.median(same)))
    width = max(len(r[0]) for r in rows)
    print(f"{'case':{width}s}  {'cold':>7s}     {'same configs':>12s}")
    for name, c, w in rows:
        print(f"{name:{width}s}  {c * 1e3:7.2f} ms  {w * 1e3:7.2f} ms")
    med_c = statistics.median(c for _, c, _ in rows)
    med_w = statistics.median(w for _, _, w in rows)
    print(f"{'median over ' + str(len(rows)) + ' cases':{width}s}  {med_c * 1e3:7.2f} ms  {med_w * 1e3:7.2f} ms"
          "  (issue 26 target <= 2 ms)")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]] or DEFAULT)
