"""Clock, power and throttle readings of GPU 0 through NVML (nvidia-ml-py), when present.

What the power-limited-clock measurements report beside their timings (docs/calibration.md,
"Power-limited clocks"); every function returns nothing rather than fail where NVML is
missing (CPU runs, other vendors).
"""

from __future__ import annotations

import statistics
from typing import Any

SW_POWER_CAP = 0x4  # nvmlClocksThrottleReasonSwPowerCap


def open_device(index: int = 0) -> tuple[Any, Any]:
    """(pynvml module, device handle), or (None, None) without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - readings are optional: no package, no driver, no GPU
        return None, None


def reading(nv: Any, handle: Any) -> dict[str, Any]:
    """SM and memory clock (MHz), board power (W), temperature (C), throttle-reason bits."""
    if nv is None:
        return {}
    return {
        "sm_mhz": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
        "mem_mhz": nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_MEM),
        "power_w": nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "temp_c": nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "throttle": int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
    }


def summary(readings: list[dict[str, Any]]) -> dict[str, float] | None:
    """Median SM clock and power, and the share of readings under the software power cap."""
    rows = [r for r in readings if r]
    if not rows:
        return None
    return {"sm_mhz": statistics.median(r["sm_mhz"] for r in rows),
            "power_w": statistics.median(r["power_w"] for r in rows),
            "power_capped_share": sum(1 for r in rows if r["throttle"] & SW_POWER_CAP) / len(rows)}
