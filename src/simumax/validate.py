"""Run validation cases (real Megatron measurements) and compare with predictions."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simumax.config.base import check_readable_file, read_text
from simumax.config.loader import load_model, load_strategy, load_system
from simumax.config.model import ModelConfig
from simumax.config.strategy import StrategyConfig
from simumax.config.system import SystemConfig
from simumax.errors import ConfigError
from simumax.estimate import Estimate
from simumax.report.results import MemResult
from simumax.uncertainty import MEMORY_BAND
from simumax.validate_split import step_group

GIB = 2**30
CASE_KEYS = ("id", "system", "model", "strategy", "measured")
# the figures compared: each a positive number where a record gives it
FIGURE_KEYS = ("iter_time_ms", "tflops_per_gpu", "peak_alloc_gib", "peak_reserved_gib", "model_states_plus_activations_gib")


@dataclass(frozen=True, slots=True)
class CaseResult:
    id: str
    measured_time: float | None  # seconds
    predicted_time: float | None
    time_error: float | None  # (pred - real) / real
    reference_time_error: float | None  # SimuMax v1.2's error on the same case
    measured_mem: float | None  # bytes, peak allocated
    predicted_mem: float | None
    mem_error: float | None
    reference_mem_error: float | None
    skipped: str | None = None
    family: str = ""  # "dense" or "moe" (from the model config); "" when it did not load
    source: str = ""  # the case name's first token (narayanan21, megascale ...) or the file's suite
    # what measured_mem is: "peak_alloc" (max_memory_allocated) or "states_plus_activations"
    # (weights + grads + optimizer + stored activations of the first stage, no transients)
    mem_measure: str = "peak_alloc"
    # cases with the same model, GPU count, global batch and sequence answer the same
    # question with different strategies: what a search must rank
    group: str = ""
    time_band: tuple[float, float] | None = None  # the prediction's 80 % band, seconds
    mem_band: tuple[float, float] | None = None  # 80 % band of predicted_mem, bytes (uncertainty.MEMORY_BAND)
    # the run happened, but its recorded strategy does not fit the GPU in the memory model
    # (reserved bytes) while its measured peak, if any, does: the record misses a memory
    # setting or the model over-predicts (a measured peak above capacity says the system
    # file understates the GPU instead: not flagged)
    record_does_not_fit: bool = False
    # where measured_time comes from: "iter_time_ms", or "tflops_per_gpu" (SimuMax's FLOP
    # convention, Estimate.flops_6nd_with_attn per GPU over that rate); "" with no time
    time_from: str = ""
    micro_batches: int = 0  # the strategy's micro_batch_num (validate_split.py)
    step_group: str = ""  # the job less its micro-batch and GPU counts (validate_split.step_group)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _resolve(spec: Any, root: Path) -> Any:
    if isinstance(spec, str) and spec.endswith(".json"):
        p = Path(spec)
        return p if p.is_absolute() else root / p
    return spec


def relative_error(pred: float | None, real: float | None) -> float | None:
    """(pred - real) / real, the convention of every error simumax reports; None without both."""
    if pred is None or not real:
        return None
    return (pred - real) / real


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    check_readable_file(p, "a JSONL case file")
    cases = []
    for i, line in enumerate(read_text(p, "path").splitlines(), 1):
        if not line.strip():
            continue
        try:
            case = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"line {i}", f"not valid JSON ({exc.msg})", str(p)) from None
        if not isinstance(case, dict):
            raise ConfigError(f"line {i}", "a case must be a JSON object", str(p))
        missing = [k for k in CASE_KEYS if k not in case]
        if missing:
            raise ConfigError(f"line {i}", f"case lacks {', '.join(missing)} (schema: shared/validation/README.md)", str(p))
        for rec in ("measured", "reference_prediction"):
            figures = case.get(rec) or {}
            if not isinstance(figures, dict):
                raise ConfigError(f"line {i}: {rec}", "must be a JSON object", str(p))
            for key in FIGURE_KEYS:
                v = figures.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf):
                    raise ConfigError(f"line {i}: {rec}.{key}", f"must be a positive number (got {v!r})", str(p))
        cases.append(case)
    return cases


def append_case(path: str | Path, case: dict[str, Any]) -> None:
    """Add ``case`` as a line of the case file ``path`` (made if missing); an ``id`` the file
    already holds is refused, so a run is not recorded twice."""
    p = Path(path)
    if p.exists():
        known = {c["id"] for c in load_cases(p)}
        if case["id"] in known:
            raise ConfigError("id", f"{case['id']!r} is already in the file: give another", str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("a", encoding="utf-8") as f:
        f.write(json.dumps(case, allow_nan=False) + "\n")


def case_model_strategy(case: dict[str, Any], root: Path,
                        strategy: StrategyConfig | None = None) -> tuple[ModelConfig, StrategyConfig]:
    """The model (with the case's ``model_overrides``) and strategy of a case; config paths
    relative to ``root``; ``strategy``: the case's, when already read."""
    model = load_model(_resolve(case["model"], root))
    if case.get("model_overrides"):
        model = model.with_updates(case["model_overrides"], source=f"{case['id']} model_overrides")
    return model, strategy or load_strategy(_resolve(case["strategy"], root))


def case_system(case: dict[str, Any], root: Path) -> Any:
    """What the case's ``system`` names: a preset name, a path (relative to ``root``) or a dict."""
    return _resolve(case["system"], root)


def estimate_for_case(case: dict[str, Any], root: Path, system: SystemConfig | None = None,
                      strategy: StrategyConfig | None = None) -> Estimate:
    """The case's estimate; ``system``: run it there instead of on the system it names;
    ``strategy``: the case's, when already read."""
    model, strategy = case_model_strategy(case, root, strategy)
    return Estimate(model, strategy, system or load_system(case_system(case, root)))


def case_source(case_id: str) -> str:
    """Short source label of a case: the first token of its name after the suite
    (``public/narayanan21_t1_1.7B`` -> ``narayanan21``), else the suite; "" for a name
    without a suite (a user's runs: one summary, not one per run)."""
    suite, slash, name = case_id.partition("/")
    if not slash:
        return ""
    return name.split("_", 1)[0] if suite == "public" and name else suite


def ranking_group(case: dict[str, Any]) -> str:
    """Model (with its overrides), world size, global batch and sequence length of a case."""
    st = case.get("strategy", {})
    tp, pp, cp = st.get("tp_size", 1), st.get("pp_size", 1), st.get("cp_size", 1)
    world = st.get("world_size", 1)
    gbs = st.get("micro_batch_size", 1) * st.get("micro_batch_num", 1) * max(1, world // (tp * pp * cp))
    model = json.dumps([case.get("model"), case.get("model_overrides") or {}], sort_keys=True)
    return f"{model}|world={world}|gbs={gbs}|seq={st.get('seq_len')}"


def states_plus_stored_activations(est: Estimate, memory: MemResult | None = None) -> float:
    """Weights + gradients + optimizer states + the most stored activations the first
    pipeline stage holds (Korthikanti et al. 2022, Fig. 1: no temporary buffers);
    ``memory``: the estimate's, when already made."""
    s = (memory or est.memory()).stages[0]
    return s.weights + s.grads + s.optimizer + s.stored_activation_mem


# what a case's memory was measured as -> the ``measured`` key holding it (GiB)
MEMORY_MEASURES = {
    "peak_alloc": "peak_alloc_gib",  # max over ranks of torch.cuda.max_memory_allocated
    "peak_reserved": "peak_reserved_gib",  # torch.cuda.max_memory_reserved (torchtitan's "memory:" line)
    "states_plus_activations": "model_states_plus_activations_gib",  # Korthikanti'22 Fig. 1 bars
}
MEMORY_MEASURE_NAMES = {"max_memory_allocated": "peak_alloc", "allocated": "peak_alloc",
                        "max_memory_reserved": "peak_reserved", "reserved": "peak_reserved",
                        "model_states_plus_activations": "states_plus_activations"}


def memory_measure(case: dict[str, Any]) -> str:
    """The case's ``memory_measure`` when it states one, else the first of peak allocated,
    states + activations, peak reserved that its ``measured`` holds (peak allocated when none)."""
    stated = case.get("memory_measure")
    if stated is not None:
        name = MEMORY_MEASURE_NAMES.get(stated, stated)
        if name not in MEMORY_MEASURES:
            raise ConfigError("memory_measure", f"one of {', '.join(sorted(MEMORY_MEASURES))} (got {stated!r})",
                              source=str(case.get("id")))
        return name
    measured = case.get("measured", {})
    for name in ("peak_alloc", "states_plus_activations", "peak_reserved"):
        if measured.get(MEMORY_MEASURES[name]) is not None:
            return name
    return "peak_alloc"


def predicted_memory(est: Estimate, memory: MemResult, measure: str) -> float:
    """Bytes of the prediction (``memory``: the estimate's) comparable with a measurement
    of kind ``measure``."""
    if measure == "states_plus_activations":
        return states_plus_stored_activations(est, memory)
    if measure == "peak_reserved":
        return max(s.peak_mem_with_reserved for s in memory.stages)
    return memory.peak_mem


def _named_strategy(case: dict[str, Any], root: Path) -> StrategyConfig | None:
    """The strategy a case names by preset or file, read once for its fields and its
    estimate (None: given as a dict, or it does not load: the estimate then reports why)."""
    spec = case.get("strategy")
    if isinstance(spec, dict):
        return None
    try:
        return load_strategy(_resolve(spec, root))
    except ConfigError:
        return None


def run_case(case: dict[str, Any], root: Path, system: SystemConfig | None = None) -> CaseResult:
    """Predict one case. Time is compared when it has ``iter_time_ms``, or else
    ``tflops_per_gpu`` (SimuMax's convention, ``Estimate.flops_6nd_with_attn`` per GPU: the
    time is those FLOPs over that rate); memory as its ``memory_measure`` says (peak
    allocated by default; peak reserved; weights + grads + optimizer + stored activations)
    when ``measured`` holds that figure."""
    measured = case.get("measured", {})
    ref = case.get("reference_prediction", {})
    measure = memory_measure(case)
    mem_key = MEMORY_MEASURES[measure]
    real_m = measured.get(mem_key)
    real_m = real_m * GIB if real_m is not None else None
    ref_m = relative_error(ref.get(mem_key) and ref[mem_key] * GIB, real_m)
    # the grouping reads strategy fields: a strategy named by preset or file is read for them
    named = _named_strategy(case, root)
    given = case.get("strategy")
    fields = {**case, "strategy": given if isinstance(given, dict) else named.to_dict() if named else {}}
    source, group = case_source(case["id"]), ranking_group(fields)
    split = dict(micro_batches=int(fields["strategy"].get("micro_batch_num", 1)), step_group=step_group(fields))
    real_t = measured_seconds(measured)  # (a refused case reports its iteration time only)
    ref_t = relative_error(measured_seconds(ref), real_t)
    try:
        est = estimate_for_case(case, root, system, named)
        real_t = measured_seconds(measured, est)  # a time given as TFLOP/s too
        ref_t = relative_error(measured_seconds(ref, est), real_t)
        cost = est.cost() if real_t is not None else None
        t = cost.duration_time_per_iter if cost else None
        band = cost.duration_time_interval if cost else None
        memory = est.memory()
        mem = predicted_memory(est, memory, measure)
        # the band perf prints for the peak, about whichever figure the record measured
        mem_band = MEMORY_BAND.interval(mem) if real_m is not None else None
    except ConfigError as exc:
        return CaseResult(case["id"], real_t, None, None, ref_t, real_m, None, None, ref_m, skipped=str(exc), source=source, mem_measure=measure, group=group, **split)
    family = "moe" if est.model.is_moe else "dense"
    time_from = "" if real_t is None else "iter_time_ms" if measured.get("iter_time_ms") is not None else "tflops_per_gpu"
    return CaseResult(
        case["id"], real_t, t, relative_error(t, real_t), ref_t, real_m, mem, relative_error(mem, real_m), ref_m,
        family=family, source=source, mem_measure=measure, group=group, time_band=band, mem_band=mem_band, time_from=time_from, **split,
        record_does_not_fit=(real_t is not None and not memory.fits
                             and (real_m is None or real_m / (1.0 if measure == "peak_reserved" else est.strategy.mem_factor)
                                  <= memory.capacity)),
    )


def measured_seconds(record: dict[str, Any], est: Estimate | None = None) -> float | None:
    """A record's iteration time: ``iter_time_ms``, else (given the estimate) from
    ``tflops_per_gpu`` in SimuMax's FLOP convention; None with neither."""
    if record.get("iter_time_ms") is not None:
        return record["iter_time_ms"] / 1e3
    if est is not None and record.get("tflops_per_gpu"):
        return est.flops_6nd_with_attn() / est.strategy.world_size / (record["tflops_per_gpu"] * 1e12)
    return None


def default_reference_root(jsonl: Path) -> Path:
    """Where a case file's config paths are relative to: shared/reference for the files of
    shared/validation (a ``reference`` folder beside the file's folder), else the file's own
    folder (a user's runs beside their configs)."""
    here = jsonl.resolve().parent
    shared = here.parent / "reference"
    return shared if shared.is_dir() else here


def run_file(path: str | Path, reference_root: str | Path | None = None,
             system: SystemConfig | str | Path | None = None) -> list[CaseResult]:
    """Every case of the file; ``system``: every case on that system (a fitted one, another
    GPU) instead of the one it names."""
    p = Path(path)
    root = Path(reference_root) if reference_root else default_reference_root(p)
    on = load_system(system) if system is not None else None
    return [run_case(c, root, on) for c in load_cases(p)]


def summary(results: list[CaseResult]) -> dict[str, float | int | None]:
    def stats(xs: list[float]) -> tuple[float | None, float | None]:
        if not xs:
            return None, None
        a = [abs(x) for x in xs]
        return sum(a) / len(a), max(a)

    t = [r.time_error for r in results if r.time_error is not None]
    m = [r.mem_error for r in results if r.mem_error is not None]
    rt = [r.reference_time_error for r in results if r.reference_time_error is not None and r.time_error is not None]
    t_mean, t_max = stats(t)
    m_mean, m_max = stats(m)
    rt_mean, rt_max = stats(rt)
    banded = [r for r in results if r.time_band is not None and r.measured_time is not None and r.predicted_time]
    inside = [r.time_band[0] <= r.measured_time <= r.time_band[1] for r in banded]  # type: ignore[index, operator]
    widths = sorted((r.time_band[1] - r.time_band[0]) / r.predicted_time for r in banded)  # type: ignore[index, operator]
    mem_inside = [r.mem_band[0] <= r.measured_mem <= r.mem_band[1] for r in results  # type: ignore[operator]
                  if r.mem_band is not None and r.measured_mem is not None]
    return {
        "band_coverage": sum(inside) / len(inside) if inside else None,
        "band_median_width": widths[len(widths) // 2] if widths else None,
        "mem_band_coverage": sum(mem_inside) / len(mem_inside) if mem_inside else None,
        "cases": len(results),
        "evaluated": sum(1 for r in results if not r.skipped),
        "time_cases": len(t),
        "mem_cases": len(m),
        "skipped": sum(1 for r in results if r.skipped),
        "time_mean_abs_error": t_mean,
        "time_max_abs_error": t_max,
        "time_mean_error": sum(t) / len(t) if t else None,
        "mem_mean_abs_error": m_mean,
        "mem_mean_error": sum(m) / len(m) if m else None,
        "mem_max_abs_error": m_max,
        "reference_time_mean_abs_error": rt_mean,
        "reference_time_max_abs_error": rt_max,
    }


def _summary_by(results: list[CaseResult], attr: str) -> dict[str, dict[str, float | int | None]]:
    values = sorted({getattr(r, attr) for r in results if getattr(r, attr)})
    return {v: summary([r for r in results if getattr(r, attr) == v]) for v in values}


def summary_by_family(results: list[CaseResult]) -> dict[str, dict[str, float | int | None]]:
    """``summary`` of the dense and the MoE cases apart (the issues set targets per family)."""
    return _summary_by(results, "family")


def summary_by_source(results: list[CaseResult]) -> dict[str, dict[str, float | int | None]]:
    """``summary`` per source (``CaseResult.source``): a mechanism must not help one
    source by hurting another."""
    return _summary_by(results, "source")


def _ranks(xs: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson on the ranks); None when either side is constant."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return None if va == 0 or vb == 0 else cov / (va * vb) ** 0.5


def ranking(results: list[CaseResult]) -> dict[str, Any]:
    """Per group of cases that share model, GPU count, global batch and sequence (at least
    two with a time): Spearman of predicted vs real time, and the regret of picking the
    predicted-fastest (its real time over the really fastest's, minus 1). Means over groups."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        if r.time_error is not None:
            groups.setdefault(r.group, []).append(r)
    rows = []
    for key, rs in sorted(groups.items()):
        if len(rs) < 2:
            continue
        pred = [r.predicted_time for r in rs]
        real = [r.measured_time for r in rs]
        picked = min(range(len(rs)), key=lambda i: pred[i])
        rows.append({
            "group": key, "cases": [r.id for r in rs], "spearman": spearman(pred, real),  # type: ignore[arg-type]
            "regret": real[picked] / min(real) - 1.0,  # type: ignore[operator, type-var]
        })
    rhos = [g["spearman"] for g in rows if g["spearman"] is not None]
    regrets = [g["regret"] for g in rows]
    return {
        "groups": rows,
        "mean_spearman": sum(rhos) / len(rhos) if rhos else None,
        "mean_regret": sum(regrets) / len(regrets) if regrets else None,
        "max_regret": max(regrets) if regrets else None,
    }
