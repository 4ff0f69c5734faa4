"""Regenerate docs/configs.md from the pydantic schemas: python docs/make_config_docs.py"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from simumax.config.system import (
    AcceleratorConfig, BandwidthSpec, CollectiveSpec, ComputeOpSpec, NetworkTier, NetworksConfig, SystemConfig,
)
from simumax import ModelConfig, StrategyConfig

SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("Model config (`models/*.json`)", ModelConfig),
    ("Strategy config (`strategy/*.json`)", StrategyConfig),
    ("System config (`system/*.json`)", SystemConfig),
    ("system.accelerator", AcceleratorConfig),
    ("system.accelerator.op.<family>", ComputeOpSpec),
    ("system.accelerator.bandwidth.<family> and tier bandwidth", BandwidthSpec),
    ("system.networks (tiers stored flat beside `intra_with_pcie`)", NetworksConfig),
    ("system.networks.<tier>", NetworkTier),
    ("system.networks.<tier>.op.<collective>", CollectiveSpec),
]


def render() -> str:
    out = [
        "# Config formats",
        "",
        "Generated from the schemas by `docs/make_config_docs.py`; do not edit by hand.",
        "Field names are SimuMax's, so its JSON files load unchanged. Unknown fields are errors.",
        "Units: sizes in elements, bandwidths in GB/s (1e9 B/s), latencies in microseconds,",
        "memory in GiB (`mem_gbs`). Results are SI (seconds, bytes).",
        "",
    ]
    for title, cls in SECTIONS:
        out += [f"## {title}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, f in cls.model_fields.items():
            default = "required" if f.is_required() else repr(f.get_default(call_default_factory=True))
            ann = getattr(f.annotation, "__name__", None) or str(f.annotation).replace("typing.", "")
            out.append(f"| `{name}` | `{ann}` | `{default}` | {f.description or ''} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    Path(__file__).with_name("configs.md").write_text(render())
