"""Efficiency for shapes the measured table lacks: a fit over the table's own entries (b),
else a documented default curve (c). ComputeModel uses: (a) the exact measured entry,
(b) ``TableFit.predict``, (c) ``default_curve``.

(b) Shapes are parsed from the SimuMax table keys. Entries of the same class (GEMM: layout,
accumulation and output dtype; grouped GEMM: stage and dtype; attention: causal or not) are
compared in log2 space of their sizes (GEMM: b, m, n, k; grouped: ng, M, N, K; attention:
batch x heads, seq_len, kv_seq_len, query heads per kv head, head dims — a flash kernel's
grid runs batch x heads x query tiles, so batch and heads are one parallel dimension to
it). The prediction is the wave-quantisation and size-saturation baseline of (c) times
the inverse-distance-weighted mean of the nearest entries' measured / baseline ratios: the
baseline carries what the shape itself implies (partial last wave of tiles, small-problem
saturation), the neighbours what the hardware and library do that the baseline does not know;
it never exceeds the best efficiency measured in the pool it was fitted from.

(c) eff = family efficient_factor x wave(m, n) x saturation(FLOPs): the configured
fallback becomes the asymptote of a curve instead of a constant. wave = tiles / (waves x
SMs) with 128 x 256 output tiles over ``sm_count`` SMs (1 when unknown); saturation =
F / (F + F_half) with F_half = 2·256³ FLOPs (a problem that fills one SM's tile once),
normalised so a 8192³ GEMM gets the full factor.
"""

from __future__ import annotations

import math

NUMERIC = ("b", "m", "n", "k", "ng", "M", "N", "K", "batch", "seq_len", "kv_seq_len", "head_num", "kv_head_num", "qk_head_dim", "v_head_dim")
TILE_M, TILE_N = 128, 256
F_HALF = 2.0 * 256**3
F_REF = 2.0 * 8192**3
MIN_FIT_ENTRIES = 3  # a fit needs this many measured entries (of the shape's class, else of the table)
# the inner dimension counts half in the distance: output tiles set the parallelism, K only
# the length of each tile's loop (chosen by the hidden-20 % cross-validation, tests/test_efficiency_fit.py)
DIM_WEIGHTS: dict[str, float] = {"k": 0.5, "K": 0.5}


_NUMERIC = frozenset(NUMERIC)
_CLASS_FIELDS = ("layout", "accumulate", "out_dtype", "stage", "dtype", "causal")
_CLASS_RANK = {name: i for i, name in enumerate(_CLASS_FIELDS)}


def parse_key(key: str) -> tuple[tuple[str, ...], dict[str, float]]:
    """(class, sizes) of a SimuMax table key (``b=1, m=4096, ..., layout=TN``), in one pass
    over its fields: the class is the ``name=value`` texts of the class fields (layout,
    accumulation, output dtype; stage and dtype for grouped GEMMs; ``causal=False`` for a
    non-causal attention block) in that order, the sizes the numeric fields as floats."""
    cls: list[str] = []
    sizes: dict[str, float] = {}
    causal = True
    for part in key.split(", "):
        name, eq, value = part.partition("=")
        if not eq:
            continue
        if name in _NUMERIC:
            sizes[name] = float(value)
        elif name == "causal":
            causal = value != "False"
            if not causal:  # a non-causal block runs at its own work rate: its own class
                cls.append("causal=False")
        elif name in _CLASS_RANK:
            cls.append(part)
    if len(cls) > 1:
        cls.sort(key=lambda part: _CLASS_RANK[part.partition("=")[0]])
    if "seq_len" in sizes:
        sizes.setdefault("kv_seq_len", sizes["seq_len"])
        if not causal:
            # a non-causal attention block (context-parallel steps; SimuMax's keys are all
            # causal): 0, so the log-size distance leaves it out and baseline() sees it
            sizes["causal"] = 0.0
    return tuple(cls), sizes


def fit_coordinates(sizes: dict[str, float]) -> dict[str, float]:
    """log2 of the sizes the distance compares: a GEMM's own; an attention kernel's batch x
    heads (``bh``: cuDNN's and FlashAttention's grid is batch x heads x query tiles, the kernel
    does not tell batch from heads), query heads per kv head (``group``), sequence lengths and
    head dims. Measured on an H100 (docs/calibration.md, "Attention shapes"): batch 4 x 16
    heads ran 21-25 % faster than the batch-1 16-head entries, near 64 heads' rate."""
    if "seq_len" in sizes:
        heads = sizes["head_num"]
        coords = {n: v for n, v in sizes.items() if n not in ("batch", "head_num", "kv_head_num")}
        coords["bh"] = sizes.get("batch", 1.0) * heads
        coords["group"] = heads / sizes.get("kv_head_num", heads)
        sizes = coords
    return {n: math.log2(v) for n, v in sizes.items() if v > 0}


def _gemm_dims(s: dict[str, float]) -> tuple[float, float, float, float]:
    """(rows, cols, inner, FLOPs) of a GEMM-like shape (grouped: all groups; attention:
    the score product per batch x head)."""
    if "m" in s:
        return s["m"], s["n"], s["k"], 2.0 * s.get("b", 1) * s["m"] * s["n"] * s["k"]
    if "M" in s:
        return s["M"], s["N"], s["K"], 2.0 * s["ng"] * s["M"] * s["N"] * s["K"]
    q, kv = s["seq_len"], s["kv_seq_len"]
    bh = s["batch"] * s["head_num"]
    return q, kv, s["qk_head_dim"], 2.0 * bh * q * kv * (s["qk_head_dim"] + s["v_head_dim"])


def wave_fraction(sizes: dict[str, float], sm_count: int | None) -> float:
    """Busy share of the SMs over the kernel's waves of 128 x 256 output tiles (1 when the
    SM count is unknown, and for flash attention, which tiles over batch, heads and sequence)."""
    if not sm_count or "seq_len" in sizes:
        return 1.0
    rows, cols, _, _ = _gemm_dims(sizes)
    groups = sizes.get("b", 1) * sizes.get("ng", 1)
    tiles = groups * math.ceil(rows / TILE_M) * math.ceil(cols / TILE_N)
    return tiles / (math.ceil(tiles / sm_count) * sm_count)


def baseline(sizes: dict[str, float], sm_count: int | None) -> float:
    """Wave quantisation x size saturation, 1 for a large well-shaped GEMM.

    Attention efficiencies are in the tables' convention, FLOPs over the whole score matrix:
    a causal kernel computes only (s + 1) / 2s of them (flash attention skips the masked
    blocks), so at the same work rate a non-causal block's convention efficiency is that
    share of a causal kernel's. Every table entry is causal, so without this a non-causal
    block fitted from them (or read off a causal asymptote) would run twice as fast as
    the hardware does."""
    flops = _gemm_dims(sizes)[3]
    sat = flops / (flops + F_HALF)
    share = 1.0
    if sizes.get("causal", 1.0) == 0.0:
        share = (sizes["seq_len"] + 1) / (2 * sizes["seq_len"])
    return wave_fraction(sizes, sm_count) * sat / (F_REF / (F_REF + F_HALF)) * share


def default_curve(sizes: dict[str, float], asymptote: float, sm_count: int | None) -> float:
    """(c): the family's configured efficiency as the asymptote of the baseline curve."""
    return asymptote * baseline(sizes, sm_count)


class _Pool:
    """Measured entries a shape is compared with (one class, or the whole table): their
    ratios to the baseline, and their log2 sizes times sqrt(weight) over the sorted union
    ``names`` of the pool's size names (0 where an entry lacks one, as log2 1)."""

    __slots__ = ("names", "index", "vecs", "ratios", "best")

    def __init__(self, rows: list[tuple[dict[str, float], float]], root_w: dict[str, float], best: float) -> None:
        self.best = best  # the highest efficiency measured among the pool's entries
        self.names = tuple(sorted({n for logs, _ in rows for n in logs}))
        self.index = {n: i for i, n in enumerate(self.names)}
        roots = [root_w.get(n, 1.0) for n in self.names]
        self.vecs = [tuple([r * logs.get(n, 0.0) for n, r in zip(self.names, roots)]) for logs, _ in rows]
        self.ratios = [ratio for _, ratio in rows]


class TableFit:
    """(b): nearest measured entries of the same class, in log2 size space.

    Keys are parsed and grouped by class up front; a class's baselines and log vectors are
    made when a shape of that class is first predicted. Distances are Euclidean over the
    pool's size names scaled by sqrt(weight), a name one shape lacks counting as log2 1 = 0
    (a name both lack adds nothing)."""

    def __init__(self, table: dict[str, float], sm_count: int | None, neighbours: int = 4,
                 weights: dict[str, float] | None = None) -> None:
        self.sm_count = sm_count
        self.k = neighbours
        self.w = DIM_WEIGHTS if weights is None else weights
        self._root_w = {n: math.sqrt(v) for n, v in self.w.items()}
        self._predicted: dict[str, float | None] = {}  # key -> predict(key)
        # class -> [(table position, efficiency, sizes)], table order
        self._keys: dict[tuple[str, ...], list[tuple[int, float, dict[str, float]]]] = {}
        for i, (key, eff) in enumerate(table.items()):
            if eff > 0:
                cls, sizes = parse_key(key)
                self._keys.setdefault(cls, []).append((i, eff, sizes))
        self._pools: dict[tuple[str, ...] | None, _Pool] = {}  # class (None: every entry) -> pool

    def _rows(self, entries: list[tuple[int, float, dict[str, float]]]) -> list[tuple[dict[str, float], float]]:
        """(log2 sizes, measured / baseline) of entries whose baseline is positive."""
        rows = []
        for _, eff, sizes in entries:
            base = baseline(sizes, self.sm_count)
            if base > 0:
                rows.append((fit_coordinates(sizes), eff / base))
        return rows

    def _pool(self, cls: tuple[str, ...] | None) -> _Pool:
        got = self._pools.get(cls)
        if got is None:
            if cls is None:  # every entry, in table order
                entries = sorted((e for es in self._keys.values() for e in es), key=lambda e: e[0])
            else:
                entries = self._keys.get(cls, [])
            got = self._pools[cls] = _Pool(self._rows(entries), self._root_w, max((e[1] for e in entries), default=0.0))
        return got

    def predict(self, key: str) -> float | None:
        """Fitted efficiency for ``key``, or None when the table has too little to fit."""
        if key not in self._predicted:
            self._predicted[key] = self._predict(key)
        return self._predicted[key]

    def _predict(self, key: str) -> float | None:
        cls, sizes = parse_key(key)
        pool = self._pool(cls)
        if len(pool.ratios) < MIN_FIT_ENTRIES:
            pool = self._pool(None)
            if len(pool.ratios) < MIN_FIT_ENTRIES:
                return None
        logs = fit_coordinates(sizes)
        root = self._root_w
        vecs = pool.vecs
        extra = sorted(n for n in logs if n not in pool.index)
        if extra:  # names no entry of the pool has: each entry is 0 there
            names = pool.names + tuple(extra)
            zeros = (0.0,) * len(extra)
            vecs = [v + zeros for v in vecs]
        else:
            names = pool.names
        query = [root.get(n, 1.0) * logs.get(n, 0.0) for n in names]
        dist = math.dist
        d2 = [d * d for d in [dist(query, v) for v in vecs]]
        near = sorted(range(len(d2)), key=d2.__getitem__)[: self.k]  # stable: table order on ties
        ratios = pool.ratios
        if d2[near[0]] == 0.0:
            ratio = ratios[near[0]]
        else:
            w = [1.0 / d2[i] for i in near]
            ratio = sum(wi * ratios[i] for wi, i in zip(w, near)) / sum(w)
        # a neighbour's ratio to its baseline carried to a shape whose baseline is near 1 (a
        # batch of small products fills every SM) can exceed any measured rate: no fitted
        # shape runs faster than the fastest shape of its pool the table measured
        return min(ratio * baseline(sizes, self.sm_count), pool.best)
