"""Time FLA's ``chunk_gated_delta_rule`` (the Gated DeltaNet scan megatron-core calls) forward
and backward on this GPU and print simumax's prediction of the same kernels beside it
(graph/gdn_layer.py: the products at the tables' efficiency plus each FLA kernel's HBM
traffic; docs/modeling.md, "Gated DeltaNet"). Shapes are Qwen3-Next's (Hv 32 value heads of
128, q / k repeated to them as megatron-core does) at 4K-32K tokens.

Needs flash-linear-attention's ``fla`` (pure Triton: ``pip install --no-deps fla_core-*.whl``
on a machine without network) and a CUDA GPU; ``--predict-only`` prints the prediction alone
(any machine). Writes ``$OUT/gdn_scan.json``.

    python benchmarks/gdn_scan.py [--system h100-sxm-80gb] [--predict-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from simumax.config.loader import load_model, load_strategy, load_system
from simumax.cost.efficiency import ComputeModel
from simumax.graph.dims import Dims
from simumax.graph.gdn_layer import gdn_ops
from simumax.graph.kernels import Gemm, MemBound

HEADS, DK, DV = 32, 128, 128  # Qwen3-Next's value heads and head dims (one TP rank at TP 1)
SHAPES = [(1, 4096), (2, 4096), (1, 8192), (1, 32768)]  # (micro-batch, tokens)


def predicted(system_name: str, b: int, t: int) -> tuple[float, float]:
    """(forward, backward) seconds simumax gives the scan op of one layer at this shape."""
    model = load_model("qwen3-next-80b-a3b").with_updates({"layer_num": 4})
    st = load_strategy("ep8_pp1_dp8_mbs1").with_updates({"seq_len": t, "micro_batch_size": b})
    d = Dims.of(model, st)
    scan = next(o for o in gdn_ops(model, st, d, 0, ("L0.x", d.act(model.hidden_size, local=True)))
                if o.module == "gdn_scan")
    cm = ComputeModel(load_system(system_name))

    def seconds(kernels) -> float:
        return sum(cm.compute(k)[0] if isinstance(k, Gemm) else cm.membound(k) for k in kernels
                   if isinstance(k, (Gemm, MemBound)))

    return seconds(scan.fwd), seconds(scan.bwd_input)


def measured(b: int, t: int, repeats: int = 20) -> tuple[float, float]:
    """(forward, backward) seconds of FLA's kernel on this GPU: median over ``repeats``, each
    between CUDA events after three warm-up calls."""
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    q = torch.randn(b, t, HEADS, DK, device=dev, dtype=bf16, requires_grad=True)
    k = torch.nn.functional.normalize(torch.randn(b, t, HEADS, DK, device=dev, dtype=torch.float32), dim=-1)
    k = k.to(bf16).requires_grad_()
    v = torch.randn(b, t, HEADS, DV, device=dev, dtype=bf16, requires_grad=True)
    g = (-torch.rand(b, t, HEADS, device=dev, dtype=torch.float32)).requires_grad_()  # log decays
    beta = torch.rand(b, t, HEADS, device=dev, dtype=bf16).requires_grad_()
    do = torch.randn(b, t, HEADS, DV, device=dev, dtype=bf16)

    def fwd():
        return chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
                                      use_qk_l2norm_in_kernel=False)[0]

    for _ in range(3):
        fwd().backward(do)
    f_times, b_times = [], []
    for _ in range(repeats):
        s, m, e = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        s.record()
        o = fwd()
        m.record()
        o.backward(do)
        e.record()
        torch.cuda.synchronize()
        f_times.append(s.elapsed_time(m) * 1e-3)
        b_times.append(m.elapsed_time(e) * 1e-3)
    return statistics.median(f_times), statistics.median(b_times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", default="h100-sxm-80gb", help="system preset or JSON the prediction uses")
    ap.add_argument("--predict-only", action="store_true", help="print the prediction alone (no GPU, no fla)")
    args = ap.parse_args()
    rows = []
    for b, t in SHAPES:
        pf, pb = predicted(args.system, b, t)
        row = {"micro_batch": b, "tokens": t, "heads": HEADS, "dk": DK, "dv": DV, "predicted_fwd": pf, "predicted_bwd": pb}
        if not args.predict_only:
            mf, mb = measured(b, t)
            row.update(measured_fwd=mf, measured_bwd=mb, error_fwd=pf / mf - 1, error_bwd=pb / mb - 1)
        rows.append(row)
        line = f"b={b} t={t:6d}: predicted fwd {pf * 1e3:7.3f} ms bwd {pb * 1e3:7.3f} ms"
        if "measured_fwd" in row:
            line += (f" | measured fwd {row['measured_fwd'] * 1e3:7.3f} ms bwd {row['measured_bwd'] * 1e3:7.3f} ms"
                     f" | error {row['error_fwd']:+.1%} / {row['error_bwd']:+.1%}")
        print(line)
    out_dir = os.environ.get("OUT", "out/device")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gdn_scan.json"), "w") as fh:
        json.dump({"system": args.system, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
