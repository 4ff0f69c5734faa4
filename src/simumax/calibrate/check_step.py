"""Train a Llama-style model for real on one device and compare with the prediction.

The model is built from a simumax ModelConfig (dense, MHA/GQA, RoPE, RMSNorm or
LayerNorm, SwiGLU or GeLU, Megatron's padded vocabulary, tied or untied output layer)
in plain PyTorch, and trained the way Megatron-LM trains with one GPU and no distributed
optimizer: bf16 parameters, fp32 main gradients (Megatron's DDP buffer) into which the
linear layers' weight-gradient GEMMs accumulate directly (gradient-accumulation fusion;
other parameters through a hook), fp32 master weights and Adam states, the step as
Megatron's (DDP's nan check over the main grads, the gradient-norm clip at 1.0, Adam, the
master copy written back to bf16; the nan check and clip since 2026-11-27). Attention is
``scaled_dot_product_attention`` (flash on GPUs), the loss Megatron's unfused cross-entropy
(``megatron_loss``), the SwiGLU unfused.

The matching simumax strategy (``single_device_strategy``) says exactly that: world 1,
ZeRO-0, fp32 gradient accumulation, flash attention, fused norm, unfused SwiGLU and loss.
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from simumax.calibrate.fp8_linear import Fp8Linear, Fp8Quantizer
from simumax.calibrate.megatron_loss import megatron_cross_entropy
from simumax.calibrate.nvml import open_device, reading
from simumax.calibrate.nvml import summary as clock_summary
from simumax.calibrate.timing import accumulate_fp32_, synchronize
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.errors import ConfigError

log = logging.getLogger(__name__)


def single_device_strategy(seq_len: int, mbs: int, mbc: int, wgrad_fused: bool = True,
                           fp8_recipe: str | None = None) -> StrategyConfig:
    """``wgrad_fused``: whether the weight gradients went into the fp32 main grads in one GEMM
    (``timing.accumulate_fp32_``; where torch lacks it they are added, as Megatron without
    gradient-accumulation fusion). ``fp8_recipe``: the layers' linears ran TE's fp8 kernels
    (``fp8_linear``), whose weight gradients torch cannot accumulate in the GEMM."""
    fp8 = {"fp8": True, "fp8_recipe": fp8_recipe, "gradient_accumulation_fusion": False} if fp8_recipe else {}
    return StrategyConfig.init_from_dict({
        "seq_len": seq_len, "micro_batch_size": mbs, "micro_batch_num": mbc, "dtype": "bf16", "world_size": 1,
        "tp_size": 1, "pp_size": 1, "zero_state": 0, "use_fp32_accum_grad": True, "use_flash_sdp": True,
        "use_math_sdp": False, "use_fused_norm": True, "use_fused_swiglu": False, "cross_entropy_loss_fusion": False,
        "enable_dropout": False, "enable_recompute": False, "gradient_accumulation_fusion": wgrad_fused, **fp8,
    })


@torch.compiler.disable  # eager always (an in-place fp32 out= GEMM does not trace), also under --compile
def _accumulate_wgrad(main_grad: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> None:
    """main_grad[n, k] += dy^T @ x (Megatron's gradient-accumulation fusion where torch offers it)."""
    accumulate_fp32_(main_grad, dy.t(), x)


class _LinearFn(torch.autograd.Function):
    """y = x W^T whose weight gradient goes straight into ``W.main_grad`` (fp32), as
    Megatron's linears do with gradient_accumulation_fusion (``fused``; else written in bf16
    and added, as without it); ``W.grad`` stays None."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, fused: bool) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.fused = fused
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        dx = dy @ weight
        dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
        if ctx.fused:
            _accumulate_wgrad(weight.main_grad, dy2, x2)
        else:
            weight.main_grad.add_(dy2.t() @ x2)
        return dx, None, None


class _Linear(nn.Linear):
    fuse_wgrad = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self.weight, "main_grad"):
            return super().forward(x)
        y = _LinearFn.apply(x, self.weight, self.fuse_wgrad)
        return y + self.bias if self.bias is not None else y


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
        self.qkv = _Linear(h, (self.heads + 2 * self.kv) * d, bias=bias)
        self.proj = _Linear(self.heads * d, h, bias=bias)
        self.swiglu = m.use_swiglu
        self.fc1 = _Linear(h, m.intermediate_size * (2 if m.use_swiglu else 1), bias=bias)
        self.fc2 = _Linear(m.intermediate_size, h, bias=bias)
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
        if m.model_type != "dense" or m.attention_type != "mha" or m.hybrid_layer_pattern is not None \
                or m.has_linear_attention:
            raise ConfigError("model", "check-step builds dense MHA/GQA transformer models only")
        self.vocab = m.padded_vocab(1)
        self.embed = nn.Embedding(self.vocab, m.hidden_size)
        self.pos = nn.Embedding(m.max_position_embeddings or 4096, m.hidden_size) if m.position_embedding_type == "learned_absolute" else None
        self.layers = nn.ModuleList(_Layer(m) for _ in range(m.layer_num))
        self.norm = _Norm(m.hidden_size, m.norm_type)
        self.head = None if not m.untie_embeddings_and_output_weights else _Linear(m.hidden_size, self.vocab, bias=False)
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
        x = self.norm(x)
        logits = F.linear(x, self.embed.weight) if self.head is None else self.head(x)
        return megatron_cross_entropy(logits.view(-1, self.vocab), labels.reshape(-1)).mean()


def use_fp8(net: LlamaStyle, recipe: str, fused: bool) -> list[Fp8Linear]:
    """The layers' four linears as TE's fp8 linears (``fp8_linear``); the output layer stays
    bf16 as in Megatron (not a TE module), its weight gradient written and added like theirs."""
    quantizer = Fp8Quantizer(recipe, fused)
    out = []
    for layer in net.layers:
        for name in ("qkv", "proj", "fc1", "fc2"):
            lin = Fp8Linear(getattr(layer, name), quantizer)
            setattr(layer, name, lin)
            out.append(lin)
    if net.head is not None:
        net.head.fuse_wgrad = False
    return out


@dataclass
class StepMeasurement:
    device: str
    step_seconds: float  # median over the timed steps
    step_seconds_all: list[float]
    max_allocated: int | None  # torch.cuda.max_memory_allocated over the run (bytes); None on CPU
    params: int
    loss_first: float
    loss_last: float
    phase_seconds: dict[str, float]  # median fwd / bwd (all micro-batches) / optimizer time per step
    model_state_bytes: int | None  # allocated at the start of the last step: weights, grads, optimizer
    saved_activation_bytes: int  # one micro-batch's tensors saved for backward (unique storages, no parameters)
    kernels: list[dict[str, object]]  # with profile: {name, count, seconds} per kernel name, slowest first
    # NVML over the timed steps (None without it): median SM clock (MHz) and board power (W),
    # share of readings under the power cap (docs/calibration.md, "Power-limited clocks")
    clocks: dict[str, float] | None = None
    # one micro-batch's forward and backward issued while the GPU is busy with queued work
    # (host_issue_time): host seconds and CUDA kernels launched; None on CPU
    host_issue_seconds: float | None = None
    host_issue_launches: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def saved_bytes(net: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, fp8: list[Fp8Linear] = ()) -> int:
    """Bytes autograd keeps from one forward for backward: unique storages, parameters
    excluded (what simumax calls the activation cache of a micro-batch), and so are the fp8
    linears' weight copies, which live from step to step (model states in simumax)."""
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    kept: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> None:
        # hold the storage, not the tensor: a freed storage's address could be reused
        # (and counted once for two tensors), while holding the tensor would tie saved
        # outputs to their own graph in a reference cycle that outlives this forward
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            kept[st.data_ptr()] = st

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda _: None):
        loss = net(tokens, labels)
    del loss
    for lin in fp8:
        for t in lin.weight_fp8():
            kept.pop(t.untyped_storage().data_ptr(), None)
    total = sum(st.nbytes() for st in kept.values())
    kept.clear()
    return total


def train_steps(model_cfg: ModelConfig, seq_len: int, mbs: int, mbc: int, steps: int, warmup: int,
                device: torch.device, seed: int = 0, profile: bool = False, compile: bool = False,
                fp8_recipe: str | None = None, sync_phases: bool = False) -> StepMeasurement:
    """Build, then time ``steps`` optimizer steps after ``warmup`` untimed ones; with
    ``profile``, one more step under the torch profiler (device time per kernel name).
    ``compile``: each transformer layer through torch.compile, which fuses the element-wise
    chains (RoPE, SwiGLU, residual adds, casts) much as TransformerEngine's kernels do;
    the saved-activation count is then not taken (hooks do not see compiled graphs).
    ``fp8_recipe``: the layers' linears run TE's fp8 kernels (``use_fp8``; on a GPU their
    casts are TE-like fused kernels, compiled or not)."""
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with torch.device(device):
        net = LlamaStyle(model_cfg).to(torch.bfloat16)
    fp8 = use_fp8(net, fp8_recipe, fused=device.type == "cuda") if fp8_recipe else []
    params = [p for p in net.parameters()]
    for p in params:  # Megatron's DDP: grads accumulate into an fp32 main_grad buffer
        p.main_grad = torch.zeros_like(p, dtype=torch.float32)

        def hook(t: torch.Tensor) -> None:
            if t.grad is not None:  # None for the linears, which accumulate themselves
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
    saved = saved_bytes(net, data[0, :, :-1], data[0, :, 1:], fp8) if not compile else 0
    if compile:
        for layer in net.layers:
            layer.compile()

    cuda = device.type == "cuda"
    nan_grads: list[torch.Tensor] = []  # read once, after the run

    def one_step() -> tuple[float, float, float, float]:
        """(fwd, bwd, optimizer seconds, loss) of one optimizer step. On a GPU the phases are
        split by CUDA events and the host waits once, at the end (a Megatron step waits on
        the host about once too: the optimizer's inf check or gradient norm): a host wait
        after each phase idles the GPU while the next phase's first kernels are launched,
        time a training step does not lose. ``sync_phases``: wait after each phase anyway
        (how check-step timed before)."""
        marks: list[tuple[str, object, object]] = []

        def mark(phase: str, start: object) -> object:
            if sync_phases or not cuda:
                synchronize(device)
                now = time.perf_counter()
            else:
                now = torch.cuda.Event(enable_timing=True)
                now.record()
            if start is not None:
                marks.append((phase, start, now))
            return now

        for p in params:
            p.main_grad.zero_()
        for lin in fp8:  # weights cast again after the optimizer changed them
            lin.new_step()
        total = 0.0
        t = mark("", None)
        for mb in range(mbc):
            loss = net(data[mb, :, :-1], data[mb, :, 1:]) / mbc
            t = mark("fwd", t)
            loss.backward()
            total += loss.detach()
            t = mark("bwd", t)
        with torch.no_grad():
            # Megatron's step before Adam: DDP's nan check (a norm over the main grads, kept on
            # the device here) and the gradient-norm clip (norm, then scale; --clip-grad 1.0)
            grads = [p.main_grad for p in params]
            nan_grads.append(torch.stack(torch._foreach_norm(grads)).isnan().any())
            torch.nn.utils.clip_grad_norm_(master, 1.0, foreach=True)
        opt.step()
        with torch.no_grad():
            for mp, p in zip(master, params):
                p.copy_(mp)
        mark("optimizer", t)
        synchronize(device)
        split = {"fwd": 0.0, "bwd": 0.0, "optimizer": 0.0}
        for phase, a, b in marks:
            split[phase] += (b - a) if isinstance(a, float) else a.elapsed_time(b) * 1e-3
        return split["fwd"], split["bwd"], split["optimizer"], float(total)

    losses, times = [], []
    parts: dict[str, list[float]] = {"fwd": [], "bwd": [], "optimizer": []}
    nv, handle = open_device() if device.type == "cuda" else (None, None)
    readings = []
    states = 0
    for it in range(warmup + steps):
        synchronize(device)
        if device.type == "cuda":
            states = torch.cuda.memory_allocated(device)  # weights, grads, master + Adam (after step 1)
        t0 = time.perf_counter()
        fwd, bwd, optim, loss = one_step()
        if it >= warmup:
            times.append(time.perf_counter() - t0)
            readings.append(reading(nv, handle))
            for k, v in (("fwd", fwd), ("bwd", bwd), ("optimizer", optim)):
                parts[k].append(v)
        losses.append(loss)
    kernels = profile_step(one_step, device) if profile else []
    if bool(torch.stack(nan_grads).any()):
        log.warning("check-step: NaN in the gradients of a step; its times are of a diverged run")
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    issue = host_issue_time(net, data[0, :, :-1], data[0, :, 1:], device) if cuda else (None, None)  # after the peak
    n = sum(p.numel() for p in params)
    # the model and optimizer die with this frame; the next run empties the cache first
    return StepMeasurement(str(device), statistics.median(times), times, peak, n, losses[0], losses[-1],
                           {k: statistics.median(v) for k, v in parts.items()}, states or None, saved, kernels,
                           clock_summary(readings), *issue)


def host_issue_time(net: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, device: torch.device,
                    reps: int = 3, busy: int = 8192) -> tuple[float, int]:
    """(host seconds, CUDA kernels) to issue one micro-batch's forward and backward while the
    GPU runs work queued before it, so the host never waits (benchmarks/host_time.py's
    method): what ``system.host_op_us`` per launch stands for (StageCost.host_issue).
    Median over ``reps``; the gradients it adds are zeroed by the next step."""
    from torch.profiler import ProfilerActivity, profile

    big = torch.randn(busy, busy, device=device, dtype=torch.bfloat16)
    seconds = []
    for _ in range(reps):
        synchronize(device)
        for _ in range(40):  # ~50 ms of 8192^3 GEMMs on an H100, more than the host needs below
            big @ big
        t0 = time.perf_counter()
        net(tokens, labels).backward()
        seconds.append(time.perf_counter() - t0)
        synchronize(device)
    if device.type != "cuda":  # no kernels to count
        return statistics.median(seconds), 0
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        net(tokens, labels).backward()
        synchronize(device)
    launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return statistics.median(seconds), launches


def profile_step(step, device: torch.device, top: int = 400) -> list[dict[str, object]]:
    """Device time per kernel name over one step (host time on CPU)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts, record_shapes=True) as prof:
        step()
    from torch.autograd import DeviceType

    rows = []
    for e in prof.key_averages():
        if device.type == "cuda":  # kernels only: an operator's (or a GPU-side annotation
            # such as Optimizer.step's) device time repeats its kernels'
            if e.device_type != DeviceType.CUDA or getattr(e, "is_user_annotation", False) or e.key.startswith("Optimizer."):
                continue
            t = e.device_time_total
        else:
            t = e.self_cpu_time_total
        if t > 0:
            rows.append({"name": e.key[:120], "count": e.count, "seconds": t * 1e-6})
    rows.sort(key=lambda r: -r["seconds"])
    # GEMM operators by input shape, so in-training GEMM times can be set beside the
    # isolated calibration of the same shapes (device time of the operator's kernels)
    gemms = [{"name": e.key, "shapes": [list(x) for x in e.input_shapes if x], "count": e.count,
              "seconds": (e.device_time_total if device.type == "cuda" else e.cpu_time_total) * 1e-6}
             for e in prof.key_averages(group_by_input_shape=True) if e.key in ("aten::mm", "aten::addmm", "aten::bmm")]
    gemms.sort(key=lambda r: -r["seconds"])
    return rows[:top] + [{**g, "name": f"shape:{g['name']}"} for g in gemms]
