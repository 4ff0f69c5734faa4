"""The shared experts of a MoE layer, as Megatron-Core's SharedExpertMLP runs them: a TP
MLP on the layer's normalized input (FC1, activation, FC2), and with
``moe_shared_expert_gate`` (Megatron --moe-shared-expert-gate; Qwen2-MoE's
shared_expert_gate) its output scaled by a per-token sigmoid gate of that input."""

from __future__ import annotations

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.graph import blocks, linears
from simumax.graph.dims import Dims
from simumax.graph.kernels import Gemm, MemBound
from simumax.graph.ops import Op, Tensor

# the module tags of the ops below: what the shared-expert / MoE recompute modules, the
# shared-expert overlap and the EP overlap's MLP phase take as one
SHARED_EXPERT_MODULES = frozenset({"shared_fc1", "shared_act", "shared_fc2", "shared_gate"})


def shared_expert_ops(P: str, layer: int, model: ModelConfig, st: StrategyConfig, d: Dims, ln_out: Tensor) -> list[Op]:
    h = d.h
    assert model.moe_shared_expert_intermediate_size
    ffn_s = model.moe_shared_expert_intermediate_size // d.tp
    s_n = 2 * ffn_s if model.use_swiglu else ffn_s
    s_fc1 = (f"{P}.shared_fc1.out", d.act(s_n))
    s_act = (f"{P}.shared_act.out", d.act(ffn_s))
    if model.use_swiglu:
        s_act_op = blocks.swiglu(f"{P}.shared_act", layer, d, s_fc1, ffn_s, fused=st.use_fused_swiglu)
    else:
        s_act_op = blocks.gelu(f"{P}.shared_act", layer, d, s_fc1, ffn_s)
    ops = [
        linears.column_linear(f"{P}.shared_fc1", "shared_fc1", layer, d, ln_out, h, s_n, bias=model.add_bias_linear,
                              keep_original=d.keeps_original_input).with_(output=s_fc1),
        s_act_op.with_(module="shared_act", output=s_act),
        linears.row_linear(f"{P}.shared_fc2", "shared_fc2", layer, d, s_act, ffn_s, h, bias=model.add_bias_linear),
    ]
    if model.moe_shared_expert_gate:
        ops.append(shared_gate(P, layer, d, ln_out))
    return ops


def shared_gate(P: str, layer: int, d: Dims, ln_out: Tensor) -> Op:
    """``out * sigmoid(x @ w.T)``, w of shape [1, h], on the layer's local tokens
    (``SharedExpertMLP.forward``). The logits are a GEMM with one output column (memory-bound:
    its roofline floor reads the input); the product reads and writes the shared output.
    Saved: the shared output and the sigmoid's [tokens, 1] output, each kept by the product
    (the input x is the shared FC1's, kept there). Backward: the product's two gradients
    (read the gradient and the kept output, write one; 4 passes), the input gradient's outer
    product (a GEMM with inner size 1) added by autograd to the input's other gradients (read
    both, write the sum: 3), and the weight gradient, a GEMM with one output row. w is one row
    per rank, the same on every TP rank (its gradient is reduced like a norm's)."""
    th = d.act(d.h, local=True)  # bytes of [local tokens, h]
    t = d.local_tokens
    return Op(
        name=f"{P}.shared_gate", module="shared_gate", layer=layer,
        fwd=(Gemm(t, d.h, 1, "TN"), MemBound(f"{P}.shared_gate.mul", 2 * th)),
        bwd_input=(MemBound(f"{P}.shared_gate.mul_bwd", 4 * th), Gemm(t, 1, d.h, "NN"), MemBound(f"{P}.shared_gate.input_grad", 3 * th)),
        bwd_weight=(Gemm(1, t, d.h, "NT"),),
        saved=((f"{P}.shared_gate.out", th), (f"{P}.shared_gate.score", d.act(1, local=True))), input=(ln_out,),
        params=d.h, tp_replicated_params=d.h,
    )
