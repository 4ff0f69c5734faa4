"""SimuMax's names over simumax's one implementation (the shims at SimuMax's import paths,
``simumax.core.*`` and ``simumax.utils``, re-export from here; docs/compat.md lists them)."""
