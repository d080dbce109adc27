"""GPU telemetry during a window: every GPU read about once a second through NVML.

The averages go into the window row as ``gpu_util_avg_pct`` and ``power_avg_w``, which
stay ``None`` when NVML is absent; each GPU's own figures go into the window's detail.
Power comes from NVML's energy counter (millijoules since the driver loaded) read when
the window opens and closes: a 1 Hz power read is one instant, the counter the whole
window.

NVML keeps no history of Xid errors, so the sampler subscribes to NVML's critical-Xid
events and an Xid during a window is seen as it happens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

from runner.measure.records import GpuFigures, PowerSource, TelemetrySummary
from runner.nvml import HARD_THROTTLE_MASK, clock_events, load, nvml_available, read, text

log = logging.getLogger("runner")


def summarize_samples(samples: list[dict[str, Any]]) -> TelemetrySummary:
    """Figures over a window's samples; ``None`` (unavailable), never zero, when unread.

    ``gpu_util_avg_pct`` is the mean over all GPUs and ticks. ``power_avg_w`` is the
    power the run draws, the sum over GPUs of each GPU's mean power: its energy
    counter's growth between its first and last read over the seconds between them,
    or, where the counter is unsupported, the mean of its 1 Hz power reads. The
    counter integrates every millisecond; a 1 Hz read catches one instant.
    """
    utils = [s["util_pct"] for s in samples if s.get("util_pct") is not None]
    by_gpu: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for sample in samples:
        by_gpu[sample["gpu"]].append(sample)
    gpus = [gpu_figures(index, by_gpu[index]) for index in sorted(by_gpu)]
    powers = [gpu.power_avg_w for gpu in gpus if gpu.power_avg_w is not None]
    complete = bool(gpus) and len(powers) == len(gpus)
    source: PowerSource | None = None
    if complete:
        source = "energy" if all(gpu.power_source == "energy" for gpu in gpus) else "samples"
    throttled = any((s.get("clock_event_reasons") or 0) & HARD_THROTTLE_MASK for s in samples)
    return TelemetrySummary(
        available=bool(samples),
        gpu_util_avg_pct=sum(utils) / len(utils) if utils else None,
        power_avg_w=sum(powers) if complete else None,
        samples=list(samples),
        throttled=throttled,
        power_source=source,
        gpus=gpus,
    )


def gpu_figures(index: int, samples: list[dict[str, Any]]) -> GpuFigures:
    """One GPU's figures from its samples, in the order they were read."""
    energy = [(s["t_s"], s["energy_mj"]) for s in samples if s.get("energy_mj") is not None]
    power: float | None = None
    source: PowerSource | None = None
    energy_j: float | None = None
    if len(energy) >= 2 and energy[-1][0] > energy[0][0] and energy[-1][1] >= energy[0][1]:
        energy_j = (energy[-1][1] - energy[0][1]) / 1000.0
        power, source = energy_j / (energy[-1][0] - energy[0][0]), "energy"
    else:
        reads = [s["power_w"] for s in samples if s.get("power_w") is not None]
        if reads:
            power, source = sum(reads) / len(reads), "samples"
    utils = [s["util_pct"] for s in samples if s.get("util_pct") is not None]
    memory = [s["memory_used_gib"] for s in samples if s.get("memory_used_gib") is not None]
    temperatures = [s["temperature_c"] for s in samples if s.get("temperature_c") is not None]
    return GpuFigures(
        gpu=index,
        util_avg_pct=sum(utils) / len(utils) if utils else None,
        power_avg_w=power,
        power_source=source,
        energy_j=energy_j,
        memory_used_max_gib=max(memory) if memory else None,
        temperature_max_c=max(temperatures) if temperatures else None,
    )


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
        # One sampler serves every window of a run: each window's figures are its own.
        self.samples = []
        self.xid_events = []
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
        return summarize_samples(self.samples)

    def _run(self) -> None:
        nvml = load()
        nvml.nvmlInit()
        try:
            indices = self.device_indices
            if indices is None:
                indices = list(range(nvml.nvmlDeviceGetCount()))
            handles = {index: nvml.nvmlDeviceGetHandleByIndex(index) for index in indices}
            events = self._subscribe_xid(handles)
            started, tick = time.monotonic(), 0
            while not self._stop.is_set():
                for index, handle in handles.items():
                    self.samples.append(_sample(handle, index, tick, started))
                tick += 1
                self._wait(events, started + tick * self.interval_s - time.monotonic())
            # A last read when the window closes, so the energy counter spans all of it.
            for index, handle in handles.items():
                self.samples.append(_sample(handle, index, tick, started))
            if events is not None:
                nvml.nvmlEventSetFree(events)
        finally:
            nvml.nvmlShutdown()

    def _subscribe_xid(self, handles: dict[int, Any]) -> Any:
        nvml = load()
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
        nvml = load()
        try:
            event = nvml.nvmlEventSetWait_v2(events, int(seconds * 1000))
        except nvml.NVMLError:
            return  # NVML_ERROR_TIMEOUT: no Xid during this tick
        xid = {"xid": int(event.eventData), "uuid": text(nvml.nvmlDeviceGetUUID(event.device))}
        self.xid_events.append(xid)
        log.warning("GPU %s reported Xid %d during the window", xid["uuid"], xid["xid"])


def _sample(handle: Any, index: int, tick: int, started: float) -> dict[str, Any]:
    nvml = load()
    # The energy counter first, stamped at the moment it is read: power is its slope.
    elapsed_s = round(time.monotonic() - started, 4)
    energy_mj = read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle)
    utilization = read(nvml.nvmlDeviceGetUtilizationRates, handle)
    memory = read(nvml.nvmlDeviceGetMemoryInfo, handle)
    power_mw = read(nvml.nvmlDeviceGetPowerUsage, handle)
    return {
        "tick": tick,
        "t_s": elapsed_s,
        "gpu": index,
        "util_pct": utilization.gpu if utilization is not None else None,
        "memory_used_gib": round(memory.used / 2**30, 3) if memory is not None else None,
        "power_w": power_mw / 1000 if power_mw is not None else None,
        "energy_mj": energy_mj,
        "temperature_c": read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "clock_event_reasons": clock_events(handle),
    }
