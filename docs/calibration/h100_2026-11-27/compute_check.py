"""attention_fn of simumax.calibrate.compute (CUDA-graph replay) timed on the GPU for six kernels; writes $OUT/compute_check.json."""
import json, os, sys, logging
logging.basicConfig(level=logging.INFO)
sys.path.insert(0, "src")  # run from the repository root; needs pydantic (carried as wheels there)
import torch
from simumax.calibrate.compute import attention_fn
from simumax.calibrate.timing import median_seconds, FULL_CLOCK_COOLDOWN_SECONDS, FULL_CLOCK_LOAD_SECONDS
from simumax.graph.kernels import Attention
dev = torch.device("cuda")
out = []
for k in (Attention("bwd", 1, 1024, 8, 1, 128, 128), Attention("fwd", 1, 1024, 8, 1, 128, 128),
          Attention("bwd", 1, 2048, 16, 2, 128, 128), Attention("bwd", 1, 4096, 32, 8, 128, 128),
          Attention("fwd", 1, 4096, 32, 8, 128, 128), Attention("bwd", 1, 4096, 16, 2, 128, 128, causal=False, kv_seq_len=2048)):
    t = median_seconds(attention_fn(k, dev), dev, 1, 10, cooldown=FULL_CLOCK_COOLDOWN_SECONDS, max_load=FULL_CLOCK_LOAD_SECONDS)
    print(k.key, k.phase, "%.3f ms" % (t * 1e3), flush=True)
    out.append({"key": k.key, "phase": k.phase, "seconds": t})
json.dump(out, open(os.path.join(os.environ["OUT"], "compute_check.json"), "w"), indent=1)
