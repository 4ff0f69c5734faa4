"""DeepSpeed ZeRO's memory, measured on DeepSpeed itself on CPU (docs/modeling.md, "DeepSpeed
ZeRO"): DS_WORLD ranks over gloo (DeepSpeed's CPU accelerator), check-step's plain Llama,
bf16, torch's AdamW; the second step is tracked with torch's MemTracker and rank 0's peak
printed as JSON (stage 3's kept gradient partition and bucket handed to the tracker, its
reduce-scatters run as in-place all-reduces: gloo's reduce-scatter copies its input, NCCL's
allocates nothing). A record of how the figures were taken, not part of the tests.

    pip install --no-deps --target /tmp/dslib deepspeed==0.19.8
    pip install --target /tmp/dslib hjson py-cpuinfo psutil ninja msgpack tqdm einops
    PYTHONPATH=/tmp/dslib:. python docs/calibration/deepspeed_cpu/zero_memory.py STAGE [overlap]

Environment: DS_WORLD ranks (2), DS_SEQ tokens (32), DS_BUCKET reduce_bucket_size elements
(DeepSpeed's default), DS_GAS micro-batches per step (1), DS_LAYERS / DS_VOCAB the model's layers and vocabulary (3 / 8000:
7 M parameters), DS_FUSED torch's fused AdamW (in place, as DeepSpeed's FusedAdam on a GPU;
without it torch's foreach AdamW, whose temporaries a GPU run does not have), DS_MOMENTS the
bytes alive after the forward, after the backward and when the Adam update starts besides the
peak, DS_PHASES the peak of each pass (``forward_M_peak``, ``backward_M_peak`` of micro-batch M)
and of the step (``step_peak``). The runs of docs/modeling.md used DS_SEQ=4 DS_BUCKET=1000000
DS_FUSED=1 DS_MOMENTS=1 DS_PHASES=1 DS_LAYERS=12 DS_VOCAB=1024, then the 7 M model at 32 tokens
with the default bucket (zero_step.jsonl: ``grid`` writes both).

Compare with ``simumax.estimate.Estimate`` for the same model, ``world_size`` DS_WORLD,
``seq_len`` DS_SEQ, ``fsdp_impl`` deepspeed, ``zero_state`` STAGE (``ds_reduce_bucket_size``
DS_BUCKET) and no workspace (tests/test_sharding.py does, from zero_step.jsonl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

SMALL = {"hidden_size": 256, "head_num": 4, "kv_head_num": 2, "intermediate_size": 704, "layer_num": 3,
         "vocab_size": 8000, "use_swiglu": True, "norm_type": "rmsnorm", "position_embedding_type": "rope",
         "untie_embeddings_and_output_weights": True}


def small(env: "os._Environ[str] | dict[str, str]" = os.environ) -> dict[str, object]:
    """SMALL (llama3-8b's fields it overrides), with DS_LAYERS layers and a DS_VOCAB
    vocabulary when ``env`` sets them."""
    return {**SMALL, "layer_num": int(env.get("DS_LAYERS", SMALL["layer_num"])),
            "vocab_size": int(env.get("DS_VOCAB", SMALL["vocab_size"]))}


def run(rank: int, world: int, stage: int, overlap: bool, q) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import deepspeed
    from torch.distributed._tools.mem_tracker import MemTracker

    from simumax.calibrate.check_step import LlamaStyle
    from simumax.config.loader import load_model

    model = load_model("llama3-8b").with_updates(small())
    deepspeed.init_distributed(dist_backend="gloo")
    if stage == 3:
        import deepspeed.comm as dcomm

        def reduce_scatter_in_place(output_tensor, tensor, group=None, **kwargs):
            """ZeRO-3's reduce-scatter as NCCL's allocates: nothing in PyTorch's allocator
            (gloo's reduce_scatter_tensor copies its whole input, a CPU-only temporary)."""
            dcomm.all_reduce(tensor, group=group)
            output_tensor.copy_(tensor.chunk(dcomm.get_world_size(group))[dcomm.get_rank(group)])
        dcomm.reduce_scatter_fn = reduce_scatter_in_place
    zero: dict[str, object] = {"stage": stage}
    if "DS_BUCKET" in os.environ:
        zero["reduce_bucket_size"] = int(os.environ["DS_BUCKET"])
    if overlap:
        zero["overlap_comm"] = True
    adam: dict[str, object] = {"lr": 1e-4, "torch_adam": True}
    if os.environ.get("DS_FUSED"):
        adam["fused"] = True
    gas = int(os.environ.get("DS_GAS", "1"))
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gas, "bf16": {"enabled": True},
           "zero_optimization": zero, "optimizer": {"type": "AdamW", "params": adam}}
    if stage == 3:
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            net = LlamaStyle(model)
    else:
        net = LlamaStyle(model)
    engine, opt, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    tokens = torch.randint(0, int(small()["vocab_size"]), (1, int(os.environ.get("DS_SEQ", "32"))))
    for _ in range(gas):  # a first step creates the optimizer states
        engine.backward(engine(tokens, tokens))
        engine.step()
    tracker = MemTracker()
    # tensors created before the tracker are seen only when handed to it: the fp32 master
    # partitions, at stage 3 the bf16 parameter partitions the parameters' ds_tensor view, and
    # stage 3's gradient partition and IPG bucket, allocated once when the optimizer is built
    # (stage3.py) and kept: untracked, they would count only from the first op that touches them
    masters = getattr(opt, "single_partition_of_fp32_groups", None) or getattr(opt, "fp32_partitioned_groups_flat", [])
    kept = [opt.grad_partitions_flat_buffer, *(b.buffer for b in opt.ipg_buckets.values())] if stage == 3 else []
    tracker.track_external(engine.module, opt.optimizer, *masters, *getattr(opt, "fp16_partitioned_groups_flat", []), *kept)
    moments = {}
    if os.environ.get("DS_MOMENTS"):  # what is alive when the Adam update starts (after the fp32 gradient cast)
        inner = opt._optimizer_step

        def at_update(*args, **kwargs):
            moments["update"] = tracker.get_tracker_snapshot("current")
            return inner(*args, **kwargs)
        opt._optimizer_step = at_update
    phases = {}  # DS_PHASES: the peak of each pass (micro-batch m's forward / backward) and of the step

    def phase_end(name: str) -> None:
        if os.environ.get("DS_PHASES"):
            phases[name] = tracker.get_tracker_snapshot("peak")
            tracker._peak_mem_snap = tracker.get_tracker_snapshot("current")  # the next phase's peak from here
            tracker._peak_mem = {d: snap["Total"] for d, snap in tracker._peak_mem_snap.items()}

    peak = {}
    with tracker:
        for mb in range(gas):  # engine.step() steps at the last micro-batch only
            if mb:
                tracker.reset_mod_stats()  # (its per-module records take one forward; the peak stays)
            loss = engine(tokens, tokens)
            moments.setdefault("after_forward", tracker.get_tracker_snapshot("current"))
            phase_end(f"forward_{mb}_peak")
            engine.backward(loss)
            moments["after_backward"] = tracker.get_tracker_snapshot("current")
            phase_end(f"backward_{mb}_peak")
            engine.step()
            phase_end("step_peak") if mb == gas - 1 else None
        peak = tracker.get_tracker_snapshot("peak")
    if rank == 0:
        moments["peak"] = peak
        if phases:  # the overall peak is the largest phase's
            moments["peak"] = max(phases.values(), key=lambda snap: max(d["Total"] for d in snap.values()))
            moments.update(phases)
        out = {name: {str(getattr(k, "value", k)): int(v) for d in snap.values() for k, v in d.items()}
               for name, snap in moments.items()}
        q.put(out if os.environ.get("DS_MOMENTS") else out["peak"])


GRID = {"DS_SEQ": "4", "DS_BUCKET": "1000000", "DS_FUSED": "1", "DS_MOMENTS": "1", "DS_PHASES": "1", "DS_LAYERS": "12", "DS_VOCAB": "1024"}
# the 7 M-parameter model at 32 tokens with DeepSpeed's default bucket: stages 1, 2, 2 with
# overlap_comm, 3 on 2 ranks
DEFAULTS = {"DS_SEQ": "32", "DS_FUSED": "1", "DS_MOMENTS": "1", "DS_PHASES": "1", "DS_LAYERS": "3", "DS_VOCAB": "8000"}


def grid(path: Path) -> None:
    """Stages 1-3 on 2, 4 and 8 ranks with GRID's settings, stage 3 again with two
    micro-batches, stages 1, 2 and 2 with overlap_comm with two on 2 ranks, stage 2 at 512
    tokens, then DEFAULTS' four runs, one JSON line each."""
    runs = [(GRID, stage, world, False) for stage in (1, 2, 3) for world in (2, 4, 8)]
    runs += [({**GRID, "DS_GAS": "2"}, 3, world, False) for world in (2, 4, 8)]  # ZeRO-3, two micro-batches
    runs += [({**GRID, "DS_GAS": "2"}, stage, 2, overlap) for stage, overlap in ((1, False), (2, False), (2, True))]
    runs += [({**GRID, "DS_SEQ": "512"}, 2, 2, False)]  # ZeRO-2 whose backward peaks before its first reduce
    runs += [(DEFAULTS, stage, 2, overlap) for stage, overlap in ((1, False), (2, False), (2, True), (3, False))]
    with path.open("w") as f:
        for settings, stage, world, overlap in runs:
            env = {k: v for k, v in os.environ.items() if not k.startswith("DS_")}
            env.update(settings, DS_WORLD=str(world))
            args = [sys.executable, __file__, str(stage)] + (["overlap"] if overlap else [])
            out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            rec = {"stage": stage, "world": world, "overlap_comm": overlap, "seq": int(settings["DS_SEQ"]),
                   "micro_batches": int(settings.get("DS_GAS", 1)),
                   "bucket": int(settings.get("DS_BUCKET", 500_000_000)), "model": small(settings),
                   "fused_adamw": True, "deepspeed": "0.19.8",
                   "torch": torch.__version__.split("+")[0], **json.loads(out)}
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    if sys.argv[1] == "grid":
        grid(Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).with_name("zero_step.jsonl"))
        sys.exit()
    stage, overlap, world = int(sys.argv[1]), "overlap" in sys.argv[2:], int(os.environ.get("DS_WORLD", "2"))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, world, stage, overlap, q)) for r in range(world)]
    for p in procs:
        p.start()
    print(json.dumps(q.get(timeout=600)))
    for p in procs:
        p.join()
