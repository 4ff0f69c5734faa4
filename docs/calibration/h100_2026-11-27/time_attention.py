"""Attention kernels timed as `simumax calibrate` times attention (calibrate/compute.py
attention_fn: torch's default SDPA backend, native GQA; timing.median_seconds with 0.3 s
idle first and at most 20 ms of timed work), inline so that it runs on a machine with torch
alone. python3 time_attention.py SHAPES.json, SHAPES a list of graph.kernels.Attention
fields (the "kernel" entries of non_causal_blocks.json / causal_grid.json); writes
$OUT/nc_blocks.json: kernel, seconds, table-convention efficiency (bwd at the H100 table's
2.0x ratio)."""
import json, os, sys, time
import torch
import torch.nn.functional as F

dev = torch.device("cuda")
PEAK = 989.4e12

def median_seconds(fn, warmup=3, repeats=10, min_sample=1e-3, cooldown=0.3, max_load=0.02):
    torch.cuda.synchronize(); time.sleep(cooldown)
    for _ in range(max(warmup, 1)):
        fn()
    torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(1000, int(min_sample / one)))
    repeats = max(3, min(repeats, int(max_load / (inner * one))))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for a, b in pairs:
        a.record()
        for _ in range(inner):
            fn()
        b.record()
    torch.cuda.synchronize()
    xs = sorted(a.elapsed_time(b) / 1e3 / inner for a, b in pairs)
    return xs[len(xs) // 2]

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
