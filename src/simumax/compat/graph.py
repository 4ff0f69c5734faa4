"""The op graph of a pipeline stage as Graphviz DOT (SimuMax's ``SimuONNXGraphBuilder`` and
``visualize_with_graphviz``): one node per op with its forward FLOPs, bytes and time, an edge
wherever one op's output is another's input (the IR's tensor names), else to the next op."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simumax.errors import ConfigError
from simumax.graph.ops import Stage


@dataclass
class OpGraph:
    name: str
    nodes: list[tuple[str, str]] = field(default_factory=list)  # (op name, label)
    edges: list[tuple[str, str, str]] = field(default_factory=list)  # (from, to, tensor)

    def to_dot(self) -> str:
        q = lambda s: '"' + s.replace('"', r"\"") + '"'  # noqa: E731
        lines = [f"digraph {q(self.name)} {{", "  rankdir=TB;", "  node [shape=box, fontsize=10];"]
        lines += [f"  {q(n)} [label={q(label)}];" for n, label in self.nodes]
        lines += [f"  {q(a)} -> {q(b)}" + (f" [label={q(t)}, fontsize=8]" if t else "") + ";" for a, b, t in self.edges]
        return "\n".join(lines) + "\n}\n"


class SimuONNXGraphBuilder:
    """Build the op graph of one pipeline stage (or model chunk) of a configured PerfLLM or
    an Estimate: ``SimuONNXGraphBuilder(perf).build(stage=0)``."""

    def __init__(self, perf: Any) -> None:
        self.est = perf.estimate if hasattr(perf, "estimate") else perf

    def build(self, stage: int = 0, chunk: int | None = None) -> OpGraph:
        est = self.est
        stages = est.stages if chunk is None else [c for c in est.chunks if c.vstage == chunk]
        if chunk is None and not 0 <= stage < len(stages):
            raise ConfigError("stage", f"must be in 0..{len(stages) - 1}")
        if chunk is not None and not stages:
            raise ConfigError("chunk", f"must be in 0..{len(est.chunks) - 1}")
        s: Stage = stages[stage if chunk is None else 0]
        g = OpGraph(f"stage{s.index}" if chunk is None else f"chunk{chunk}")
        producer: dict[str, str] = {}
        prev = None
        for o in s.ops:
            ph = est.layer_profiles.op_time(o)
            t = f"\\n{ph['fwd'].total * 1e6:.0f} us fwd, {(ph['bwd_input'].total + ph['bwd_weight'].total) * 1e6:.0f} us bwd"
            flops = sum(k.flops for k in o.fwd)
            g.nodes.append((o.name, f"{o.name}\\n{o.module}\\n{flops / 1e9:.1f} GFLOP fwd{t}"))
            linked = False
            for name, _ in o.input:
                if name in producer and producer[name] != o.name:
                    g.edges.append((producer[name], o.name, name))
                    linked = True
            if not linked and prev is not None:
                g.edges.append((prev, o.name, ""))
            for out in (o.output, *o.also_outputs):
                if out is not None:
                    producer[out[0]] = o.name
            prev = o.name
        return g


def visualize_with_graphviz(graph: OpGraph, path: str | Path, fmt: str = "png") -> Path:
    """Write ``graph`` as ``path``.dot, and render ``path``.``fmt`` when Graphviz's ``dot``
    is installed; returns the rendered file, else the .dot file."""
    base = Path(path)
    if base.suffix in (".dot", f".{fmt}"):
        base = base.with_suffix("")
    dot_file = base.with_suffix(".dot")
    dot_file.parent.mkdir(parents=True, exist_ok=True)
    dot_file.write_text(graph.to_dot())
    exe = shutil.which("dot")
    if exe is None:
        return dot_file
    out = base.with_suffix(f".{fmt}")
    subprocess.run([exe, f"-T{fmt}", str(dot_file), "-o", str(out)], check=True, capture_output=True)
    return out
