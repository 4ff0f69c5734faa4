"""Searches without Python's cyclic garbage collector running under them.

A search evaluates thousands of candidates, each allocating thousands of short-lived
containers (ops, kernel tuples, phase times), and keeps large caches alive meanwhile (layer
profiles, schedule orders, walks, DDP buckets). None of it is cyclic —
``tests/test_profiles.py`` and ``tests/test_search.py`` hold that a dropped estimate and a
finished search leave nothing for the collector — so reference counting frees it all, and
the collector's full passes only re-walk the growing caches: 15-27 % of a search's time
(docs/search.md). A single estimate gains nothing measurable (its heap is small), so
``PerfLLM`` leaves the collector alone.

The collector is process-wide: it is paused only while a search's candidates run, and left
as found (a caller that disabled it keeps it disabled). Cycles that other threads or a
search's progress callback make meanwhile wait for the next pass after it resumes.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off; restore its state after."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
