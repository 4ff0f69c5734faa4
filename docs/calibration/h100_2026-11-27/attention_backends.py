"""Time attention shapes (python3 attention_backends.py SHAPES.json: the NeMo rows' kernels
with their predicted seconds, as attention_backends.json's "attn" entries hold them) under
torch's default SDPA backend, FlashAttention-2 and cuDNN, and a few TE-like memory-bound
kernels (fp8 cast, transpose-cast, amax) in torch. Writes $OUT/attn_backends.json."""
import json, os, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from time_attention import dev, median_seconds  # noqa: E402  (simumax's timing loop, by path)

shapes = json.load(open(sys.argv[1]))
res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(), "attn": [], "mem": []}

def make(k, backend):
    kv = k["kv_seq_len"] or k["seq_len"]
    q = torch.randn(k["batch"], k["head_num"], k["seq_len"], k["qk_head_dim"], device=dev, dtype=torch.bfloat16)
    key = torch.randn(k["batch"], k["kv_head_num"], kv, k["qk_head_dim"], device=dev, dtype=torch.bfloat16)
    v = torch.randn(k["batch"], k["kv_head_num"], kv, k["v_head_dim"], device=dev, dtype=torch.bfloat16)
    rep = k["head_num"] // k["kv_head_num"]
    gqa = rep > 1
    if gqa and backend == "cudnn":  # expand outside the timed call (TE's cuDNN path takes GQA natively)
        key = key.repeat_interleave(rep, dim=1).contiguous(); v = v.repeat_interleave(rep, dim=1).contiguous(); gqa = False
    causal = k["causal"] and kv == k["seq_len"]
    be = {"flash": [SDPBackend.FLASH_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION], "default": None}[backend]
    def fwd():
        if be is None:
            return F.scaled_dot_product_attention(q, key, v, is_causal=causal, enable_gqa=gqa)
        with sdpa_kernel(be):
            return F.scaled_dot_product_attention(q, key, v, is_causal=causal, enable_gqa=gqa)
    if k["phase"] == "fwd":
        return fwd
    for t in (q, key, v): t.requires_grad_(True)
    out = fwd(); g = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, key, v), g, retain_graph=True)

for s in shapes:
    k = s["kernel"]; row = {"kernel": k, "pred_s": s["pred_s"], "cases": sorted(set(s["cases"]))}
    for b in ("default", "flash", "cudnn"):
        try:
            fn = make(k, b)
            row[b] = median_seconds(fn)
        except Exception as e:
            row[b] = None; row[b + "_err"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        torch.cuda.empty_cache()
    print(k["phase"], k["batch"], k["seq_len"], k["head_num"], k["kv_head_num"], k["causal"], k["kv_seq_len"], "pred %.3f" % (s["pred_s"]*1e3),
          *("%s %s" % (b, "%.3f" % (row[b]*1e3) if row[b] else row.get(b + "_err")) for b in ("default", "flash", "cudnn")), flush=True)
    res["attn"].append(row)

# which kernels the default backend runs (one shape)
try:
    for i in (6, 7):
        k = shapes[i]["kernel"]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            make(k, "default")(); torch.cuda.synchronize()
        res["default_kernels_" + k["phase"]] = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})[:20]
        print(res["default_kernels_" + k["phase"]])
except Exception as e:
    print("profile failed", e)

# TE-like memory-bound kernels, eager single kernels
for rows, cols in ((4096, 4096), (4096, 11008), (8192, 4096), (4096, 14336), (2048, 6144), (16384, 8192)):
    x = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
    n = rows * cols
    tests = {
        "cast_fp8": (lambda: x.to(torch.float8_e4m3fn), 3 * n),
        "transpose_bf16": (lambda: x.t().contiguous(), 4 * n),
        "transpose_cast_fp8": (lambda: x.t().to(torch.float8_e4m3fn, memory_format=torch.contiguous_format), 3 * n),
        "amax": (lambda: x.abs().amax(), 2 * n + 2 * n + 2 * n),  # abs writes a temp
        "add": (lambda: x + x, 4 * n),
    }
    for name, (fn, nbytes) in tests.items():
        t = median_seconds(fn, cooldown=0.05, max_load=None)
        res["mem"].append({"name": name, "rows": rows, "cols": cols, "bytes": nbytes, "s": t, "gbps": nbytes / t / 1e9})
        print(name, rows, cols, "%.1f us %.0f GB/s" % (t * 1e6, nbytes / t / 1e9), flush=True)
    del x; torch.cuda.empty_cache()

json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "attn_backends.json"), "w"), indent=1)
