"""NVIDIA GPUs through NVML: the preflight before a run, and telemetry during windows.

The preflight refuses a host whose GPUs are not what the hardware profile says, or
are busy, unhealthy or throttling before anything runs (seed 004 section 3). The
sampler reads every GPU once a second; its averages go into the window row as
``gpu_util_avg_pct`` and ``power_avg_w``, which stay ``None`` when NVML is absent.

Xid errors: NVML keeps no history of them. The preflight therefore checks what an
Xid leaves behind in NVML (uncorrected ECC errors since the driver loaded, pending
or failed row remaps / retired pages), and the sampler subscribes to NVML's
critical-Xid events, so an Xid during a window is seen as it happens.

``pynvml`` is imported lazily (package ``nvidia-ml-py``): this module also imports
on machines without the NVIDIA driver, where :func:`nvml_available` is False.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from runner.errors import PreflightError
from runner.records import TelemetrySummary

if TYPE_CHECKING:
    from runner.config import Hardware

log = logging.getLogger("runner")

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
MEMORY_TOLERANCE = 0.05


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


def version_tuple(version: str) -> tuple[int, ...]:
    """``"580.159.03"`` -> ``(580, 159, 3)``; raises ValueError on anything else."""
    return tuple(int(part) for part in version.strip().split("."))


def version_at_least(version: str, minimum: str) -> bool:
    """Dotted versions compared numerically, missing parts counting as zero."""
    have, want = version_tuple(version), version_tuple(minimum)
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


def same_gpu_name(reported: str, expected: str) -> bool:
    """NVML says "NVIDIA H200"; a profile may say "H200". A different part ("H200 NVL") differs."""

    def normal(name: str) -> str:
        return " ".join(name.lower().removeprefix("nvidia").split())

    return normal(reported) == normal(expected)


def summarise_samples(samples: list[dict[str, Any]]) -> TelemetrySummary:
    """Averages over a window's samples; ``None`` (unavailable), never zero, when unread.

    ``gpu_util_avg_pct`` is the mean over all GPUs and ticks. ``power_avg_w`` is the
    mean over ticks of the GPUs' summed power (the power the run draws), taken over
    ticks where every GPU's power was read.
    """
    utils = [s["util_pct"] for s in samples if s.get("util_pct") is not None]
    by_tick: dict[int, list[float | None]] = defaultdict(list)
    for sample in samples:
        by_tick[sample["tick"]].append(sample.get("power_w"))
    gpus = len({sample["gpu"] for sample in samples})
    tick_power = [
        sum(powers)  # type: ignore[arg-type]
        for powers in by_tick.values()
        if len(powers) == gpus and all(p is not None for p in powers)
    ]
    throttled = any(
        (s.get("clock_event_reasons") or 0) & HARD_THROTTLE_MASK for s in samples
    )
    return TelemetrySummary(
        available=bool(samples),
        gpu_util_avg_pct=sum(utils) / len(utils) if utils else None,
        power_avg_w=sum(tick_power) / len(tick_power) if tick_power else None,
        samples=list(samples),
        throttled=throttled,
    )


# -- NVML --------------------------------------------------------------------------
def _nvml() -> Any:
    import pynvml

    return pynvml


def nvml_available() -> bool:
    """Whether NVML loads and initialises here (False on a machine without the driver)."""
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded
        return False
    nvml.nvmlShutdown()
    return True


def _read(call: Any, *args: Any) -> Any:
    """One NVML read; None where this GPU or driver does not support it."""
    nvml = _nvml()
    try:
        return call(*args)
    except nvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _clock_events(handle: Any) -> int | None:
    nvml = _nvml()
    # Renamed from "throttle reasons" in recent drivers; older bindings have only the old name.
    reader = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons"
    )
    return _read(reader, handle)


def _describe_gpu(index: int) -> dict[str, Any]:
    nvml = _nvml()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    capability = _read(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    processes = _read(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    power_limit = _read(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    events = _clock_events(handle)
    remapped = _read(nvml.nvmlDeviceGetRemappedRows, handle)
    return {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "memory_total_gib": round(memory.total / 2**30, 2),
        "memory_used_gib": round(memory.used / 2**30, 2),
        "compute_capability": list(capability) if capability else None,
        "power_limit_w": power_limit / 1000 if power_limit is not None else None,
        "temperature_c": _read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": events,
        "clock_event_names": decode_clock_events(events) if events is not None else None,
        "compute_processes": [
            {"pid": p.pid, "used_gib": round((p.usedGpuMemory or 0) / 2**30, 2)}
            for p in processes
            if p.pid != os.getpid()
        ],
        "ecc_uncorrected_volatile": _read(
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        ),
        # Hopper and later remap rows; older parts retire pages instead.
        "remapped_rows": (
            dict(zip(("correctable", "uncorrectable", "pending", "failure"), remapped))
            if remapped is not None
            else None
        ),
        "retired_pages_pending": _read(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle),
    }


def gpu_problems(gpu: dict[str, Any], hw: Hardware) -> list[str]:
    """Why one GPU (as :func:`_describe_gpu` reads it) does not fit the profile."""
    where = f"GPU {gpu['index']} ({gpu['name']})"
    problems = []
    if not same_gpu_name(gpu["name"], hw.gpu_name):
        problems.append(f"{where} is not a {hw.gpu_name}")
    total = gpu["memory_total_gib"]
    if abs(total - hw.memory_gib) > MEMORY_TOLERANCE * hw.memory_gib:
        problems.append(f"{where} has {total:.1f} GiB, the profile says {hw.memory_gib:g} GiB")
    capability = gpu["compute_capability"]
    if capability is not None and tuple(capability) != tuple(hw.compute_capability):
        problems.append(
            f"{where} has compute capability {capability[0]}.{capability[1]}, the profile "
            f"says {hw.compute_capability[0]}.{hw.compute_capability[1]}"
        )
    if gpu["compute_processes"]:
        pids = ", ".join(str(p["pid"]) for p in gpu["compute_processes"])
        problems.append(f"{where} is in use by other processes (pid {pids})")
    if gpu["clock_event_reasons"] and throttle_reasons(gpu["clock_event_reasons"]):
        reasons = ", ".join(throttle_reasons(gpu["clock_event_reasons"]))
        problems.append(f"{where} is throttling while idle ({reasons})")
    if gpu["ecc_uncorrected_volatile"]:
        problems.append(
            f"{where} has {gpu['ecc_uncorrected_volatile']} uncorrected ECC errors since "
            "the driver loaded (an Xid 48/63/64-class fault)"
        )
    remapped = gpu["remapped_rows"]
    if remapped and (remapped["pending"] or remapped["failure"]):
        problems.append(f"{where} has a pending or failed memory row remap (needs a GPU reset)")
    if gpu["retired_pages_pending"]:
        problems.append(f"{where} has retired memory pages pending a GPU reset")
    return problems


def preflight(hw: Hardware) -> dict[str, Any]:
    """Check the host's GPUs against the hardware profile; the facts go to the manifest.

    Raises PreflightError when NVML is missing or any GPU the run would use does not
    fit: count, name, memory, compute capability, driver, foreign processes, memory
    faults, or throttling while idle.
    """
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except Exception as exc:
        raise PreflightError(
            f"The hardware profile '{hw.name}' needs {hw.count} x {hw.gpu_name}, but NVML "
            f"cannot be loaded on this machine ({exc!r}): there is no NVIDIA driver here. "
            "Run GPU profiles on a GPU host, or leave hw unset to run the CPU profile."
        ) from exc
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = _read(nvml.nvmlSystemGetCudaDriverVersion_v2)
        count = nvml.nvmlDeviceGetCount()
        indices = hw.device_ids if hw.device_ids is not None else list(range(min(count, hw.count)))
        gpus = [_describe_gpu(index) for index in indices if index < count]
    except nvml.NVMLError as exc:
        raise PreflightError(f"NVML failed while reading the GPUs ({exc!r}).") from exc
    finally:
        nvml.nvmlShutdown()
    facts = {
        "nvml": True,
        "driver_version": driver,
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
        "gpu_count": count,
        "gpus": gpus,
        "xid_check": "no Xid history in NVML: ECC and row-remap state checked instead",
    }
    problems = []
    if count < hw.count or len(gpus) < hw.count:
        problems.append(f"{count} GPU(s) visible, the profile needs {hw.count}")
    if not version_at_least(driver, hw.min_driver):
        problems.append(f"driver {driver} is older than the profile's minimum {hw.min_driver}")
    for gpu in gpus:
        problems.extend(gpu_problems(gpu, hw))
    if problems:
        raise PreflightError(
            f"This machine does not match the hardware profile '{hw.name}': "
            f"{'; '.join(problems)}. A benchmark on the wrong, busy or unhealthy GPU "
            "measures the wrong thing (seed 004 section 3): fix the host or choose the "
            "profile that describes it."
        )
    log.info("GPU preflight passed: %d x %s, driver %s", len(gpus), gpus[0]["name"], driver)
    return facts


class GpuSampler:
    """Reads every GPU about once a second in a thread: ``start()``, then ``stop()``.

    Without NVML, ``stop()`` returns a summary marked unavailable (figures ``None``).
    Critical Xid events seen meanwhile are kept in ``xid_events`` and logged.
    """

    def __init__(self, device_indices: list[int] | None = None, interval_s: float = 1.0) -> None:
        self.device_indices = device_indices
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.xid_events: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not nvml_available():
            log.info("GPU telemetry unavailable: NVML cannot be loaded here")
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> TelemetrySummary:
        if self._thread is None:
            return TelemetrySummary(available=False, gpu_util_avg_pct=None, power_avg_w=None)
        self._stop.set()
        self._thread.join(timeout=10 * self.interval_s + 5)
        self._thread = None
        return summarise_samples(self.samples)

    def _run(self) -> None:
        nvml = _nvml()
        nvml.nvmlInit()
        try:
            indices = self.device_indices
            if indices is None:
                indices = list(range(nvml.nvmlDeviceGetCount()))
            handles = {index: nvml.nvmlDeviceGetHandleByIndex(index) for index in indices}
            events = self._subscribe_xid(handles)
            started, tick = time.monotonic(), 0
            while not self._stop.is_set():
                now = round(time.monotonic() - started, 3)
                for index, handle in handles.items():
                    self.samples.append(_sample(handle, index, tick, now))
                tick += 1
                self._wait(events, started + tick * self.interval_s - time.monotonic())
            if events is not None:
                nvml.nvmlEventSetFree(events)
        finally:
            nvml.nvmlShutdown()

    def _subscribe_xid(self, handles: dict[int, Any]) -> Any:
        nvml = _nvml()
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in handles.values():
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
        except nvml.NVMLError as exc:
            log.debug("Xid events not available here: %s", exc)
            return None
        return events

    def _wait(self, events: Any, seconds: float) -> None:
        """Sleep until the next tick; with Xid events subscribed, wait on them instead."""
        if seconds <= 0:
            return
        if events is None:
            self._stop.wait(seconds)
            return
        nvml = _nvml()
        try:
            event = nvml.nvmlEventSetWait_v2(events, int(seconds * 1000))
        except nvml.NVMLError:
            return  # NVML_ERROR_TIMEOUT: no Xid during this tick
        xid = {"xid": int(event.eventData), "uuid": _text(nvml.nvmlDeviceGetUUID(event.device))}
        self.xid_events.append(xid)
        log.warning("GPU %s reported Xid %d during the window", xid["uuid"], xid["xid"])


def _sample(handle: Any, index: int, tick: int, elapsed_s: float) -> dict[str, Any]:
    nvml = _nvml()
    utilization = _read(nvml.nvmlDeviceGetUtilizationRates, handle)
    memory = _read(nvml.nvmlDeviceGetMemoryInfo, handle)
    power_mw = _read(nvml.nvmlDeviceGetPowerUsage, handle)
    return {
        "tick": tick,
        "t_s": elapsed_s,
        "gpu": index,
        "util_pct": utilization.gpu if utilization is not None else None,
        "memory_used_gib": round(memory.used / 2**30, 3) if memory is not None else None,
        "power_w": power_mw / 1000 if power_mw is not None else None,
        "temperature_c": _read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": _read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "clock_event_reasons": _clock_events(handle),
    }
