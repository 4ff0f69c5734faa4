"""Which pipeline rank holds each virtual stage (model chunk), by schedule.

Virtual stages are numbered in forward order of the model. Megatron's interleaved
schedule puts virtual stage k on rank k mod p (chunk k div p); DualPipeV folds the model
into a V: down the ranks with chunk 0, back up with chunk 1, so rank 0 holds both the
embedding and the loss.
"""

from __future__ import annotations

from simumax.config.strategy import StrategyConfig


def virtual_stage_places(st: StrategyConfig) -> list[tuple[int, int]]:
    """(rank, chunk on that rank) of each virtual stage, in forward order."""
    p, v = st.pp_size, st.chunks_per_rank
    if st.schedule == "dualpipev":
        return [(k, 0) for k in range(p)] + [(k, 1) for k in range(p - 1, -1, -1)]
    return [(k % p, k // p) for k in range(p * v)]
