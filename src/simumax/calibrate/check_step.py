"""Train a Llama-style model for real on one device and compare with the prediction.

The model is built from a simumax ModelConfig (dense, MHA/GQA, RoPE, RMSNorm or
LayerNorm, SwiGLU or GeLU, Megatron's padded vocabulary, tied or untied output layer)
in plain PyTorch, and trained the way Megatron-LM trains with one GPU and no distributed
optimizer: bf16 parameters, fp32 main gradients accumulated by a hook after each
backward (Megatron's DDP buffer), fp32 master weights and Adam states, the master copy
written back to bf16 after the step. Attention is ``scaled_dot_product_attention``
(flash on GPUs), the loss an fp32 cross-entropy over the logits, the SwiGLU unfused.

The matching simumax strategy (``single_device_strategy``) says exactly that: world 1,
ZeRO-0, fp32 gradient accumulation, flash attention, fused norm, unfused SwiGLU and loss.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from simumax.calibrate.timing import synchronize
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError


def single_device_strategy(seq_len: int, mbs: int, mbc: int) -> StrategyConfig:
    return StrategyConfig.init_from_dict({
        "seq_len": seq_len, "micro_batch_size": mbs, "micro_batch_num": mbc, "dtype": "bf16", "world_size": 1,
        "tp_size": 1, "pp_size": 1, "zero_state": 0, "use_fp32_accum_grad": True, "use_flash_sdp": True,
        "use_math_sdp": False, "use_fused_norm": True, "use_fused_swiglu": False, "cross_entropy_loss_fusion": False,
        "enable_dropout": False, "enable_recompute": False,
    })


class _Norm(nn.Module):
    def __init__(self, h: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(h))
        self.bias = nn.Parameter(torch.zeros(h)) if kind == "layernorm" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias)
        return F.rms_norm(x, x.shape[-1:], self.weight)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class _Layer(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        h, d = m.hidden_size, m.head_size or m.hidden_size // m.head_num
        self.heads, self.kv, self.d = m.head_num, m.kv_head_num or m.head_num, d
        bias = m.add_bias_linear
        self.norm1, self.norm2 = _Norm(h, m.norm_type), _Norm(h, m.norm_type)
        self.qkv = nn.Linear(h, (self.heads + 2 * self.kv) * d, bias=bias)
        self.proj = nn.Linear(self.heads * d, h, bias=bias)
        self.swiglu = m.use_swiglu
        self.fc1 = nn.Linear(h, m.intermediate_size * (2 if m.use_swiglu else 1), bias=bias)
        self.fc2 = nn.Linear(m.intermediate_size, h, bias=bias)
        self.rope = m.position_embedding_type == "rope"

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(self.norm1(x))
        q, k, v = qkv.split([self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.kv, self.d).transpose(1, 2)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2)
        if self.rope:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.heads)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, self.heads * self.d))
        y = self.fc1(self.norm2(x))
        if self.swiglu:
            g, u = y.chunk(2, dim=-1)
            y = F.silu(g) * u
        else:
            y = F.gelu(y)
        return x + self.fc2(y)


class LlamaStyle(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        if m.model_type != "dense" or m.attention_type != "mha":
            raise ConfigError("model", "check-step builds dense MHA/GQA models only")
        self.vocab = m.padded_vocab(1)
        self.embed = nn.Embedding(self.vocab, m.hidden_size)
        self.pos = nn.Embedding(m.max_position_embeddings or 4096, m.hidden_size) if m.position_embedding_type == "learned_absolute" else None
        self.layers = nn.ModuleList(_Layer(m) for _ in range(m.layer_num))
        self.norm = _Norm(m.hidden_size, m.norm_type)
        self.head = None if not m.untie_embeddings_and_output_weights else nn.Linear(m.hidden_size, self.vocab, bias=False)
        self.d = m.head_size or m.hidden_size // m.head_num

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(s, device=tokens.device))
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2, device=tokens.device, dtype=torch.float32) / self.d))
        ang = torch.outer(torch.arange(s, device=tokens.device, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        w = self.embed.weight if self.head is None else self.head.weight
        logits = F.linear(self.norm(x), w)
        return F.cross_entropy(logits.float().view(-1, self.vocab), labels.reshape(-1))


@dataclass
class StepMeasurement:
    device: str
    step_seconds: float  # median over the timed steps
    step_seconds_all: list[float]
    max_allocated: int | None  # torch.cuda.max_memory_allocated over the run (bytes); None on CPU
    params: int
    loss_first: float
    loss_last: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def train_steps(model_cfg: ModelConfig, seq_len: int, mbs: int, mbc: int, steps: int, warmup: int,
                device: torch.device, seed: int = 0) -> StepMeasurement:
    """Build, then time ``steps`` optimizer steps after ``warmup`` untimed ones."""
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with torch.device(device):
        net = LlamaStyle(model_cfg).to(torch.bfloat16)
    params = [p for p in net.parameters()]
    for p in params:  # Megatron's DDP: grads accumulate into an fp32 main_grad buffer
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)

        def hook(t: torch.Tensor) -> None:
            t.main_grad.add_(t.grad)
            t.grad = None

        p.register_post_accumulate_grad_hook(hook)
    master = [p.detach().float().requires_grad_(True) for p in params]
    for mp, p in zip(master, params):
        mp.grad = p.main_grad
    opt = torch.optim.Adam(master, lr=1e-4, fused=device.type == "cuda")
    vocab = net.vocab
    gen = torch.Generator(device=device).manual_seed(seed)
    data = torch.randint(0, vocab, (mbc, mbs, seq_len + 1), device=device, generator=gen)
    losses, times = [], []
    for it in range(warmup + steps):
        synchronize(device)
        t0 = time.perf_counter()
        for p in params:
            p.main_grad.zero_()
        total = 0.0
        for mb in range(mbc):
            loss = net(data[mb, :, :-1], data[mb, :, 1:]) / mbc
            loss.backward()
            total += loss.detach()
        opt.step()
        with torch.no_grad():
            for mp, p in zip(master, params):
                p.copy_(mp)
        synchronize(device)
        if it >= warmup:
            times.append(time.perf_counter() - t0)
        losses.append(float(total))
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    n = sum(p.numel() for p in params)
    del net, opt, master, params, data
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return StepMeasurement(str(device), statistics.median(times), times, peak, n, losses[0], losses[-1])


def relative_error(pred: float, real: float) -> float:
    return (pred - real) / real if real else math.nan
