"""The rest of SimuMax's PerfLLM surface (issue 21 part 2), as views over the one estimate.

``PerfLLM`` (simumax/api.py) inherits these; each reads the estimate, the op IR or the
search the package already has — no second cost path. Numbers are SI (seconds, bytes)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from simumax.config.checks import stage_layer_counts
from simumax.graph.kernels import Attention, Gemm, GroupGemm

if TYPE_CHECKING:
    from simumax.estimate import Estimate
    from simumax.search.evaluate import SearchRow


class SimuMaxPerfMethods:
    """Mixed into PerfLLM; ``_require()`` gives the estimate of the configs as they are."""

    def _require(self) -> "Estimate":  # pragma: no cover - PerfLLM's
        raise NotImplementedError

    # ---- pipeline ----------------------------------------------------------------------
    def get_pp_num_layers(self) -> list[int]:
        """Transformer layers on each pipeline stage."""
        est = self._require()
        return stage_layer_counts(est.model, est.strategy)

    def get_pp_stage_peak_mem(self, use_reserved_memory: bool = False) -> list[float]:
        """Peak bytes of each pipeline stage (allocated, or reserved = allocated / mem_factor)."""
        stages = self._require().memory().stages
        return [s.peak_mem_with_reserved if use_reserved_memory else s.peak_mem for s in stages]

    def calculate_1f1b_bubble(self) -> float:
        """Seconds the critical rank idles in the pipeline schedule (warm-up and drain)."""
        return self._require().cost().breakdown.get("bubble", 0.0)

    def export_pp_schedule_trace(self, save_path: str | Path) -> str:
        """The pipeline schedule as a Chrome / Perfetto trace (one lane per rank and stream)."""
        from simumax.simulate.outputs import simulate_to

        res = simulate_to(self._require(), Path(save_path), ops=False, gantt=False)
        return res.files["trace"]

    # ---- networks and kernels ------------------------------------------------------------
    def analysis_net(self) -> dict[str, dict[str, Any]]:
        """Per communication group: its size, the tier it runs on, whether it stays inside
        a node, and the tier's bandwidth per GPU (bytes/s)."""
        net = self._require().network
        out = {}
        for group, place in net.groups.items():
            tier = net.nets.tiers[place.tier]
            out[group] = {"size": place.size, "stride": place.stride, "tier": place.tier, "intra_node": place.intra_node,
                          "bandwidth": tier.bandwidth.gbps * tier.bytes_per_gb}
        return out

    def analysis_op_info(self, stage: int = 0) -> list[dict[str, Any]]:
        """Each op of one micro-batch on a pipeline stage's rank: its seconds per phase,
        FLOPs, parameters and saved activation bytes."""
        est = self._require()
        chunks = [c for c, s in zip(est.chunk_times, est.chunks) if s.index == stage] or est.chunk_times[:1]
        rows = []
        for chunk in chunks:
            for op, phases in chunk.op_times:
                rows.append({
                    "name": op.name, "module": op.module, "layer": op.layer, "params": op.params,
                    "saved_bytes": op.saved_bytes, "recompute_group": op.recompute_group,
                    "flops": {ph: t.flops for ph, t in phases.items()},
                    "time": {ph: t.total for ph, t in phases.items()},
                })
        return rows

    def analysis_gemm_costs(self) -> list[dict[str, Any]]:
        """Every distinct GEMM, grouped GEMM and attention kernel of the job: its table key,
        FLOPs, seconds, achieved efficiency, the family used and where its efficiency came
        from (measured / fitted / default), with how many times one iteration runs it."""
        est = self._require()
        cm = est.compute_model
        seen: dict[Any, dict[str, Any]] = {}
        for s in est.chunks:
            for op in s.ops:
                for ph in ("fwd", "bwd_input", "bwd_weight", "recompute"):
                    for k in op.kernels(ph):
                        if not isinstance(k, (Gemm, GroupGemm, Attention)):
                            continue
                        row = seen.get(k)
                        if row is None:
                            t, eff = cm.compute(k)
                            _, family, source = cm.seconds_and_source(k)
                            row = seen[k] = {"key": k.key, "family": family, "source": source, "flops": k.flops,
                                             "time": t, "efficiency": eff, "count": 0}
                        row["count"] += est.strategy.micro_batch_num
        return sorted(seen.values(), key=lambda r: -r["time"] * r["count"])

    # ---- searches around the configured strategy ----------------------------------------
    def _search_recompute(self, variants: list[str], gmi_error: float, use_reserved_memory: bool) -> list["SearchRow"]:
        from simumax.profiles import ProfileCache
        from simumax.search.evaluate import evaluate
        from simumax.search.space import NO_RECOMPUTE, RECOMPUTE_VARIANTS

        est = self._require()
        cache = ProfileCache(est.model, est.system)
        rows = []
        for v in variants:
            st = est.strategy.with_updates({**NO_RECOMPUTE, **RECOMPUTE_VARIANTS[v]}, source=f"recompute {v}")
            rows.append(evaluate(est.model, v, st, est.system, cache, gmi_error=gmi_error, use_reserved_memory=use_reserved_memory))
        return sorted(rows, key=lambda r: (not r.fits, r.iter_time if r.iter_time is not None else float("inf")))

    def search_best_recompute_layer_num(self, gmi_error: float = 0.0, use_reserved_memory: bool = True) -> int | None:
        """The fewest full-block recompute layers per stage with which the configured
        strategy fits (0: fits without recompute; None: does not fit even with every layer)."""
        no = self._search_recompute(["none"], gmi_error, use_reserved_memory)[0]
        if no.fits:
            return 0
        row = self._search_recompute(["full_block"], gmi_error, use_reserved_memory)[0]
        return row.recompute_layer_num if row.fits else None

    def search_best_selective_recompute(self, gmi_error: float = 0.0, use_reserved_memory: bool = True) -> "SearchRow":
        """The fastest of SimuMax's three selective flag sets that fits (else the least short)."""
        return self._search_recompute(["selective", "selective_norm", "selective_mlp"], gmi_error, use_reserved_memory)[0]

    def search_best_strategy_no_recompute(self, world_size: int, **kwargs: Any) -> list["SearchRow"]:
        """search_best_parallel_strategy without recompute."""
        kwargs["recompute_search_type"] = ["none"]
        return self.search_best_parallel_strategy(world_size, **kwargs)  # type: ignore[attr-defined]
