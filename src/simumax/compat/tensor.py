"""SimuMax's ``FakeTensor``: a shape and a dtype that scripts pass around instead of data."""

from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int64": 8,
               "int32": 4, "bool": 1, "int8": 1}


@dataclass(frozen=True)
class FakeTensor:
    shape: tuple[int, ...]
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(x) for x in self.shape))
        if self.dtype not in DTYPE_BYTES:
            from simumax.errors import ConfigError

            raise ConfigError("dtype", f"unknown dtype {self.dtype!r}; known: {', '.join(DTYPE_BYTES)}")

    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def element_size(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size

    def size(self, dim: int | None = None) -> tuple[int, ...] | int:
        return self.shape if dim is None else self.shape[dim]
