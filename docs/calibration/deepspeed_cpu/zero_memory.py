"""DeepSpeed ZeRO's memory, measured on DeepSpeed itself on CPU (docs/modeling.md, "DeepSpeed
ZeRO"): two ranks over gloo (DeepSpeed's CPU accelerator), check-step's plain Llama (7 M
parameters), bf16, torch AdamW; the second step is tracked with torch's MemTracker and rank
0's peak printed as JSON. A record of how the figures were taken, not part of the tests.

    pip install --no-deps --target /tmp/dslib deepspeed==0.19.8
    pip install --target /tmp/dslib hjson py-cpuinfo psutil ninja msgpack tqdm einops
    PYTHONPATH=/tmp/dslib:. python docs/calibration/deepspeed_cpu/zero_memory.py STAGE [overlap]

Environment: DS_WORLD ranks (2), DS_SEQ tokens (32), DS_BUCKET reduce_bucket_size elements
(DeepSpeed's default); the step-peak runs of docs/modeling.md used DS_SEQ=4 DS_BUCKET=2000000.

Compare with ``simumax.estimate.Estimate`` for the same model, ``world_size`` DS_WORLD,
``seq_len`` DS_SEQ, ``fsdp_impl`` deepspeed, ``zero_state`` STAGE (``ds_reduce_bucket_size`` DS_BUCKET).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.multiprocessing as mp

SMALL = {"hidden_size": 256, "head_num": 4, "kv_head_num": 2, "intermediate_size": 704, "layer_num": 3,
         "vocab_size": 8000, "use_swiglu": True, "norm_type": "rmsnorm", "position_embedding_type": "rope",
         "untie_embeddings_and_output_weights": True}


def run(rank: int, world: int, stage: int, overlap: bool, q) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import deepspeed
    from torch.distributed._tools.mem_tracker import MemTracker

    from simumax.calibrate.check_step import LlamaStyle
    from simumax.config.loader import load_model

    model = load_model("llama3-8b").with_updates(SMALL)
    deepspeed.init_distributed(dist_backend="gloo")
    zero: dict[str, object] = {"stage": stage}
    if "DS_BUCKET" in os.environ:
        zero["reduce_bucket_size"] = int(os.environ["DS_BUCKET"])
    if overlap:
        zero["overlap_comm"] = True
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
           "zero_optimization": zero, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            net = LlamaStyle(model)
    else:
        net = LlamaStyle(model)
    engine, opt, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    tokens = torch.randint(0, 8000, (1, int(os.environ.get("DS_SEQ", "32"))))
    engine.backward(engine(tokens, tokens))
    engine.step()
    tracker = MemTracker()
    # the fp32 master partitions: tensors created before the tracker, seen only when handed to it
    masters = getattr(opt, "single_partition_of_fp32_groups", None) or getattr(opt, "fp32_partitioned_groups_flat", [])
    tracker.track_external(engine.module, opt.optimizer, *masters)
    with tracker:
        engine.backward(engine(tokens, tokens))
        engine.step()
    if rank == 0:
        snap = tracker.get_tracker_snapshot("peak")
        q.put({str(dev): {str(getattr(k, "value", k)): int(v) for k, v in d.items()} for dev, d in snap.items()})


if __name__ == "__main__":
    stage, overlap, world = int(sys.argv[1]), "overlap" in sys.argv[2:], int(os.environ.get("DS_WORLD", "2"))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, world, stage, overlap, q)) for r in range(world)]
    for p in procs:
        p.start()
    print(json.dumps(q.get(timeout=600)))
    for p in procs:
        p.join()
