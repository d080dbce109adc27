"""NVML preflight and telemetry on a real NVIDIA GPU; skipped where NVML is absent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from runner import nvml
from runner.config import Hardware
from runner.errors import PreflightError
from runner.measure import telemetry
from runner.prepare import preflight

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml.nvml_available(), reason="no NVIDIA driver (NVML) on this machine"),
]
CONF = Path(__file__).resolve().parents[2] / "conf"


def profile_for_this_gpu() -> Hardware:
    """The hw profile whose gpu_name is the GPU here (conf/hw/*.yaml)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    name = name.decode() if isinstance(name, bytes) else name
    for path in sorted((CONF / "hw").glob("*.yaml")):
        hw = yaml.safe_load(path.read_text())["hw"]
        if preflight.same_gpu_name(name, hw["gpu_name"]) and hw["count"] == 1:
            return Hardware.model_validate(hw)
    pytest.skip(f"no single-GPU profile in conf/hw names {name}")


def test_preflight_accepts_the_profile_of_this_gpu():
    """Seed 004 §3: identity, memory, driver, no other process, no throttling at idle."""
    hw = profile_for_this_gpu()
    facts = preflight.preflight(hw)
    assert facts["gpu_count"] >= hw.count
    first = facts["gpus"][0]
    assert preflight.same_gpu_name(first["name"], hw.gpu_name)
    assert tuple(first["compute_capability"]) == tuple(hw.compute_capability)
    assert preflight.version_at_least(facts["driver_version"], hw.min_driver)
    assert first["clock_event_names"] is not None


def test_preflight_refuses_a_profile_this_machine_does_not_match():
    hw = profile_for_this_gpu()
    wrong = hw.model_copy(update={"count": 64, "gpu_name": "NVIDIA B200", "min_driver": "999.0"})
    with pytest.raises(PreflightError) as refused:
        preflight.preflight(wrong)
    message = str(refused.value)
    assert "needs 64" in message
    assert "is not a NVIDIA B200" in message
    assert "older than the profile's minimum 999.0" in message


def keep_busy(seconds: float) -> None:
    """Bf16 matmuls on GPU 0 for about ``seconds``."""
    torch = pytest.importorskip("torch")
    matrix = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(20):
            matrix @ matrix
        torch.cuda.synchronize()


def test_sampler_reads_power_and_sees_the_gpu_busy_under_load():
    """The row's gpu_util_avg_pct and power_avg_w come from these samples (seed 004 §8).

    CUDA and cuBLAS are initialised first and the GPU given time to settle: their
    start-up is neither idle nor load (seen on the H200: the "idle" reading was taken
    while another process or the first kernels still ran)."""
    keep_busy(0.5)
    time.sleep(3.0)
    idle = telemetry.GpuSampler(device_indices=[0], interval_s=0.5)
    idle.start()
    time.sleep(2.0)
    idle_summary = idle.stop()
    busy = telemetry.GpuSampler(device_indices=[0], interval_s=0.5)
    busy.start()
    keep_busy(3.0)
    busy_summary = busy.stop()
    assert len(idle_summary.samples) >= 3
    assert idle_summary.power_avg_w is not None and idle_summary.power_avg_w > 0
    assert busy_summary.gpu_util_avg_pct is not None and busy_summary.gpu_util_avg_pct > 50
    assert busy_summary.power_avg_w > idle_summary.power_avg_w


def test_power_is_present_in_every_window_of_one_sampler_under_load():
    """Issue 11: one sampler served 18 windows on the H200 and power_avg_w was null in 16
    of them. Each window's power is the energy counter's growth over that window."""
    sampler = telemetry.GpuSampler(device_indices=[0], interval_s=0.5)
    for window in range(3):
        sampler.start()
        keep_busy(2.0)
        summary = sampler.stop()
        (gpu,) = summary.gpus
        print(
            f"window {window}: power {summary.power_avg_w} W ({summary.power_source}), "
            f"{gpu.energy_j} J, util {summary.gpu_util_avg_pct}%, {len(summary.samples)} reads"
        )
        assert summary.samples[0]["tick"] == 0  # this window's reads only
        assert summary.power_avg_w is not None and summary.power_avg_w > 0
        assert summary.power_source == "energy"  # Volta and later count energy
        assert gpu.energy_j is not None and gpu.energy_j > 0
