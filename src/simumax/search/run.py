"""Run a search: evaluate every legal candidate (in this process, over worker processes,
or on Ray), stream each finished row to a JSONL file, and rank those that fit.

Resumable: with ``resume`` the rows already in the JSONL are kept and their candidates
skipped. SIGINT / SIGTERM stop the run between rows: every finished row is on disk (each
is one complete line, flushed as it lands), pending work is cancelled and
``SearchInterrupted`` is raised. A line cut short by a hard kill is dropped on resume.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from simumax.atomic import write_jsonl_atomic
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.gc_pause import cyclic_gc_paused
from simumax.profiles import ProfileCache
from simumax.search.evaluate import SearchRow, candidate_key, evaluate
from simumax.search import output_guard
from simumax.search.space import SearchSpace, candidates

log = logging.getLogger(__name__)

EXECUTORS = ("local", "process", "ray")
BATCH = 8  # candidates of one layer family per task: workers reuse its profile


class SearchInterrupted(Exception):
    def __init__(self, rows: list[SearchRow], path: Path | None) -> None:
        super().__init__(f"search interrupted after {len(rows)} rows" + (f" (kept in {path})" if path else ""))
        self.rows = rows
        self.path = path


def _identity(r: SearchRow) -> str:
    """Last tie-break: the whole strategy (two candidates can share a label, e.g. schedules
    that coincide), so the order never depends on evaluation order (a resumed run = a fresh one)."""
    return json.dumps(r.strategy, sort_keys=True)


def rank(rows: list[SearchRow]) -> list[SearchRow]:
    """Fitting rows by iteration time (ties: less memory, then label), then the rest by memory."""
    fit = sorted((r for r in rows if r.fits), key=lambda r: (r.iter_time, r.peak_mem, r.label, _identity(r)))
    rest = sorted((r for r in rows if not r.fits), key=lambda r: (r.peak_mem, r.label, _identity(r)))
    return fit + rest


def read_rows(path: Path) -> list[SearchRow]:
    """Rows of a search JSONL; a line that does not parse (cut by a kill) is dropped."""
    rows = []
    if not path.exists():
        return rows
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append(SearchRow.from_dict(json.loads(line)))
        except (ValueError, TypeError, KeyError):
            log.warning("%s:%d: incomplete row dropped", path, n)
    return rows


# ---- evaluation on workers ---------------------------------------------------------------
Task = list[tuple[str, StrategyConfig]]


class _Evaluator:
    """Candidates of one search with one ProfileCache: in this process, in each worker
    process (built by _init_worker), or as a Ray actor (decorated with ray.remote at use)."""

    def __init__(self, model: ModelConfig, system: SystemConfig, gmi_error: float, use_reserved: bool) -> None:
        self.model, self.system = model, system  # held here: the cache holds the system weakly
        self.profiles = ProfileCache(model, system)
        self.gmi, self.reserved = gmi_error, use_reserved

    def run(self, task: Task) -> list[SearchRow]:
        m, y, p = self.model, self.system, self.profiles
        with cyclic_gc_paused():  # nothing here is cyclic; the collector would only re-walk the caches
            return [evaluate(m, rc, st, y, p, gmi_error=self.gmi, use_reserved_memory=self.reserved) for rc, st in task]


_worker: dict[str, _Evaluator] = {}  # per worker process, set by _init_worker (never at import)


WATCHDOG_SECONDS = 0.5


def _exit_with_parent(parent: int) -> None:
    """A worker whose parent died (even by SIGKILL, which no handler sees) exits too: it is
    re-parented, so its parent pid changes."""
    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(WATCHDOG_SECONDS)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _init_worker(parent: int, *init: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    _exit_with_parent(parent)
    gc.disable()  # this process only evaluates candidates, which make no cycles (gc_pause.py)
    _worker["evaluator"] = _Evaluator(*init)


def _eval_batch(task: Task) -> list[SearchRow]:
    return _worker["evaluator"].run(task)


def _family(rc: str, st: StrategyConfig) -> tuple[Any, ...]:
    return (rc, st.tp_size, st.cp_size, st.micro_batch_size, st.ep_size, st.etp_size)


def _batches(todo: Task) -> list[Task]:
    """Consecutive candidates of one layer family, BATCH at a time."""
    out: list[Task] = []
    for rc, st in todo:
        if out and len(out[-1]) < BATCH and _family(*out[-1][0]) == _family(rc, st):
            out[-1].append((rc, st))
        else:
            out.append([(rc, st)])
    return out


@contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT / SIGTERM while the search runs (main thread only)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in old:
        signal.signal(s, lambda *_: stop.set())
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run_local(batches: list[Task], init: tuple, stop: threading.Event) -> Iterator[list[SearchRow]]:
    evaluator = _Evaluator(*init)
    for task in batches:
        for candidate in task:  # one at a time: a stop loses at most the row in progress
            if stop.is_set():
                return
            yield evaluator.run([candidate])


def _run_processes(batches: list[Task], jobs: int, init: tuple, stop: threading.Event) -> Iterator[list[SearchRow]]:
    pool = ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(os.getpid(), *init))
    try:
        pending: set[Future] = set()
        it = iter(batches)
        for task in it:  # keep 2 tasks per worker in flight, so a stop wastes little
            pending.add(pool.submit(_eval_batch, task))
            if len(pending) >= 2 * jobs:
                break
        while pending and not stop.is_set():
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()
                task = next(it, None)
                if task is not None and not stop.is_set():
                    pending.add(pool.submit(_eval_batch, task))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(batches: list[Task], jobs: int, init: tuple, stop: threading.Event) -> Iterator[list[SearchRow]]:
    try:
        import ray
        from ray.util import ActorPool
    except ImportError:
        raise ConfigError("executor", "ray is not installed (pip install 'simumax[ray]')") from None
    started = not ray.is_initialized()
    if started:  # a local instance unless RAY_ADDRESS points at a cluster
        ray.init(num_cpus=jobs if not os.environ.get("RAY_ADDRESS") else None, log_to_driver=False, include_dashboard=False)
    try:
        actor = ray.remote(_Evaluator)
        pool = ActorPool([actor.remote(*init) for _ in range(jobs)])
        for task in batches:
            pool.submit(lambda a, t: a.run.remote(t), task)
        while pool.has_next() and not stop.is_set():
            yield pool.get_next_unordered()
    finally:
        if started:
            ray.shutdown()


def run_search(
    model: ModelConfig,
    system: SystemConfig,
    base: StrategyConfig,
    space: SearchSpace,
    *,
    gmi_error: float = 0.0,
    use_reserved_memory: bool = True,
    jobs: int = 1,
    executor: str = "local",
    jsonl: Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> list[SearchRow]:
    """Ranked rows of every legal candidate. ``jsonl`` receives each row as it finishes
    and, at the end, all rows in rank order (atomically); its folder is locked for the
    search and a fingerprint of the search beside it lets ``resume`` refuse another
    search's rows (search/output_guard.py)."""
    if executor not in EXECUTORS:
        raise ConfigError("executor", f"unknown executor {executor!r}; allowed {EXECUTORS}")
    if jobs < 1:
        raise ConfigError("jobs", "must be >= 1")
    if jsonl is None:
        return _run_search(model, system, base, space, gmi_error, use_reserved_memory, jobs, executor, None, False, progress)
    fp = output_guard.fingerprint(model, system, base, space, gmi_error, use_reserved_memory)
    with output_guard.locked(jsonl.parent):
        if resume:
            output_guard.check_resume(jsonl, fp)
        output_guard.record(jsonl, fp)
        return _run_search(model, system, base, space, gmi_error, use_reserved_memory, jobs, executor, jsonl, resume, progress)


def _run_search(model: ModelConfig, system: SystemConfig, base: StrategyConfig, space: SearchSpace, gmi_error: float,
                use_reserved_memory: bool, jobs: int, executor: str, jsonl: Path | None, resume: bool,
                progress: Callable[[int, int], None] | None) -> list[SearchRow]:
    todo = list(candidates(model, system, base, space))
    keys = [candidate_key(rc, st) for rc, st in todo]
    known = set(keys)
    rows = [r for r in read_rows(jsonl) if r.key in known] if (resume and jsonl) else []
    done = {r.key for r in rows}
    todo = [c for c, key in zip(todo, keys) if key not in done]
    total = len(rows) + len(todo)
    if progress:
        progress(len(rows), total)
    batches = _batches(todo)
    init = (model, system, gmi_error, use_reserved_memory)
    sink: IO[str] | None = None
    if jsonl is not None:
        jsonl.parent.mkdir(parents=True, exist_ok=True)
        if rows:  # rewrite what survived (drops a cut line) before appending
            write_jsonl_atomic(jsonl, [r.to_dict() for r in rows])
        sink = jsonl.open("a" if rows else "w", encoding="utf-8")
    try:
        with _stop_on_signals() as stop, cyclic_gc_paused():
            if executor == "ray":
                results = _run_ray(batches, jobs, init, stop)
            elif executor == "process" or jobs > 1:
                results = _run_processes(batches, jobs, init, stop)
            else:
                results = _run_local(batches, init, stop)
            for got in results:
                for row in got:
                    rows.append(row)
                    if sink is not None:
                        sink.write(json.dumps(row.to_dict(), sort_keys=True) + "\n")
                        sink.flush()
                if progress:
                    progress(len(rows), total)
            interrupted = stop.is_set() and len(rows) < total
    finally:
        if sink is not None:
            sink.close()
    if interrupted:
        raise SearchInterrupted(rows, jsonl)
    ranked = rank(rows)
    if jsonl is not None:
        write_jsonl_atomic(jsonl, [r.to_dict() for r in ranked])
    return ranked
