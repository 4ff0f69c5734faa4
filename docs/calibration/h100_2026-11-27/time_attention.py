"""Attention kernels timed as `simumax calibrate` times attention (calibrate/compute.py
attention_fn: torch's default SDPA backend, native GQA; timing.median_seconds with 0.3 s
idle first and at most 20 ms of timed work), runnable on a machine with torch alone.
python3 time_attention.py SHAPES.json, SHAPES a list of graph.kernels.Attention
fields (the "kernel" entries of non_causal_blocks.json / causal_grid.json); writes
$OUT/nc_blocks.json: kernel, seconds, table-convention efficiency (bwd at the H100 table's
2.0x ratio)."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

# simumax.calibrate.timing by path: it needs torch alone, where importing simumax needs
# pydantic (absent on the device machine). The files here were timed with an inline copy of
# the same loop that took the upper median of the samples (timing takes their median).
_spec = importlib.util.spec_from_file_location(
    "simumax_timing", Path(__file__).resolve().parents[3] / "src" / "simumax" / "calibrate" / "timing.py")
timing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timing)  # type: ignore[union-attr]

dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
PEAK = 989.4e12


def median_seconds(fn, cooldown=timing.FULL_CLOCK_COOLDOWN_SECONDS, max_load=timing.FULL_CLOCK_LOAD_SECONDS):
    """One call's time at full clock, as `simumax calibrate` times GEMM and attention kernels."""
    return timing.median_seconds(fn, dev, cooldown=cooldown, max_load=max_load)


def attention_fn(k):
    kv = k["kv_seq_len"] or k["seq_len"]
    q = torch.randn(k["batch"], k["head_num"], k["seq_len"], k["qk_head_dim"], device=dev, dtype=torch.bfloat16)
    key = torch.randn(k["batch"], k["kv_head_num"], kv, k["qk_head_dim"], device=dev, dtype=torch.bfloat16)
    v = torch.randn(k["batch"], k["kv_head_num"], kv, k["v_head_dim"], device=dev, dtype=torch.bfloat16)
    gqa = k["kv_head_num"] != k["head_num"]
    causal = k["causal"] and kv == k["seq_len"]
    fwd = lambda: F.scaled_dot_product_attention(q, key, v, is_causal=causal, enable_gqa=gqa)
    if k["phase"] == "fwd":
        return fwd
    for t in (q, key, v):
        t.requires_grad_(True)
    out = fwd(); g = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, key, v), g, retain_graph=True)

def main() -> None:
    rows = []
    for k in json.load(open(sys.argv[1])):
        s = median_seconds(attention_fn(k))
        kv = k["kv_seq_len"] or k["seq_len"]
        fwd_table = 2.0 * k["batch"] * k["head_num"] * k["seq_len"] * kv * (k["qk_head_dim"] + k["v_head_dim"])
        table = fwd_table * (2.0 if k["phase"] == "bwd" else 1.0)  # the H100 table's bwd ratio 2.0
        rows.append({"kernel": k, "seconds": s, "efficiency": table / (s * PEAK)})
        print(k["phase"], k["seq_len"], kv, k["head_num"], k["kv_head_num"], "%.3f ms eff %.3f" % (s * 1e3, rows[-1]["efficiency"]), flush=True)
        torch.cuda.empty_cache()
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(),
               "method": "calibrate/compute.py attention_fn, cooldown 0.3 s, max_load 0.02 s", "rows": rows},
              open(os.path.join(os.environ.get("OUT", "."), "nc_blocks.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
