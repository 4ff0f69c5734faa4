"""SimuMax's package layout (``simumax.core.config``, ``simumax.core.perf_llm``, ...): thin
re-exports of simumax's own modules, so SimuMax scripts import unchanged."""
