"""Merge the attention kernels timed on the lent H100 (time_attention.py: non_causal_blocks.json,
context-parallel blocks; causal_grid.json, causal kernels of 1K-32K tokens;
retime_session22.py: session22_entries_graphed.json) into the nvidia_h100_80gb_hbm3 preset's
sdp tables, in the preset's own FLOP convention; then `python docs/make_hardware_presets.py`. The preset's own
18 attention entries (session 22, timed eagerly) are replaced by their re-timing with
calibrate's CUDA-graph replay (session22_entries_graphed.json). Small kernels
whose time per call was the host's (small_attention.json: wall time over 1.1x the device
time of the call's kernels; torch.autograd.grad costs ~0.14 ms of host time per call, a
training step's backward launches the same kernels for ~10 us each) enter at their device
time. Kernels of over 5 ms are left out: their three warm-up calls alone load the GPU past
the ~30 ms its power limiter allows at full clock, so they read the throttled rate, which
the preset's power curve applies on top. Run from the repository root:
python docs/calibration/h100_2026-11-27/merge_attention.py"""

import json
from pathlib import Path

from simumax.graph.kernels import Attention

HERE = Path(__file__).resolve().parent
PRESET = HERE.parents[2] / "src" / "simumax" / "config" / "presets" / "system" / "nvidia_h100_80gb_hbm3.json"

cfg = json.loads(PRESET.read_text())
ops = cfg["accelerator"]["op"]
MAX_SECONDS = 5e-3
HOST_BOUND = 1.1  # wall over device time: the call waited on the host, not on the kernel
FILES = ("session22_entries_graphed.json", "non_causal_blocks.json", "causal_grid.json")
rows = [r for f in FILES for r in json.loads((HERE / f).read_text())["rows"]]
device = {json.dumps(r["kernel"], sort_keys=True): r for r in json.loads((HERE / "small_attention.json").read_text())}
for row in rows:
    if row["seconds"] > MAX_SECONDS:
        continue
    k = Attention(**row["kernel"])
    small = device.get(json.dumps(row["kernel"], sort_keys=True))
    if small and small["wall_seconds"] > HOST_BOUND * small["device_seconds"]:
        row = dict(row, seconds=small["device_seconds"])
    spec = ops[f"sdp_{k.phase}"]
    table_flops = k.table_flops(spec.get("bwd_flops_ratio") or 2.5)
    spec["accurate_efficient_factor"][k.key] = round(table_flops / (row["seconds"] * spec["tflops"] * 1e12), 4)
PRESET.write_text(json.dumps(cfg, indent=2) + "\n")
