"""Shared behaviour of the three config schemas: strict fields, file loading, errors."""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from simumax.errors import ConfigError

# validation context key: check each field, leave the cross-field rules for later
DEFER_RULES = "defer_cross_field_rules"


# the member tags pydantic puts in an error's location for a union field (``int | list[int]``
# -> "constrained-int", "list[constrained-int]"): not part of the field's path
_UNION_TAG = re.compile(r"(constrained-)?(int|float|str|bool)|(list|dict|tuple|set)\[.*\]")


def _loc(err: dict[str, Any]) -> str:
    loc = err.get("loc", ())
    parts = [str(p) for i, p in enumerate(loc) if not (i and isinstance(p, str) and _UNION_TAG.fullmatch(p))]
    return ".".join(parts) or "<root>"


def _union_member(err: dict[str, Any]) -> bool:
    loc = err.get("loc", ())
    return len(loc) > 1 and isinstance(loc[1], str) and bool(_UNION_TAG.fullmatch(loc[1]))


def did_you_mean(name: str, choices: Any, prefix: str = "") -> str:
    """``"; did you mean a, b?"`` with up to three of ``choices`` close to ``name`` (each
    after ``prefix``), or nothing when none is."""
    close = difflib.get_close_matches(name, list(choices), n=3)
    return f"; did you mean {', '.join(prefix + c for c in close)}?" if close else ""


def config_error_from(exc: ValidationError, source: str | None = None, fields: Any = ()) -> ConfigError:
    """Turn pydantic's report into one ConfigError naming the first bad field; an unknown
    top-level field suggests the nearest of ``fields`` (the config's own)."""
    errors = exc.errors()
    err = errors[0]
    if _union_member(err):
        # a union field reports each member's error: the deepest is that of the member the
        # input's shape chose (a list's bad element, not "should be a valid integer")
        same = [e for e in errors if _union_member(e) and e["loc"][0] == err["loc"][0]]
        err = max(same, key=lambda e: len(e["loc"]))
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError):  # raised by a cross-field validator: keep its field
        return ConfigError(inner.field, inner.rule, source)
    field = _loc(err)
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        rule = "unknown field (not part of this config format)"
        if len(err.get("loc", ())) == 1:  # a top-level field: suggest the config's own
            rule += did_you_mean(field, fields)
    elif kind == "missing":
        rule = "required field is missing"
    else:
        rule = err.get("msg", "invalid value")
        if "input" in err and not isinstance(err["input"], (dict, list)):
            rule += f" (got {err['input']!r})"
    return ConfigError(field, rule, source)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_readable_file(p: Path, wanted: str = "a JSON file", field: str = "path") -> None:
    """ConfigError naming what ``p`` is when it is not a regular file."""
    if p.is_file():
        return
    if not p.exists():
        raise ConfigError(field, f"file not found: {p}")
    if p.is_dir():
        kind = "a directory"
    elif p.is_fifo():
        kind = "a FIFO"
    elif p.is_char_device() or p.is_block_device():
        kind = "a device"
    else:
        kind = "not a regular file"
    raise ConfigError(field, f"{p} is {kind}, not {wanted}")


def parse_json_text(text: str, source: str) -> Any:
    """JSON as the standard says: no NaN / Infinity, a UTF-8 BOM tolerated, and one
    ConfigError for anything unparsable (too deep, numbers out of range), not a traceback."""
    try:
        return json.loads(text.removeprefix("\ufeff"), parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError("json", f"not valid JSON ({exc.msg} at line {exc.lineno})", source) from None
    except ValueError as exc:  # NaN / Infinity, or an integer too long to convert
        raise ConfigError("json", f"not valid JSON ({exc})", source) from None
    except RecursionError:
        raise ConfigError("json", "nested too deeply", source) from None


def read_text(path: str | Path, what: str = "json") -> str:
    """A UTF-8 text file, or one ConfigError saying why it cannot be read."""
    p = Path(path)
    check_readable_file(p)
    try:
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(what, f"not UTF-8 text (byte {exc.start})", str(p)) from None
    except OSError as exc:
        raise ConfigError("path", f"cannot read {p}: {exc.strerror}") from None


def read_json(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    text = read_text(p)
    data = parse_json_text(text, str(p))
    if not isinstance(data, dict):
        raise ConfigError("json", "top level must be an object", str(p))
    return data


_ATOMS = frozenset({str, int, float, bool, type(None)})


def _plain_container(annotation: Any) -> bool:
    """A ``dict[str, float]`` / ``list[int]``-like field: a shallow copy is its state."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin not in (dict, list) or not args:
        return False
    for a in args[-1:] if origin is dict else args:
        if get_origin(a) is Annotated:
            a = get_args(a)[0]
        if a not in _ATOMS:
            return False
    return True


def _atomic(annotation: Any) -> bool:
    """A field type whose values are atoms only (str, int, float, bool, None, a Literal of
    them): a snapshot keeps such values as they are."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _atomic(get_args(annotation)[0])
    if origin is Literal:
        return True
    if origin is Union or origin is types.UnionType:
        return all(_atomic(a) for a in get_args(annotation))
    return annotation in _ATOMS


def snapshot(value: Any, shadows: list[tuple[Any, Any]] | None = None) -> Any:
    """A config's state (or any value inside one) as plain values compared by equality:
    what PerfLLM keeps to notice in-place edits (``perf.model_config.layer_num = 4``, an
    efficiency table entry changed). Every field, nested configs, dicts and lists copied
    (a field typed as a dict or list of plain values — an efficiency table — in one
    C-level copy); no serializer runs, so it costs half a ``model_dump`` of a system with
    measured tables. Private attributes (derived fits, the source path) are not state.
    ``shadows``: gets (container, shallow copy) for every dict and list met (Fingerprint)."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if isinstance(value, BaseModel):
        # the fields in one C-level copy, then those that can hold more than an atom (known
        # from the annotations; strict validation keeps the rest atoms) replaced by theirs
        state = value.__dict__.copy()
        plain = getattr(kind, "_plain_fields", ())
        for k in getattr(kind, "_container_fields", state):
            v = state[k]
            if type(v) not in _ATOMS:
                if k in plain:
                    state[k] = copy = v.copy()
                    if shadows is not None:
                        shadows.append((v, copy))
                else:
                    state[k] = snapshot(v, shadows)
        return kind, state
    if kind is dict:
        if _ATOMS.issuperset(map(type, value.values())):
            copy = value.copy()  # the snapshot and the shadow (never modified)
            if shadows is not None:
                shadows.append((value, copy))
            return copy
        if shadows is not None:
            shadows.append((value, value.copy()))
        return {k: v if type(v) in _ATOMS else snapshot(v, shadows) for k, v in value.items()}
    if kind is list or kind is tuple:
        if shadows is not None and kind is list:
            shadows.append((value, value.copy()))
        if _ATOMS.issuperset(map(type, value)):
            return tuple(value)
        return tuple([v if type(v) in _ATOMS else snapshot(v, shadows) for v in value])
    return value


def snapshot_field(snap: Any, name: str) -> Any:
    """The snapshot of one field of a config's snapshot (``snapshot(cfg.name)``, not taken again)."""
    return snap[1][name]


class Fingerprint:
    """The snapshots of some configs, and a cheap check that they still hold.

    A config changes in two ways only: a field assignment, which every config makes
    through ``ConfigBase.__setattr__`` (it counts them: ``ConfigBase.edits``), or an edit
    inside a dict or list it holds (a table entry, a list appended to). So while no field
    was assigned anywhere since the snapshots were taken, the same config objects hold the
    same nested configs and containers, and they are unchanged if every container still
    equals its shallow copy (C-level comparisons; identical items compare by identity).
    Otherwise the snapshots are taken again and compared (``matches``)."""

    __slots__ = ("configs", "snapshots", "_edits", "_shadows")

    def __init__(self, configs: tuple[Any, ...]) -> None:
        self.configs = configs
        self._edits, self.snapshots, self._shadows = self._take(configs)

    @staticmethod
    def _take(configs: tuple[Any, ...]) -> tuple[int, tuple[Any, ...], list[tuple[Any, Any]]]:
        """(assignments so far, the configs' snapshots, the containers they met with copies)."""
        shadows: list[tuple[Any, Any]] = []
        edits = ConfigBase.edits
        return edits, tuple(snapshot(c, shadows) for c in configs), shadows

    def matches(self, configs: tuple[Any, ...]) -> bool:
        """``configs`` (the same objects or others) hold what the snapshots say."""
        if (self._edits == ConfigBase.edits and all(a is b for a, b in zip(configs, self.configs, strict=True))
                and all(live == copy for live, copy in self._shadows)):
            return True
        edits, snapshots, shadows = self._take(configs)
        if snapshots != self.snapshots:
            return False
        # the same contents (an assignment of an equal value, or edits undone): watch these
        self.configs, self._edits, self._shadows = configs, edits, shadows
        return True

    # a copy or a pickle (another process counts its own edits) checks by the snapshots
    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        return None, {"configs": self.configs, "snapshots": self.snapshots, "_edits": -1, "_shadows": []}


class ConfigBase(BaseModel):
    """Strict pydantic model: unknown fields are errors, assignments are validated."""

    # strict: "tp_size": true or "4" are refused, not read as 1 or 4; no NaN or infinity anywhere
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True, allow_inf_nan=False)
    _plain_fields: ClassVar[frozenset[str]] = frozenset()  # fields of plain-value dicts / lists (snapshot)
    _container_fields: ClassVar[tuple[str, ...]] = ()  # fields that may hold more than an atom (snapshot)
    _source: str | None = PrivateAttr(None)  # the file (or override) it was loaded from
    _pending: ConfigError | None = PrivateAttr(None)  # a cross-field rule an in-place edit broke
    _derived: dict[str, tuple[Any, Any]] = PrivateAttr(default_factory=dict)  # derived(): name -> (contents, value)
    edits: ClassVar[int] = 0  # field assignments to any config so far (Fingerprint)

    def __init__(self, /, **data: Any) -> None:
        """``StrategyConfig(tp_size=3, ...)`` in a script: a bad field is a ConfigError, as
        from a file (pydantic's ValidationError would list every error with its URL)."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error_from(exc, fields=type(self).model_fields) from None

    # pydantic runs a subclass's own __init__ for every nested config it validates, which
    # would name a nested field without its parent ("mem_gbs", not "accelerator.mem_gbs");
    # marked as the base init (as pydantic's RootModel does), only a direct call runs it
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def derived(self, name: str, contents: Any, build: Callable[[], Any]) -> Any:
        """``build()``, kept for the estimates of this config while ``contents`` (what it was
        derived from, compared by value) stay the same: an edit in place derives it again.
        (Kernel costs and table fits live with the accelerator config, the layer profiles
        of the last model estimated with the system config.) A copy or a pickle of the
        config starts without them: they are caches, not state."""
        hit = self._derived.get(name)
        if hit is None or hit[0] != contents:
            hit = self._derived[name] = (contents, build())
        return hit[1]

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Any:
        memo = {} if memo is None else memo
        memo[id(self._derived)] = {}  # the copy's caches: empty, and the originals never copied
        return super().__deepcopy__(memo)

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        private = state.get("__pydantic_private__")
        if private and private.get("_derived"):
            state = {**state, "__pydantic_private__": {**private, "_derived": {}}}
        return state

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._plain_fields = frozenset(n for n, f in cls.model_fields.items() if _plain_container(f.annotation))
        cls._container_fields = tuple(n for n, f in cls.model_fields.items() if not _atomic(f.annotation))

    def __setattr__(self, name: str, value: Any) -> None:
        """Assignment checks the field at once and the rules between fields at use
        (``check``), so edits can come in any order (``pp_size`` before ``world_size``). A
        bad value raises ConfigError and leaves the config unchanged."""
        if name.startswith("_") or name not in type(self).model_fields:
            return super().__setattr__(name, value)
        ConfigBase.edits += 1
        before = dict(self.__dict__)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            err = config_error_from(exc, "assignment")
            inner = (exc.errors()[0].get("ctx") or {}).get("error")
            if isinstance(inner, ConfigError) and self.__dict__.get(name) == value:
                self._pending = err  # the value itself is fine; another field must follow it
                return
            self.__dict__.clear()
            self.__dict__.update(before)
            raise err from None
        self._pending = None

    def check(self) -> None:
        """Raise the ConfigError of a cross-field rule an in-place edit or a load with
        ``checked=False`` left broken."""
        if self._pending is not None:
            edited = self._pending.source in (None, "assignment")  # else the file it was loaded from
            type(self).init_from_dict(self.model_dump(), source="edited config" if edited else self._pending.source)
            self._pending = None

    @property
    def source(self) -> str | None:
        return self._source

    def __eq__(self, other: object) -> bool:
        """Equal values are equal configs, wherever they were loaded from (pydantic would
        also compare the private load-time attributes)."""
        if type(self) is not type(other):
            return NotImplemented
        return self.model_dump() == other.model_dump()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic's models

    @classmethod
    def init_from_dict(cls, data: dict[str, Any], source: str | None = None, *, checked: bool = True) -> Self:
        """Validate ``data``. ``checked=False`` checks each field now and the rules between
        fields when the config is used, as SimuMax's ``sanity_check`` does: a broken rule is
        kept (as an in-place edit's is) and raised by ``check()`` (every Estimate calls it)
        unless edits or overrides mend it first (``strategy.world_size = 64`` beside a file's
        tp 8 x pp 4; the CLI's ``--world-size`` / ``--gbs``)."""
        try:
            obj = cls.model_validate(data)
        except ValidationError as exc:
            err = config_error_from(exc, source, cls.model_fields)
            if checked:
                raise err from None
            try:  # a field's own error still raises here; a rule between fields waits
                obj = cls.model_validate(data, context={DEFER_RULES: True})
            except ValidationError as field_exc:
                raise config_error_from(field_exc, source, cls.model_fields) from None
            obj._pending = err
        obj._source = source
        return obj

    @classmethod
    def init_from_config_file(cls, path: str | Path) -> Self:
        """Load a SimuMax-format JSON file (the SimuMax tutorial's entry point); rules between
        fields are checked at use, as SimuMax does (``init_from_dict(checked=False)``)."""
        return cls.init_from_dict(read_json(path), source=str(path), checked=False)

    def with_updates(self, updates: dict[str, Any], source: str = "override") -> Self:
        """A validated copy with some fields replaced (``--set key=value``, model_overrides)."""
        data = self.model_dump()
        data.update(updates)
        return type(self).init_from_dict(data, source=source)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")
