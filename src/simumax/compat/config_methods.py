"""SimuMax's config methods (issue 21 part 2), mixed into our config classes. Each is a
thin view: counts and FLOPs come from the one estimate of the model on one device.
Imports of the estimate are local: the config modules import this one."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any, Self

from simumax.errors import ConfigError

if TYPE_CHECKING:
    from simumax.estimate import Estimate

# "tp2_pp1_dp4_mbs1", "ep8-pp2-vp2-mbc16": size tokens of SimuMax's preset names
_TOKEN = re.compile(r"(tp|pp|dp|cp|ep|etp|vp|mbs|mbc|gbs|seq)(\d+)")
_FIELDS = {"tp": "tp_size", "pp": "pp_size", "cp": "cp_size", "ep": "ep_size", "etp": "etp_size", "vp": "interleaving_size",
           "mbs": "micro_batch_size", "mbc": "micro_batch_num", "seq": "seq_len"}


class SimuMaxConfigMethods:
    """Shared by the three configs."""

    @classmethod
    def read_json_file(cls, path: str) -> Self:
        return cls.init_from_config_file(path)  # type: ignore[attr-defined]

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2)  # type: ignore[attr-defined]


class SimuMaxStrategyMethods(SimuMaxConfigMethods):
    @classmethod
    def init_from_format_strings(cls, text: str, **fields: Any) -> Self:
        """A strategy from a preset-style name, ``tp2_pp1_dp4_mbs1`` (tp, pp, dp, cp, ep, etp,
        vp, mbs, mbc, gbs, seq followed by a number; world size tp*cp*pp*dp), with further
        fields as keywords (``seq_len`` defaults to 4096)."""
        found = dict((k, int(v)) for k, v in _TOKEN.findall(text.lower()))
        if not found:
            raise ConfigError("strategy", f"no size in {text!r} (expected e.g. tp2_pp1_dp4_mbs1)")
        data: dict[str, Any] = {"seq_len": 4096, **{_FIELDS[k]: v for k, v in found.items() if k in _FIELDS}}
        tp, pp, cp = data.get("tp_size", 1), data.get("pp_size", 1), data.get("cp_size", 1)
        data["world_size"] = tp * pp * cp * found.get("dp", 1)
        if "gbs" in found:
            per = data.get("micro_batch_size", 1) * found.get("dp", 1)
            if found["gbs"] % per:
                raise ConfigError("gbs", f"{found['gbs']} is not a multiple of mbs x dp = {per}")
            data["micro_batch_num"] = found["gbs"] // per
        if data.get("interleaving_size", 1) > 1:
            data.setdefault("pp_schedule", "interleaved")
        data["enable_sequence_parallel"] = tp > 1
        data.update(fields)
        return cls.init_from_dict(data, source=text)  # type: ignore[attr-defined]

    @property
    def parallelism(self) -> str:
        """``tp2_cp1_pp1_dp4_ep1_etp1_vp1_mbs1_mbc8``: the sizes in one string."""
        s: Any = self
        return (f"tp{s.tp_size}_cp{s.cp_size}_pp{s.pp_size}_dp{s.dp_size}_ep{s.ep_size}_etp{s.etp_size}_"
                f"vp{s.interleaving_size}_mbs{s.micro_batch_size}_mbc{s.micro_batch_num}")

    @property
    def recompute_status(self) -> str:
        """none, full_block (n layers), selective (the recomputed parts) or megatron modules."""
        s: Any = self
        mode = s.recompute_mode
        if mode == "full_block" and s.recompute_method == "uniform":
            return f"full_block (all layers, uniform groups of {s.recompute_group_layers})"
        if mode == "full_block":
            n = s.recompute_layer_num
            return f"full_block ({'all' if n is None else n} layers)"
        if mode == "selective":
            if s.recompute_granularity != "selective_recompute":
                return s.recompute_granularity
            flags = [f for f in ("attn_recompute", "mlp_recompute", "mlp_rms_recompute", "mla_rms_recompute") if getattr(s, f)]
            return "selective (" + ", ".join(flags) + ")"
        if mode == "megatron":
            return "megatron (" + ", ".join(s.megatron_recompute_modules) + ")"
        return "none"

    def sanity_check(self, model: Any = None, system: Any = None) -> None:
        """Raise the ConfigError of a broken rule: the strategy's own rules, and with a model
        (and a system) the rules between them."""
        s: Any = self
        s.check()
        type(s).init_from_dict(s.model_dump(), source="sanity_check")
        if model is not None:
            from simumax.config.checks import check_compatible
            from simumax.config.loader import load_system

            check_compatible(model, s, system if system is not None else load_system("a100_pcie"))


class SimuMaxModelMethods(SimuMaxConfigMethods):
    def _single_device(self, seq_len: int) -> "Estimate":
        from simumax.config.loader import load_system
        from simumax.config.strategy import StrategyConfig
        from simumax.estimate import Estimate

        one = StrategyConfig.init_from_dict({"seq_len": seq_len, "world_size": 1}, source="one device")
        return Estimate(self, one, load_system("a100_pcie"))  # type: ignore[arg-type]

    def param_numel(self) -> int:
        """Parameters of the whole model (every expert)."""
        return self._single_device(4096).params.total

    def activated_param_numel(self) -> int:
        """Parameters one token goes through (top-k of the routed experts)."""
        return self._single_device(4096).params.active

    def flops_per_token(self, seq_len: int = 4096) -> float:
        """Training FLOPs per token (forward and backward, causal attention counted half)."""
        est = self._single_device(seq_len)
        return est.model_flops_per_iter() / seq_len

    def maybe_pad_vocab_size(self, tp_size: int = 1) -> int:
        """The padded vocabulary Megatron builds for this TP size (the config keeps the
        tokenizer's; padding is applied wherever the vocabulary is used)."""
        return self.padded_vocab(tp_size)  # type: ignore[attr-defined]

    def set_vocab_size(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size  # type: ignore[attr-defined]


class SimuMaxSystemMethods(SimuMaxConfigMethods):
    """SimuMax's SystemConfig queries, answered by the one cost model (cost/efficiency.py,
    cost/network.py). Seconds and bytes per second."""

    def _op_spec(self, op_name: str) -> Any:
        ops = self.accelerator.op  # type: ignore[attr-defined]
        if op_name not in ops:
            raise ConfigError("op_name", f"{op_name!r} is not a kernel family of this system ({', '.join(sorted(ops))})")
        return ops[op_name]

    def compute_op_accuracy_time(self, op_name: str, key: str, flops: float) -> float:
        """Seconds of a kernel of family ``op_name`` (``matmul``, ``sdp_fwd`` ...) with table
        key ``key`` doing ``flops`` FLOPs in the table's convention: the measured
        efficiency when the table holds the key, else the fitted or default one."""
        from simumax.cost.efficiency import ComputeModel

        spec = self._op_spec(op_name)
        if flops < 0:
            raise ConfigError("flops", f"must be >= 0 (got {flops})")
        eff, _, _ = ComputeModel(self).efficiency(op_name, key)  # type: ignore[arg-type]
        return flops / (spec.tflops * 1e12 * eff)

    def miss_efficiency(self, op_name: str, key: str) -> float:
        """The efficiency ``key`` gets when the table misses it: fitted from the other
        measured shapes (the key's own entry left out) or the family's default curve."""
        from simumax.cost.efficiency import ComputeModel
        from simumax.cost.efficiency_fit import TableFit, default_curve, parse_key

        spec = self._op_spec(op_name)
        table = spec.accurate_efficient_factor
        if key not in table:
            return ComputeModel(self).efficiency(op_name, key)[0]  # type: ignore[arg-type]
        sm = self.accelerator.sm_count  # type: ignore[attr-defined]
        fitted = TableFit({k: v for k, v in table.items() if k != key}, sm).predict(key)
        return fitted if fitted is not None else default_curve(parse_key(key)[1], spec.efficient_factor, sm)

    def real_comm_bw(self, comm_type: str, size: float, comm_num: int, net: str | None = None) -> float:
        """Bus bandwidth (bytes/s, NCCL's definition) a ``comm_type`` collective of ``size``
        bytes over ``comm_num`` consecutive ranks achieves in the network model, latency
        included: as one ring on the tier ``net`` if named, else on what the group's
        placement picks (inside a node / across nodes, hierarchical when it spans nodes)."""
        from simumax.config.strategy import StrategyConfig
        from simumax.cost.network import DEFAULT_SPECS, NetworkModel, ring_bytes, tier_time
        from simumax.graph.kernels import Collective

        if comm_type not in DEFAULT_SPECS:
            raise ConfigError("comm_type", f"{comm_type!r} is not one of {', '.join(DEFAULT_SPECS)}")
        if not isinstance(comm_num, int) or comm_num < 1:
            raise ConfigError("comm_num", f"must be an integer >= 1 (got {comm_num!r})")
        if size <= 0:
            raise ConfigError("size", f"must be > 0 bytes (got {size})")
        tiers = self.networks.tiers  # type: ignore[attr-defined]
        if net is not None and net not in tiers:
            raise ConfigError("net", f"{net!r} is not a tier of this system ({', '.join(sorted(tiers))})")
        if comm_num == 1 and comm_type != "p2p":
            return float("inf")  # nothing crosses a link
        if net is not None:
            t = tier_time(tiers[net], comm_type, float(size), comm_num)
        else:
            group = StrategyConfig.init_from_dict({"seq_len": 4096, "world_size": comm_num, "tp_size": comm_num},
                                                  source="real_comm_bw")
            t = NetworkModel(self, group).time(Collective(comm_type, float(size), "tp"))  # type: ignore[arg-type]
        spec = DEFAULT_SPECS[comm_type]
        return ring_bytes(float(size), comm_num, spec.scale, spec.offset) / t
