"""Does replaying the attention backward from a CUDA graph (simumax.calibrate.timing.graphed,
as `simumax calibrate` now times it) read the kernels' device time? For the kernels of
small_attention.json and four large ones: the eager wall time per call, the graphed one and
the device time of the call's kernels (torch.profiler). python3 graph_check.py; writes
$OUT/graph_check.json."""
import json
import logging
import os
import sys
from pathlib import Path

import torch

logging.basicConfig(level=logging.INFO)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from time_attention import attention_fn, dev, median_seconds, timing  # noqa: E402

HERE = Path(__file__).resolve().parent
kernels = [r["kernel"] for r in json.loads((HERE / "small_attention.json").read_text())]
large = [r["kernel"] for r in json.loads((HERE / "causal_grid.json").read_text())["rows"] if 1e-3 < r["seconds"] < 5e-3]
rows = []
for k in kernels + large[:4]:
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the forward on the stream the backward is captured on
        fn = attention_fn(k)
    torch.cuda.current_stream().wait_stream(side)
    eager = median_seconds(fn)
    g = timing.graphed(fn, dev, side)
    replay = median_seconds(g)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    device = sum(e.device_time_total for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 5 / 1e6
    rows.append({"kernel": k, "eager_seconds": eager, "graphed_seconds": replay, "device_seconds": device, "captured": g is not fn})
    print(k["phase"], k["seq_len"], k["kv_seq_len"], k["head_num"], k["kv_head_num"], k["qk_head_dim"],
          "eager %.3f graphed %.3f device %.3f ms" % (eager * 1e3, replay * 1e3, device * 1e3), "" if g is not fn else "NOT CAPTURED", flush=True)
    del g, fn
    torch.cuda.empty_cache()
json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows},
          open(os.path.join(os.environ.get("OUT", "."), "graph_check.json"), "w"), indent=1)
