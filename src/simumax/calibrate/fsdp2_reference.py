"""PyTorch FSDP2 itself, wrapped as torchtitan wraps a Llama (or as Megatron-LM's
``--use-torch-fsdp2`` wraps its bf16 model, ``_wrap_like_megatron``), run on fake tensors:
what its sharded-data-parallel state holds at the step's peak and which collectives it
issues, to check ``fsdp_impl: torch_fsdp2`` (``megatron_torch_fsdp2``) against the
implementation rather than a hand count.

The model is check-step's plain-PyTorch Llama (``check_step.LlamaStyle``) built under
``FakeTensorMode`` (no memory is allocated, so an 8B model runs on a laptop), sharded over
a fake process group of ``world_size`` ranks with torch's ``fully_shard`` the way
torchtitan 0.3's ``distributed/fsdp.py::apply_fsdp_to_decoder`` does it: the embedding, each
block and (the final norm, the output layer) as units with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, the reshard-after-forward
policy per unit as ``get_fsdp_reshard_after_forward_policy``, a tied output layer sharded
with the embedding (its final norm, a few KiB, with the root), then the root; HSDP on
torchtitan's (replicate, shard) mesh. One step (``mbc`` forward-backward passes after the
step that creates the AdamW states) runs under torch's ``FSDPMemTracker``, which files every
live tensor under FSDP's categories in host order, and a dispatch mode that records the
bytes of every c10d all-gather (its gathered output), reduce-scatter (its full input) and
all-reduce.

The activations it reports are CPU kernels' (fake tensors dispatch to CPU attention and
loss kernels), not a GPU's: compare the state categories, not the activation bytes.
FSDP2's hooks leave reference cycles and a process group behind: run it in a process of
its own (``python -m simumax.calibrate.fsdp2_reference``, below).
"""

from __future__ import annotations

import json
import sys
from typing import Literal

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from simumax.calibrate.check_step import LlamaStyle
from simumax.config.model import ModelConfig

STATE_CATEGORIES = ("Sharded Param", "Unsharded Param", "All Gather", "Sharded Grad", "Unsharded Grad",
                    "Reduce Scatter", "OptState")


class _NormAndOutput(nn.Module):
    """The final norm and the output layer as one module: torchtitan's ``fully_shard([norm,
    output])`` unit, made one module because FSDPMemTracker instruments each module of a
    multi-module unit as a unit of its own (it re-gathers and reduces them apart)."""

    def __init__(self, norm: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


def _wrap_like_torchtitan(net: LlamaStyle, mesh: object, policy: str) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
    reshard = policy != "never"  # pp_enabled False: one rank holds every layer here
    cfg = {"mesh": mesh, "mp_policy": mp}
    if net.head is None:  # tied: the embedding unit holds the output layer (its final norm stays with the root)
        if policy == "always":  # the tied output GEMM reads the weight outside the unit's forward here
            raise ValueError("a tied output layer resharded after forward is not built by this model")
        fully_shard(net.embed, **cfg, reshard_after_forward=False)
    else:
        fully_shard(net.embed, **cfg, reshard_after_forward=reshard)
        net.norm, net.head = _NormAndOutput(net.norm, net.head), nn.Identity()  # logits = head(norm(x)), as before
        fully_shard(net.norm, **cfg, reshard_after_forward=policy == "always")
    for layer in net.layers:
        fully_shard(layer, **cfg, reshard_after_forward=reshard)
    fully_shard(net, **cfg)


def _wrap_like_megatron(net: LlamaStyle, mesh: object, policy: str) -> None:
    """Megatron-LM's ``TorchFullyShardedDataParallel`` (megatron/core/distributed/
    torch_fully_sharded_data_parallel.py): ``fully_shard`` with no mixed-precision policy over
    the bf16 model on the embedding, each TransformerLayer and the output layer
    (ColumnParallelLinear), then the root (the final norm); every unit resharded after
    forward unless ``--torch-fsdp2-no-reshard-after-forward`` ("never")."""
    from torch.distributed.fsdp import fully_shard

    if net.head is None:
        raise ValueError("Megatron's --use-torch-fsdp2 needs untied embeddings")
    cfg = {"mesh": mesh, "reshard_after_forward": policy != "never"}
    fully_shard(net.embed, **cfg)
    for layer in net.layers:
        fully_shard(layer, **cfg)
    fully_shard(net.head, **cfg)
    fully_shard(net, **cfg)


class _Float16Optimizer:
    """Megatron's Float16OptimizerWithFloat16Params over the bf16 shards (optimizer.py): an
    fp32 master of each shard, Adam on the masters; the step copies each gradient to fp32
    and frees it (``_copy_model_grads_to_main_grads``), steps, copies the masters back and
    drops the fp32 gradients (``zero_grad``). The masters are filed with the Adam states
    (FSDPMemTracker's categories have none for them)."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.params = params
        self.masters = [p.detach().clone().float() for p in params]
        self.adam = torch.optim.Adam(self.masters, lr=1e-4, foreach=False)  # states only: no foreach temporaries

    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            if p.grad is not None:
                m.grad, p.grad = p.grad.float(), None
        self.adam.step()
        for p, m in zip(self.params, self.masters):
            p.detach().copy_(m)
            m.grad = None
        for m in self.masters:
            self.adam.state[m]["master"] = m


class _Collectives(TorchDispatchMode):
    """Bytes per c10d collective kind, as ``graph.kernels.Collective`` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0, "copy_out": 0, "copy_in": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func)
        if "_allgather_base_" in name:  # (output, input, ...)
            self.bytes["all_gather"] += args[0].numel() * args[0].element_size()
        elif "_reduce_scatter_base_" in name:  # (output, input, ...)
            self.bytes["reduce_scatter"] += args[1].numel() * args[1].element_size()
        elif "allreduce_" in name:  # ([tensors], ...): HSDP's across replicas
            self.bytes["all_reduce"] += sum(t.numel() * t.element_size() for t in args[0])
        elif "split_with_sizes_copy" in name:  # the gathered buffer copied out into the parameters
            out = (kwargs or {}).get("out") or args[-1]
            self.bytes["copy_out"] += sum(t.numel() * t.element_size() for t in out)
        elif "chunk_cat" in name and "fsdp" in name:  # the gradients copied into the reduce-scatter input
            out = (kwargs or {}).get("out")
            out = out if out is not None else args[-1]
            self.bytes["copy_in"] += out.numel() * out.element_size()
        return func(*args, **(kwargs or {}))


def track_fsdp2_step(model: ModelConfig, world_size: int, seq_len: int, mbs: int = 1, mbc: int = 1,
                     reshard: Literal["default", "always", "never"] = "default", replicate: int = 1,
                     full_ac: bool = False, impl: str = "torch_fsdp2") -> dict[str, int]:
    """Bytes per FSDPMemTracker category (``STATE_CATEGORIES``, "Activation", "Temp",
    "Inputs", "Total") at the peak of one training step on rank 0 of ``world_size``, and
    the step's collective bytes ("all_gather", "reduce_scatter", "all_reduce"). ``replicate``
    > 1: HSDP, torchtitan's 2-D mesh (replicate, shard); ``full_ac``: each block wrapped in
    ``checkpoint_wrapper`` before sharding (torchtitan's ``FullAC``). ``impl``
    "megatron_torch_fsdp2": the bf16 model wrapped as Megatron wraps it, with its
    Float16Optimizer, whose step is tracked too (fp32 gradient copies beside the masters)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        mesh = (init_device_mesh("cpu", (world_size,)) if replicate == 1 else
                init_device_mesh("cpu", (replicate, world_size // replicate), mesh_dim_names=("dp_replicate", "dp_shard")))
        megatron = impl == "megatron_torch_fsdp2"
        with FakeTensorMode():
            if megatron:  # Megatron's Float16Module: the model itself in bf16
                default = torch.get_default_dtype()
                torch.set_default_dtype(torch.bfloat16)
                try:
                    net = LlamaStyle(model)
                finally:
                    torch.set_default_dtype(default)
            else:
                net = LlamaStyle(model)
            if full_ac:
                net.layers = nn.ModuleList(checkpoint_wrapper(layer, preserve_rng_state=False) for layer in net.layers)
            if megatron:
                _wrap_like_megatron(net, mesh, reshard)
                f16 = _Float16Optimizer(list(net.parameters()))
                opt, step = f16.adam, f16.step
            else:
                _wrap_like_torchtitan(net, mesh, reshard)
                opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=False)  # states only: no foreach temporaries

                def step() -> None:
                    opt.step()
                    opt.zero_grad()  # set_to_none, as torchtitan's step starts
            tokens = torch.randint(0, net.vocab, (mbs, seq_len))
            labels = torch.randint(0, net.vocab, (mbs, seq_len))
            net(tokens, labels).backward()  # a first step creates the optimizer states
            step()
            tracker = FSDPMemTracker(net, opt)
            tracker.track_inputs((tokens, labels))
            comms = _Collectives()
            with tracker, comms:
                for _ in range(mbc):  # gradient accumulation: each backward reduce-scatters (no no_sync)
                    tracker.reset_mod_stats()  # per-module stats only (the peak is kept): one forward each
                    net(tokens, labels).backward()
                if megatron:  # its step copies the gradients to fp32: it can hold the peak
                    step()
            snapshot = tracker.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = getattr(key, "value", key)
            out[str(name)] = out.get(str(name), 0) + int(value)
    return {**out, **comms.bytes}



def main() -> None:
    """``python -m simumax.calibrate.fsdp2_reference`` reads a JSON list of runs on stdin —
    ``{"model": {ModelConfig fields}, "world_size", "seq_len", "mbs", "mbc", "reshard", "replicate", "full_ac",
    "impl"}`` —
    and writes the list of their category and collective bytes (``track_fsdp2_step``) to
    stdout."""
    out = []
    for run in json.load(sys.stdin):
        model = ModelConfig.init_from_dict(run["model"])
        out.append(track_fsdp2_step(model, run["world_size"], run["seq_len"], run.get("mbs", 1), run.get("mbc", 1),
                                    run.get("reshard", "default"), run.get("replicate", 1), run.get("full_ac", False),
                                    run.get("impl", "torch_fsdp2")))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
