"""SimuMax import path: ``from simumax.core.tensor import FakeTensor``."""

from simumax.compat.tensor import FakeTensor

__all__ = ["FakeTensor"]
