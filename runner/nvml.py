"""NVIDIA's management library (NVML), shared by the GPU preflight and the telemetry.

``pynvml`` (package ``nvidia-ml-py``) imports on machines without the NVIDIA driver;
there NVML fails to initialise and :func:`nvml_available` is False.
"""

from __future__ import annotations

from typing import Any

import pynvml

# nvmlClocksEventReasons bits (nvml.h). Idle, application clocks, sync boost and
# display clocks are the GPU being asked for less, not the GPU holding itself back.
CLOCK_EVENT_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


# Under full load the GPU sitting at its power limit is normal; only these mean the
# hardware or temperature held the clocks down during a window.
HARD_THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80


# -- pure helpers ------------------------------------------------------------------
def decode_clock_events(bits: int) -> list[str]:
    """Names of the clock-event reason bits set in ``bits`` (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_BITS.items() if bits & bit]
    unknown = bits & ~sum(CLOCK_EVENT_BITS)
    if unknown:
        names.append(hex(unknown))
    return names


def throttle_reasons(bits: int, mask: int = THROTTLE_MASK) -> list[str]:
    """The reasons in ``bits`` that mean the GPU is throttling (idle is not)."""
    return decode_clock_events(bits & mask)


# -- NVML --------------------------------------------------------------------------
def load() -> Any:
    return pynvml


def nvml_available() -> bool:
    """Whether NVML loads and initialises here (False on a machine without the driver)."""
    try:
        nvml = load()
        nvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded
        return False
    nvml.nvmlShutdown()
    return True


def read(call: Any, *args: Any) -> Any:
    """One NVML read; None where this GPU or driver does not support it."""
    nvml = load()
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def clock_events(handle: Any) -> int | None:
    nvml = load()
    # Renamed from "throttle reasons" in recent drivers; older bindings have only the old name.
    reader = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    return read(reader, handle)
