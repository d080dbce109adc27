"""The GPU preflight: refuse a host whose GPUs are not what the hardware profile says.

It checks, before anything runs (seed 004 section 3): count, name, memory, compute
capability, driver, foreign processes, and health. NVML keeps no history of Xid
errors, so the preflight checks what an Xid leaves behind in NVML (uncorrected ECC
errors since the driver loaded, pending or failed row remaps, retired pages).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from runner.errors import PreflightError
from runner.nvml import clock_events, decode_clock_events, load, read, text, throttle_reasons

if TYPE_CHECKING:
    from runner.config import Hardware

log = logging.getLogger("runner")

MEMORY_TOLERANCE = 0.05


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


def _describe_gpu(index: int) -> dict[str, Any]:
    nvml = load()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    capability = read(nvml.nvmlDeviceGetCudaComputeCapability, handle)
    processes = read(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    power_limit = read(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    events = clock_events(handle)
    remapped = read(nvml.nvmlDeviceGetRemappedRows, handle)
    return {
        "index": index,
        "name": text(nvml.nvmlDeviceGetName(handle)),
        "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
        "memory_total_gib": round(memory.total / 2**30, 2),
        "memory_used_gib": round(memory.used / 2**30, 2),
        "compute_capability": list(capability) if capability else None,
        "power_limit_w": power_limit / 1000 if power_limit is not None else None,
        "temperature_c": read(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "clock_event_reasons": events,
        "clock_event_names": decode_clock_events(events) if events is not None else None,
        "compute_processes": [
            {"pid": p.pid, "used_gib": round((p.usedGpuMemory or 0) / 2**30, 2)}
            for p in processes
            if p.pid != os.getpid()
        ],
        "ecc_uncorrected_volatile": read(
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
        "retired_pages_pending": read(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle),
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
        nvml = load()
        nvml.nvmlInit()
    except Exception as exc:
        raise PreflightError(
            f"The hardware profile '{hw.name}' needs {hw.count} x {hw.gpu_name}, but NVML "
            f"cannot be loaded on this machine ({exc!r}): there is no NVIDIA driver here. "
            "Run GPU profiles on a GPU host, or leave hw unset to run the CPU profile."
        ) from exc
    try:
        driver = text(nvml.nvmlSystemGetDriverVersion())
        cuda = read(nvml.nvmlSystemGetCudaDriverVersion_v2)
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


