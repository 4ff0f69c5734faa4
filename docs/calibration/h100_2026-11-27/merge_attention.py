"""Merge the attention kernels timed on the lent H100 by time_attention.py (as `simumax
calibrate` times attention: non_causal_blocks.json, context-parallel blocks; causal_grid.json,
causal kernels of 1K-32K tokens) into the nvidia_h100_80gb_hbm3 preset's sdp tables, in the
preset's own FLOP convention; then `python docs/make_hardware_presets.py`. Kernels of over
5 ms are left out: their three warm-up calls alone load the GPU past the ~30 ms its power
limiter allows at full clock, so they read the throttled rate, which the preset's power
curve applies on top. Run from the repository root:
python docs/calibration/h100_2026-11-27/merge_attention.py"""

import json
from pathlib import Path

from simumax.graph.kernels import Attention

HERE = Path(__file__).resolve().parent
PRESET = HERE.parents[2] / "src" / "simumax" / "config" / "presets" / "system" / "nvidia_h100_80gb_hbm3.json"

cfg = json.loads(PRESET.read_text())
ops = cfg["accelerator"]["op"]
MAX_SECONDS = 5e-3
rows = [r for f in ("non_causal_blocks.json", "causal_grid.json") for r in json.loads((HERE / f).read_text())["rows"]]
for row in rows:
    if row["seconds"] > MAX_SECONDS:
        continue
    k = Attention(**row["kernel"])
    spec = ops[f"sdp_{k.phase}"]
    table_flops = k.table_flops(spec.get("bwd_flops_ratio") or 2.5)
    spec["accurate_efficient_factor"][k.key] = round(table_flops / (row["seconds"] * spec["tflops"] * 1e12), 4)
PRESET.write_text(json.dumps(cfg, indent=2) + "\n")
