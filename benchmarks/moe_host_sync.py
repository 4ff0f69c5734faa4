"""What the dropless all-to-all dispatcher's host wait costs per MoE layer (session 36).

megatron-core 0.19 ``MoEAlltoAllTokenDispatcher`` without padding to capacity copies the
tokens-per-expert counts to the host on a side stream (``_maybe_dtoh_and_synchronize``) and
waits for them (``d2h_event.synchronize()``) before the all-to-all (EP > 1) or before the
grouped GEMM (EP 1), which take them as Python lists. The host then has nothing queued: the
GPU idles until the host has launched the next kernels. Timed here as the difference
between a chain of layers that waits so and the same chain with the counts left on the GPU
(``torch._grouped_mm`` takes device offsets), forward only, CUDA events over 8 layers x
10 repetitions after 2 warm-ups (muon_step.timed).

Each layer: a stand-in for the attention block (QKV and output GEMMs), the router (GEMM,
softmax, top-k, the routing map and its per-expert sums), the permutation (argsort, gather),
the experts' gate-up and down grouped GEMMs with SwiGLU between, and the unpermutation
(weighted index_add). ``bare``: a chain of 8192^3 GEMMs with the same copy-and-wait after
each, against none (the wait's floor when large kernels follow it).
Prints one JSON object per configuration (docs/calibration.md, "The dropless host wait").
"""

from __future__ import annotations

import json

import torch

from muon_step import timed

CONFIGS = {
    # name: tokens, hidden, experts (local), top-k, expert FFN width
    "qwen3_30b_a3b": (4096, 2048, 128, 8, 768),
    "mixtral_8x7b": (4096, 4096, 8, 2, 14336),
    "deepseek_v3_ep8_rank": (4096, 7168, 32, 8, 2048),
}
LAYERS, REPS = 8, 10


class Waiter:
    """The dispatcher's copy on a side stream into pinned memory, and the host's wait."""

    def __init__(self, n: int) -> None:
        self.side = torch.cuda.Stream()
        self.host = torch.empty(n, dtype=torch.long, pin_memory=True)

    def __call__(self, counts: torch.Tensor) -> list[int]:
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            self.host.copy_(counts, non_blocking=True)
            ev = self.side.record_event()
        ev.synchronize()
        return self.host.tolist()


def grouped(a: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, w, offs=offs)


def moe_layer(x, wq, wo, wr, w1, w2, topk: int, wait: Waiter | None) -> torch.Tensor:
    t, h = x.shape
    e = wr.shape[1]
    a = x @ wq
    x = x + a[:, :h] @ wo
    probs = (x @ wr).float().softmax(-1)
    top_p, top_i = probs.topk(topk, dim=-1)
    routing_map = torch.zeros(t, e, dtype=torch.bool, device=x.device).scatter_(1, top_i, True)
    counts = routing_map.sum(0)
    if wait is not None:
        wait(counts)
    order = top_i.flatten().argsort(stable=True)
    rows = x.index_select(0, order // topk)
    offs = counts.cumsum(0).to(torch.int32)
    y = grouped(rows, w1, offs)
    f = y.shape[1] // 2
    y = torch.nn.functional.silu(y[:, :f]) * y[:, f:]
    z = grouped(y, w2, offs) * top_p.flatten()[order].unsqueeze(1).to(y.dtype)
    return x + torch.zeros_like(x).index_add_(0, order // topk, z)


def main() -> None:
    dev = torch.device("cuda")
    bf = torch.bfloat16
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}))
    with torch.no_grad():
        g = torch.randn(8192, 8192, device=dev, dtype=bf)
        w = Waiter(1)
        cnt = torch.ones(1, dtype=torch.long, device=dev)

        def bare(sync: bool) -> None:
            y = g
            for _ in range(LAYERS):
                y = (y @ g) * 1e-4
                if sync:
                    w(cnt)
        t0, t1 = timed(lambda: bare(False), REPS, 2), timed(lambda: bare(True), REPS, 2)
        print(json.dumps({"name": "bare_8192_gemm", "layer_s_nowait": t0 / LAYERS, "layer_s_wait": t1 / LAYERS,
                          "wait_cost_s": (t1 - t0) / LAYERS}), flush=True)
        for name, (t, h, e, k, f) in CONFIGS.items():
            x = torch.randn(t, h, device=dev, dtype=bf)
            wq, wo = torch.randn(h, 3 * h, device=dev, dtype=bf) * h ** -0.5, torch.randn(h, h, device=dev, dtype=bf) * h ** -0.5
            wr = torch.randn(h, e, device=dev, dtype=bf) * h ** -0.5
            w1 = torch.randn(e, h, 2 * f, device=dev, dtype=bf) * h ** -0.5
            w2 = torch.randn(e, f, h, device=dev, dtype=bf) * f ** -0.5
            wait = Waiter(e)

            def chain(sync: bool) -> None:
                y = x
                for _ in range(LAYERS):
                    y = moe_layer(y, wq, wo, wr, w1, w2, k, wait if sync else None) * 0.5
            t0, t1 = timed(lambda: chain(False), REPS, 2), timed(lambda: chain(True), REPS, 2)
            print(json.dumps({"name": name, "tokens": t, "hidden": h, "experts": e, "topk": k, "ffn": f,
                              "layer_s_nowait": t0 / LAYERS, "layer_s_wait": t1 / LAYERS,
                              "wait_cost_s": (t1 - t0) / LAYERS}), flush=True)
            del x, wq, wo, wr, w1, w2
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
