"""GPU telemetry during a window: every GPU read about once a second through NVML.

The averages go into the window row as ``gpu_util_avg_pct`` and ``power_avg_w``, which
stay ``None`` when NVML is absent. NVML keeps no history of Xid errors, so the sampler
subscribes to NVML's critical-Xid events and an Xid during a window is seen as it
happens.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any

from runner.measure.records import TelemetrySummary
from runner.nvml import HARD_THROTTLE_MASK, clock_events, load, nvml_available, read, text

log = logging.getLogger("runner")


def summarize_samples(samples: list[dict[str, Any]]) -> TelemetrySummary:
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


def _sample(handle: Any, index: int, tick: int, elapsed_s: float) -> dict[str, Any]:
    nvml = load()
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
        "temperature_c": read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "sm_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "clock_event_reasons": clock_events(handle),
    }
