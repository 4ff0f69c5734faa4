"""Small attention kernels (python3 small_attn.py SHAPES.json): the wall time per call as
`simumax calibrate` times them (time_attention.py) against the device time of the kernels
one call runs (torch.profiler, CUDA activity), so a time set by the host's launch rate
(torch.autograd.grad per backward call) shows. The first shapes are a 128-token, 1-head
kernel: the harness floor. Writes $OUT/small_attention.json."""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from time_attention import attention_fn, median_seconds  # noqa: E402

rows = []
for k in json.load(open(sys.argv[1])):
    fn = attention_fn(k)
    wall = median_seconds(fn)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    dev = sum(e.device_time_total for e in kernels) / 5 / 1e6  # microseconds per 5 calls -> seconds per call
    rows.append({"kernel": k, "wall_seconds": wall, "device_seconds": dev})
    print(k["phase"], k["seq_len"], k["kv_seq_len"], k["head_num"], k["kv_head_num"], k["qk_head_dim"], "wall %.3f ms device %.3f ms" % (wall * 1e3, dev * 1e3), flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "."), "small_attention.json"), "w"), indent=1)
