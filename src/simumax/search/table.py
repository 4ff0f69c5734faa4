"""A search's rows as CSV: one column set for the CLI's search.csv and the web app's download."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from simumax.search.evaluate import SearchRow

# SI units, as SearchRow.to_dict gives them: iter_time in s, peak_mem / headroom in bytes
SEARCH_CSV_COLUMNS = (
    "label", "tp", "pp", "vp", "dp", "cp", "ep", "etp", "mbs", "mbc", "zero", "schedule", "first_stage_layers",
    "last_stage_layers", "recompute", "recompute_layer_num", "fits", "pruned", "iter_time", "mfu", "tokens_per_s_per_gpu",
    "peak_mem", "headroom", "pipeline_split",
)


def search_csv(rows: Iterable[SearchRow]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(SEARCH_CSV_COLUMNS)
    for r in rows:
        d = {**r.to_dict(), "label": r.label}
        w.writerow([d[c] for c in SEARCH_CSV_COLUMNS])
    return buf.getvalue()
