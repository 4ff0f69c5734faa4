"""Write the hardware presets of simumax.config.hardware to config/presets/system/:
python docs/make_hardware_presets.py (a test checks the files are current)."""

from __future__ import annotations

import json
from pathlib import Path

from simumax.config.hardware import GPUS, build

PRESETS = Path(__file__).resolve().parent.parent / "src" / "simumax" / "config" / "presets" / "system"


def render() -> dict[str, str]:
    out = {}
    for gpu in GPUS:
        measured = json.loads((PRESETS / f"{gpu.measured_base}.json").read_text()) if gpu.measured_base else None
        out[f"{gpu.name}.json"] = json.dumps(build(gpu, measured), indent=2) + "\n"
    return out


if __name__ == "__main__":
    for name, text in render().items():
        (PRESETS / name).write_text(text)
