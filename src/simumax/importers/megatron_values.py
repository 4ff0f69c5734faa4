"""Values of Megatron-LM flags as megatron/training/arguments.py reads them: lists after a
flag, per-layer patterns (an int or a 0/1 list expression, read without evaluating code),
TransformerEngine's (left, right) window, Megatron's tuple_type."""

from __future__ import annotations

import ast
from typing import Any

from simumax.errors import ConfigError


def typed(flag: str, value: str, typ: type = int) -> Any:
    """A flag's value as ``typ`` (int, float, str), or the ConfigError that names the flag."""
    try:
        return typ(value)
    except ValueError:
        raise ConfigError(flag, f"expected {typ.__name__}, got {value!r}") from None


def window_keys(value: str) -> int | None:
    """Megatron's --window-size "left,right" (TransformerEngine: a query attends keys i - left
    .. i + right; causal runs take right 0) as the keys a query attends, itself included."""
    try:
        left = _tuple_ints(value)[0]
    except (ValueError, IndexError):
        raise ConfigError("--window-size", f"expected 'left,right' integers, got {value!r}") from None
    if left < -1:
        raise ConfigError("--window-size", f"left must be >= -1 (-1: unbounded), got {left}")
    return None if left == -1 else left + 1


def _tuple_ints(value: str) -> tuple[int, ...]:
    """Megatron's tuple_type: "1,2" or "(1,2)" -> (1, 2)."""
    return tuple(int(x) for x in value.strip().strip("()").split(","))


def skip_freq(value: str) -> int:
    """--window-attn-skip-freq: N (every N-th layer attends everything) or a 0/1 list, 1 for a
    windowed layer, which must repeat N - 1 windowed layers and one full one."""
    got = int_or_layer_list("--window-attn-skip-freq", value)
    if isinstance(got, int):
        if got < 1:
            raise ConfigError("--window-attn-skip-freq", f"must be >= 1 (got {got})")
        return got
    n = got.index(0) + 1 if 0 in got else 0
    if not n or any(bit != int((i + 1) % n != 0) for i, bit in enumerate(got)):
        raise ConfigError("--window-attn-skip-freq", "a layer list is modelled when it repeats N - 1 windowed layers (1) "
                          "and one full layer (0)")
    return n


def values_after(tokens: list[str], i: int) -> list[str]:
    """The words after a flag that takes several (``--recompute-modules core_attn mlp``),
    up to the next flag."""
    out = []
    for tok in tokens[i + 1:]:
        if tok.startswith("--"):
            break
        out.append(tok)
    return out


def int_or_layer_list(flag: str, value: str) -> int | list[int]:
    """A per-layer flag Megatron takes as an int or a 0/1 list expression (--moe-layer-freq,
    --no-rope-freq)."""
    pattern = layer_pattern(value, flag)
    if pattern:
        return [int(x) for x in pattern]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(flag, f"expected an int or a list of 0/1, got {value!r}") from None


def layer_pattern(value: str, flag: str = "--moe-layer-freq") -> list[str] | None:
    """A per-layer flag's list as "0"/"1" per layer, None for an int: Megatron takes an int N
    (--moe-layer-freq: every N-th layer MoE) or a Python list expression ("[0,0,1,1]",
    "([0]*3+[1]*58)"); lists of integers, + and * are read here without evaluating code."""
    if value.strip().lstrip("(").startswith("["):
        try:
            got = _list_expr(ast.parse(value.strip(), mode="eval").body)
        except (SyntaxError, ValueError, TypeError):
            raise ConfigError(flag, f"cannot read {value!r} (a list of 0/1, with + and *)") from None
        return [str(x) for x in got]
    return None


def _list_expr(node: ast.AST) -> Any:
    if isinstance(node, ast.List):
        return [_list_expr(e) for e in node.elts]
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        a, b = _list_expr(node.left), _list_expr(node.right)
        return a + b if isinstance(node.op, ast.Add) else a * b
    raise ValueError("not a list expression")


def is_one(value: str) -> bool:
    try:
        return float(value) == 1.0
    except ValueError:
        return False
