"""nccl-tests output (github.com/NVIDIA/nccl-tests: all_reduce_perf, all_gather_perf,
reduce_scatter_perf, alltoall_perf, sendrecv_perf) read as timed collectives, the points
``simumax calibrate-comm`` measures itself (calibrate/comm_points.py).

What the output holds: ``#  Rank  N Group G Pid P on HOST device D [...] NAME`` per rank
(rank 0 prints every rank: the group size and the hosts), a column header
(``size count type redop root time algbw busbw #wrong time ...``; older releases leave out
``redop`` / ``root``) and one row per message size. ``size`` is the cost model's
``Collective.bytes`` for every op: the all-reduce buffer, all-gather's gathered output,
reduce-scatter's input, all-to-all's buffer per rank, sendrecv's message (nccl-tests' own
bus bandwidth divides by the same ring factors, cost/network.py ``DEFAULT_SPECS``). The
out-of-place time (µs, the first ``time`` column) is the point's. The op comes from the
``Collective test starting: <name>_perf`` line newer releases print, else from the file's
name, else the caller's ``op``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simumax.calibrate.comm_points import CommPoint, merge_points, points_report
from simumax.config.base import check_readable_file, read_text
from simumax.errors import ConfigError

# nccl-tests binary -> the cost model's op (its other tests — reduce, broadcast, gather,
# scatter, hypercube — run no collective a Megatron step is costed with)
NCCL_TESTS_OPS = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_gather": "all_gather",
                  "allgather": "all_gather", "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
                  "alltoall": "all2all", "all_to_all": "all2all", "sendrecv": "p2p"}
_STARTING = re.compile(r"Collective test starting:\s*(\w+?)_perf")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)", re.M)
# what launchers put before each line of a rank's output: srun -l ("0: "), Open MPI's
# --tag-output ("[1,0]<stdout>:")
_LAUNCHER_PREFIX = re.compile(r"^\s*(?:\d+:\s?|\[\d+,\d+\]<std(?:out|err)>:\s?)")


@dataclass(frozen=True)
class NcclTestsRun:
    path: str
    op: str  # the cost model's op name
    ranks: int
    hosts: int
    points: tuple[CommPoint, ...]


def _op_of(text: str, path: Path, op: str | None) -> str:
    if op is not None:
        return _model_op(op, path)
    started = {m[1] for m in _STARTING.finditer(text)}
    if len(started) > 1:
        raise ConfigError("op", f"the output holds several tests ({', '.join(sorted(started))}): give one file per test",
                          str(path))
    if started:
        return _model_op(started.pop(), path)
    name = path.name.lower().replace("-", "_")
    for key in sorted(NCCL_TESTS_OPS, key=len, reverse=True):
        if key in name:
            return NCCL_TESTS_OPS[key]
    raise ConfigError("op", f"which test is it? neither its output nor its name says (give --op, one of "
                      f"{', '.join(sorted(set(NCCL_TESTS_OPS)))})", str(path))


def _model_op(name: str, path: Path) -> str:
    key = name.lower().replace("-", "_").removesuffix("_perf")
    if key not in NCCL_TESTS_OPS:
        raise ConfigError("op", f"{name}: not a collective a training step is costed with (all_reduce, all_gather, "
                          "reduce_scatter, alltoall, sendrecv)", str(path))
    return NCCL_TESTS_OPS[key]


def parse_nccl_tests(path: str | Path, op: str | None = None) -> NcclTestsRun:
    """One nccl-tests output file (rank 0's, as the launcher prints it)."""
    p = Path(path)
    check_readable_file(p, "an nccl-tests output")
    text = "\n".join(_LAUNCHER_PREFIX.sub("", line) for line in read_text(p, "path").splitlines())
    the_op = _op_of(text, p, op)
    ranks = {int(m[1]): m[2] for m in _RANK.finditer(text)}
    if not ranks:
        raise ConfigError("ranks", "no '#  Rank N Group G Pid P on HOST device ...' lines: give rank 0's whole output",
                          str(p))
    time_col = None
    points = []
    for line in text.splitlines():
        words = line.split()
        if line.lstrip().startswith("#"):
            cols = line.lstrip("# \t").split()
            if time_col is None and cols[:2] == ["size", "count"] and "time" in cols:
                time_col = cols.index("time")
            continue
        if time_col is None or len(words) <= time_col or not (words[0].isdigit() and words[1].isdigit()):
            continue
        try:
            us = float(words[time_col])
        except ValueError:
            continue
        size = int(words[0])
        if size > 0 and us > 0:
            points.append(CommPoint(the_op, len(ranks), size, us * 1e-6, nodes=len(set(ranks.values()))))
    if time_col is None or not points:
        raise ConfigError("rows", "no '#  size  count  type ... time ...' header with rows under it", str(p))
    if len(ranks) < 2:
        raise ConfigError("ranks", "one rank: a collective needs two or more to time a link", str(p))
    return NcclTestsRun(str(p), the_op, len(ranks), len(set(ranks.values())), tuple(points))


def system_from_nccl_tests(runs: list[NcclTestsRun], base: dict[str, Any], tier: str | None = None
                           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``base`` (a system dict) with the tiers the runs measure fitted
    (calibrate/comm_points.py ``merge_points``), and a report."""
    points = [p for r in runs for p in r.points]
    for r in runs:
        if r.ranks % r.hosts:
            raise ConfigError("ranks", f"{r.ranks} ranks on {r.hosts} hosts: the model spreads a group evenly over "
                              "its nodes", r.path)
    system, where = merge_points(base, points, None, tier)
    report = {"backend": "nccl-tests", "files": [{"path": r.path, "op": r.op, "ranks": r.ranks, "hosts": r.hosts,
                                                  "points": len(r.points)} for r in runs],
              **where, **points_report(points)}
    return system, report
