"""Re-time the session-22 H100 attention entries with calibrate's CUDA-graph replay
(python3 retime_session22.py ENTRIES.json from the repository root, pydantic importable);
writes $OUT/session22_entries_graphed.json."""
import json, os, sys
sys.path.insert(0, "src")
import torch
from simumax.calibrate.compute import attention_fn
from simumax.calibrate.timing import median_seconds, FULL_CLOCK_COOLDOWN_SECONDS, FULL_CLOCK_LOAD_SECONDS
from simumax.graph.kernels import Attention
dev = torch.device("cuda")
rows = []
for f in json.load(open(sys.argv[1])):  # graph.kernels.Attention fields of the entries
    k = Attention(**f)
    t = median_seconds(attention_fn(k, dev), dev, 1, 10, cooldown=FULL_CLOCK_COOLDOWN_SECONDS, max_load=FULL_CLOCK_LOAD_SECONDS)
    rows.append({"kernel": k._asdict(), "seconds": t})
    print(k.phase, k.key, "%.3f ms" % (t * 1e3), flush=True)
    torch.cuda.empty_cache()
json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version(),
           "method": "simumax.calibrate.compute.attention_fn (CUDA-graph replay), cooldown 0.3 s, max_load 0.02 s", "rows": rows},
          open(os.path.join(os.environ["OUT"], "session22_entries_graphed.json"), "w"), indent=1)
