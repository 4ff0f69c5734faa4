"""Run a search over a space: evaluate every legal candidate (optionally over processes)
and rank those that fit by iteration time."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.search.evaluate import SearchRow, evaluate
from simumax.search.space import SearchSpace, candidates


def _eval_one(args: tuple) -> SearchRow:
    model, st, system, gmi_error, use_reserved = args
    return evaluate(model, st, system, gmi_error=gmi_error, use_reserved_memory=use_reserved)


def rank(rows: list[SearchRow]) -> list[SearchRow]:
    """Fitting rows by iteration time (ties: less memory), then the rest by memory."""
    fit = sorted((r for r in rows if r.fits), key=lambda r: (r.iter_time, r.peak_mem, r.label))
    rest = sorted((r for r in rows if not r.fits), key=lambda r: (r.peak_mem, r.label))
    return fit + rest


def run_search(
    model: ModelConfig,
    system: SystemConfig,
    base: StrategyConfig,
    space: SearchSpace,
    *,
    gmi_error: float = 0.0,
    use_reserved_memory: bool = True,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> list[SearchRow]:
    todo = [(model, st, system, gmi_error, use_reserved_memory) for st in candidates(model, system, base, space)]
    rows: list[SearchRow] = []
    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for row in pool.map(_eval_one, todo, chunksize=max(1, len(todo) // (4 * jobs))):
                rows.append(row)
                if progress:
                    progress(len(rows), len(todo))
    else:
        for args in todo:
            rows.append(_eval_one(args))
            if progress:
                progress(len(rows), len(todo))
    return rank(rows)
