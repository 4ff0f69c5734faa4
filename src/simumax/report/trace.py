"""Chrome trace-event JSON of a simulated iteration (opens in Perfetto and chrome://tracing).

One process per pipeline rank; thread 0 is the compute stream (passes, with their ops
nested inside when ``ops`` is on), thread 1 the communication stream (P2P, gradient
reduce, parameter gather); ``merge_lanes`` puts both on one lane. A counter track shows
allocated bytes. Times are in microseconds, as the format requires; args carry SI numbers
(FLOPs, bytes, seconds). Events carry SimuMax's fields too, so its trace tooling reads
them: ``cat`` compute / comm, and args ``stream_type``, ``base_name`` (the op or pass
without its phase), ``direction`` (fwd / bwd / wgrad) and ``call_stack`` (rank / model
chunk / op).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterable, Iterator

from simumax.atomic import write_stream_atomic
from simumax.cost.stage_time import PhaseTime, StageTime
from simumax.schedule import SPLIT_BACKWARD
from simumax.schedule.tasks import BACKWARD, FORWARD, WEIGHT

if TYPE_CHECKING:
    from simumax.estimate import Estimate
    from simumax.memory.schedule_walk import RankActivations
    from simumax.simulate.iteration import IterationRun

THREADS = {"compute": 0, "comm": 1}
PASS_NAMES = {FORWARD: "forward", BACKWARD: "backward", WEIGHT: "weight-grad"}
DIRECTIONS = {FORWARD: "fwd", BACKWARD: "bwd", WEIGHT: "wgrad"}


def op_slices(t: StageTime, kind: str, split: bool) -> list[tuple[str, PhaseTime]]:
    """(name, cost) of each op's part of one pass, in execution order: forward in op order;
    backward re-runs checkpointed forwards, then goes through the ops in reverse."""
    out: list[tuple[str, PhaseTime]] = []
    if kind == FORWARD:
        return [(f"{o.name} fwd", ph["fwd"]) for o, ph in t.op_times]
    if kind == BACKWARD:
        out += [(f"{o.name} recompute", ph["recompute"]) for o, ph in t.op_times if o.recompute_group]
        for o, ph in reversed(t.op_times):
            cost = PhaseTime()
            cost.add(ph["bwd_input"])
            if not split:
                cost.add(ph["bwd_weight"])
            out.append((f"{o.name} bwd", cost))
        return out
    return [(f"{o.name} wgrad", ph["bwd_weight"]) for o, ph in reversed(t.op_times) if o.bwd_weight]


def _q(text: str) -> str:
    """A JSON string literal; the names here are plain ASCII, quoted as they are."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3f}"


def trace_events(
    est: "Estimate", run: "IterationRun", acts: list["RankActivations"], model_states: list[float], ops: bool,
    merge_lanes: bool = False,
) -> Iterator[str]:
    """The trace's events as JSON text, one at a time (a long iteration has millions)."""
    split = est.strategy.schedule in SPLIT_BACKWARD
    slices = {
        (kind, k): op_slices(t, kind, split)
        for k, t in enumerate(est.chunk_times) for kind in (FORWARD, BACKWARD, WEIGHT)
    } if ops else {}
    lanes = {"compute": 0} if merge_lanes else THREADS
    for r, events in enumerate(run.events):
        yield f'{{"name":"process_name","ph":"M","pid":{r},"tid":0,"args":{{"name":"pp rank {r}"}}}}'
        yield f'{{"name":"process_sort_index","ph":"M","pid":{r},"tid":0,"args":{{"sort_index":{r}}}}}'
        for name, tid in lanes.items():
            lane = "streams" if merge_lanes else name
            yield f'{{"name":"thread_name","ph":"M","pid":{r},"tid":{tid},"args":{{"name":"{lane}"}}}}'
        for e in events:
            base = PASS_NAMES.get(e.kind, e.name)
            label = f"{base} vstage {e.vstage} mb {e.mb}" if e.kind in PASS_NAMES else e.name
            stream = "compute" if e.stream == "compute" else "comm"
            ids = (f',"vstage":{e.vstage}' if e.vstage >= 0 else "") + (f',"micro_batch":{e.mb}' if e.mb >= 0 else "")
            tid = 0 if merge_lanes else THREADS[e.stream]
            yield (f'{{"name":{_q(label)},"cat":"{stream}","ph":"X","pid":{r},"tid":{tid},"ts":{_us(e.start)},'
                   f'"dur":{_us(e.end - e.start)},"args":{{"seconds":{e.end - e.start!r}{ids},"kind":{_q(e.kind)},'
                   f'"stream_type":"{stream}","base_name":{_q(base)},"direction":{_q(DIRECTIONS.get(e.kind, e.kind))},'
                   f'"call_stack":{_q(f"rank {r}/vstage {e.vstage}/{base}")}}}}}')
            parts = slices.get((e.kind, e.vstage)) if e.stream == "compute" else None
            if parts:
                whole = sum(p.total for _, p in parts) or 1.0
                scale = (e.end - e.start) / whole  # paired passes run compressed
                t = e.start
                for name, p in parts:
                    if p.total <= 0:
                        continue
                    d = p.total * scale
                    comm = "".join(f',"{g}_comm_s":{x!r}' for g, x in p.comm.items() if x)
                    op_name, _, phase = name.rpartition(" ")
                    yield (f'{{"name":{_q(name)},"cat":"compute","ph":"X","pid":{r},"tid":0,"ts":{_us(t)},"dur":{_us(d)},'
                           f'"args":{{"flops":{p.flops!r},"bytes":{p.bytes!r},"seconds":{d!r},"micro_batch":{e.mb}{comm},'
                           f'"kind":"op","stream_type":"compute","base_name":{_q(op_name)},"direction":{_q(phase)},'
                           f'"call_stack":{_q(f"rank {r}/vstage {e.vstage}/{op_name}")}}}}}')
                    t += d
        states = model_states[r]
        for t, b in acts[r].timeline:
            yield f'{{"name":"allocated bytes","ph":"C","pid":{r},"ts":{_us(t)},"args":{{"bytes":{states + b!r}}}}}'


def write_chrome_trace(path: Path, events: Iterable[str]) -> None:
    """Stream the events into ``path`` (atomically), a few thousand at a time: memory stays
    bounded whatever the iteration's length."""
    def fill(f: IO[str]) -> None:
        f.write('{"displayTimeUnit":"ms","otherData":{"generator":"simumax"},"traceEvents":[\n')
        chunk: list[str] = []
        first = True
        for ev in events:
            chunk.append(ev)
            if len(chunk) >= 4096:
                f.write(("" if first else ",\n") + ",\n".join(chunk))
                first, chunk = False, []
        if chunk:
            f.write(("" if first else ",\n") + ",\n".join(chunk))
        f.write("\n]}\n")

    write_stream_atomic(path, fill)
