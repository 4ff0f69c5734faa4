"""Activation offloading as an IR pass: Megatron-Core's fine-grained offloading
(``--fine-grained-activation-offloading --offload-modules ...``) and TransformerEngine's
layer offload (``--cpu-offloading-num-layers N``: TE's
``get_cpu_offload_context``, whose AsyncDoubleBufferGroupOffloadHandler offloads every
activation the first N layers save and reloads layer i while layer i + 1 runs backward).

The tensors the named modules save for backward are copied to pinned host memory on a
side stream while the layer's forward runs, and their GPU copies are freed; in backward
each layer's tensors are copied back one layer ahead (the next layer to run backward is
prefetched while the current one computes). A tensor another op of the layer also keeps
(attention's output is the projection's input) stays on the GPU: offloading one holder of
a tensor frees nothing. Checkpointed ops save nothing between the passes, so recompute
groups offload nothing.

One op per layer carries it, after the layer's ops: ``offloads`` names the tensors that
leave the GPU (the memory walk, memory/activation_walk.py, drops them at this op in
forward and brings them back here in backward, one layer early), and its kernels are the
copies: device-to-host bytes in forward, host-to-device in backward, over the system's
``host_link_gbps`` (PCIe Gen4/Gen5, NVLink-C2C), on the ``offload`` stream that
LayerProfiles hides under the layer's compute (exposed only where the copy is longer).
"""

from __future__ import annotations

from simumax.config.strategy import StrategyConfig
from simumax.graph.kernels import Collective
from simumax.graph.ops import Op, Tensor

MODULE = "act_offload"
GROUP = "offload"

# Megatron's module names -> the op modules of graph/dense_layer.py, mla.py, moe_layer.py
OFFLOAD_OPS = {
    "attn_norm": {"attn_norm"},
    "qkv_linear": {"qkv", "q_down", "kv_down"},
    "core_attn": {"core_attn"},
    "attn_proj": {"attn_proj"},
    "mlp_norm": {"mlp_norm"},
    "expert_fc1": {"expert_fc1"},
    "moe_act": {"moe_act"},
}


def offloaded_tensors(ops: list[Op], st: StrategyConfig, layer: int = -1) -> tuple[Tensor, ...]:
    """The layer's saved tensors that leave the GPU: kept only by offloaded, un-checkpointed
    ops. TE's layer offload (``cpu_offloading``) takes every op of the first
    ``cpu_offloading_num_layers`` layers."""
    every = st.cpu_offloading and 0 <= layer < st.cpu_offloading_num_layers
    modules = set().union(*(OFFLOAD_OPS[m] for m in st.offload_modules)) if st.fine_grained_activation_offloading else set()
    if not (modules or every):
        return ()
    moved: dict[str, float] = {}
    stay: set[str] = set()
    for o in ops:
        for name, nbytes in o.saved:
            if (every or o.module in modules) and not o.recompute_group:
                moved[name] = nbytes
            else:
                stay.add(name)
    return tuple((n, b) for n, b in moved.items() if n not in stay)


def offload_op(name: str, layer: int, ops: list[Op], st: StrategyConfig) -> Op | None:
    """The layer's offload op (None when nothing leaves the GPU)."""
    tensors = offloaded_tensors(ops, st, layer)
    if not tensors:
        return None
    nbytes = float(sum(b for _, b in tensors))
    copy = Collective("p2p", nbytes, GROUP)  # one copy over the host link, one direction
    return Op(name=f"{name}.offload", module=MODULE, layer=layer, fwd=(copy,), bwd_input=(copy,), offloads=tensors)


def with_offload(name: str, layer: int, ops: list[Op], st: StrategyConfig) -> list[Op]:
    """``ops`` followed by their offload op, if any."""
    op = offload_op(name, layer, ops, st)
    return ops if op is None else [*ops, op]
