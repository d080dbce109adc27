"""GPU preflight and telemetry: the pure parts, and the behaviour without NVML."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from runner import nvml
from runner.config import Hardware
from runner.errors import PreflightError
from runner.measure import telemetry
from runner.prepare import preflight

H200 = Hardware(
    name="h200",
    gpu_name="NVIDIA H200",
    count=1,
    memory_gib=140.4,
    compute_capability=(9, 0),
    arch="hopper",
    native_precisions=["bf16", "fp8"],
    min_driver="580.105.08",
)


def healthy_gpu(**changes):
    """One GPU as the preflight reads it through NVML, idle and healthy."""
    described = {
        "index": 0,
        "name": "NVIDIA H200",
        "memory_total_gib": 140.4,
        "compute_capability": [9, 0],
        "compute_processes": [],
        "clock_event_reasons": 0x1,
        "ecc_uncorrected_volatile": 0,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        "retired_pages_pending": None,
    }
    described.update(changes)
    return described


def test_idle_is_not_a_throttle():
    """Seed 004 §3 rejects thermal throttling and severe power limiting, not an idle GPU."""
    assert nvml.decode_clock_events(0x1) == ["gpu_idle"]
    assert nvml.throttle_reasons(0x1) == []
    assert nvml.throttle_reasons(0x1 | 0x10 | 0x100) == []


@pytest.mark.parametrize(
    ("bits", "reason"),
    [
        (0x4, "sw_power_cap"),
        (0x8, "hw_slowdown"),
        (0x20, "sw_thermal_slowdown"),
        (0x40, "hw_thermal_slowdown"),
        (0x80, "hw_power_brake_slowdown"),
    ],
)
def test_thermal_and_power_reasons_are_throttles(bits, reason):
    assert nvml.throttle_reasons(bits | 0x1) == [reason]


def test_unknown_reason_bits_are_kept_visible():
    assert nvml.decode_clock_events(0x1 | 0x4000) == ["gpu_idle", "0x4000"]


@pytest.mark.parametrize(
    ("version", "minimum", "ok"),
    [
        ("580.159.03", "580.105.08", True),
        ("580.105.08", "580.105.08", True),
        ("580.65.06", "580.105.08", False),  # a string comparison would say "6" > "1"
        ("575.57.08", "580.65.06", False),
        ("590", "580.65.06", True),
        ("580.65", "580.65.0", True),
    ],
)
def test_driver_versions_compare_numerically(version, minimum, ok):
    assert preflight.version_at_least(version, minimum) is ok


def test_gpu_names_match_with_or_without_vendor_but_not_another_part():
    assert preflight.same_gpu_name("NVIDIA H200", "H200")
    assert preflight.same_gpu_name("NVIDIA H200", "nvidia  h200")
    assert not preflight.same_gpu_name("NVIDIA H200 NVL", "NVIDIA H200")
    assert not preflight.same_gpu_name("NVIDIA H100 80GB HBM3", "NVIDIA H200")


def test_a_healthy_idle_gpu_fits_the_profile():
    assert preflight.gpu_problems(healthy_gpu(), H200) == []


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"name": "NVIDIA H100 80GB HBM3"}, "is not a NVIDIA H200"),
        ({"memory_total_gib": 79.2}, "79.2 GiB"),
        ({"compute_capability": [8, 0]}, "compute capability 8.0"),
        ({"compute_processes": [{"pid": 4242, "used_gib": 3.0}]}, "pid 4242"),
        ({"clock_event_reasons": 0x40}, "hw_thermal_slowdown"),
        ({"ecc_uncorrected_volatile": 2}, "uncorrected ECC"),
        (
            {"remapped_rows": {"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}},
            "row remap",
        ),
    ],
)
def test_each_mismatch_is_named(changes, words):
    """Seed 004 §3: wrong identity or memory, another process, throttling, Xid-class faults."""
    problems = preflight.gpu_problems(healthy_gpu(**changes), H200)
    assert len(problems) == 1
    assert words in problems[0]


def test_memory_within_tolerance_is_accepted():
    # NVML reports 143,771 MiB (140.4 GiB); a profile rounding to 141 must still fit.
    assert preflight.gpu_problems(healthy_gpu(memory_total_gib=141.0), H200) == []


def samples(*ticks):
    """Samples for ticks given as lists of (util, power, reasons) per GPU."""
    return [
        {"tick": tick, "gpu": index, "util_pct": util, "power_w": power, "clock_event_reasons": bits}
        for tick, per_gpu in enumerate(ticks)
        for index, (util, power, bits) in enumerate(per_gpu)
    ]


def test_summary_averages_utilisation_and_sums_power_across_gpus():
    summary = telemetry.summarize_samples(
        samples([(100, 600.0, 0), (80, 500.0, 0)], [(60, 400.0, 0), (40, 300.0, 0)])
    )
    assert summary.available
    assert summary.gpu_util_avg_pct == pytest.approx(70.0)
    assert summary.power_avg_w == pytest.approx(900.0)
    assert not summary.throttled


def test_unread_figures_are_unavailable_never_zero():
    summary = telemetry.summarize_samples(samples([(None, None, None)], [(None, None, None)]))
    assert summary.gpu_util_avg_pct is None
    assert summary.power_avg_w is None
    assert telemetry.summarize_samples([]).available is False


def test_an_unread_power_sample_is_left_out_of_that_gpus_mean():
    summary = telemetry.summarize_samples(samples([(50, 300.0, 0), (50, None, 0)], [(50, 300.0, 0), (50, 200.0, 0)]))
    assert summary.power_avg_w == pytest.approx(500.0)
    assert summary.power_source == "samples"


def counted(gpu: int, reads: list[tuple[float, float | None, float]]) -> list[dict]:
    """One GPU's samples as (seconds, energy counter mJ or None, instant power W)."""
    return [
        {"tick": tick, "t_s": t_s, "gpu": gpu, "util_pct": 90, "power_w": power_w,
         "energy_mj": energy_mj, "memory_used_gib": 80.0 + tick, "temperature_c": 60 + tick}
        for tick, (t_s, energy_mj, power_w) in enumerate(reads)
    ]  # fmt: skip


def test_power_is_the_energy_counters_growth_over_the_window():
    """4,000 J in 10 s is 400 W, although the instant reads caught the GPU between
    bursts (idle 117 W, as one read on the H200 did)."""
    reads = [(0.0, 1_000_000.0, 117.0), (5.0, 2_500_000.0, 117.0), (10.0, 5_000_000.0, 117.0)]
    summary = telemetry.summarize_samples(counted(0, reads))
    assert summary.power_avg_w == pytest.approx(400.0)
    assert summary.power_source == "energy"
    (gpu,) = summary.gpus
    assert (gpu.gpu, gpu.power_source) == (0, "energy")
    assert gpu.energy_j == pytest.approx(4000.0)
    assert (gpu.memory_used_max_gib, gpu.temperature_max_c) == (82.0, 62)


def test_each_gpu_keeps_its_own_power_and_the_row_has_their_sum():
    first = counted(0, [(0.0, 0.0, 500.0), (2.0, 1_400_000.0, 500.0)])
    second = counted(1, [(0.0, 0.0, 300.0), (2.0, 600_000.0, 300.0)])
    summary = telemetry.summarize_samples(first + second)
    assert [gpu.power_avg_w for gpu in summary.gpus] == [pytest.approx(700.0), pytest.approx(300.0)]
    assert summary.power_avg_w == pytest.approx(1000.0)
    assert summary.power_source == "energy"


def test_without_an_energy_counter_the_power_reads_are_averaged():
    """Older GPUs have no energy counter (NVML_ERROR_NOT_SUPPORTED): the 1 Hz reads serve."""
    no_counter = counted(0, [(0.0, None, 300.0), (1.0, None, 500.0)])
    with_counter = counted(1, [(0.0, 0.0, 50.0), (1.0, 200_000.0, 50.0)])
    alone = telemetry.summarize_samples(no_counter)
    assert (alone.power_avg_w, alone.power_source) == (pytest.approx(400.0), "samples")
    mixed = telemetry.summarize_samples(no_counter + with_counter)
    assert mixed.power_avg_w == pytest.approx(600.0)
    assert mixed.power_source == "samples"  # not every GPU's figure is the counter's
    assert [gpu.power_source for gpu in mixed.gpus] == ["samples", "energy"]


def test_a_single_counter_read_gives_no_energy_figure():
    summary = telemetry.summarize_samples(counted(0, [(0.0, 1_000.0, 250.0)]))
    assert (summary.power_avg_w, summary.power_source) == (pytest.approx(250.0), "samples")
    assert summary.gpus[0].energy_j is None


class FakeNvml:
    """NVML for this GPU-less machine (no driver here, so a fake stands in for it): one
    GPU drawing a steady 400 W on its energy counter, while every instant power read
    says 100 W. Only the calls GpuSampler makes."""

    NVMLError = nvml.load().NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.origin = time.monotonic()

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlEventSetCreate(self) -> None:
        raise self.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED: no Xid events

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return int((time.monotonic() - self.origin) * 400_000)  # mJ at 400 W

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=95)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 100_000  # mW

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 61

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return 0


def test_one_sampler_measures_every_window_of_a_run_on_its_own(monkeypatch):
    """The H200 run (issue 11) reused one sampler for 18 windows: samples piled up,
    ticks of earlier windows collided, and power_avg_w was null in 16 of them. Each
    window's figures are its own, and its power the energy counter's."""
    fake = FakeNvml()
    monkeypatch.setattr(telemetry, "load", lambda: fake)
    monkeypatch.setattr(nvml, "load", lambda: fake)
    monkeypatch.setattr(telemetry, "nvml_available", lambda: True)
    sampler = telemetry.GpuSampler(device_indices=[0], interval_s=0.1)
    windows = []
    for _ in range(3):
        sampler.start()
        time.sleep(0.5)
        windows.append(sampler.stop())
    for summary in windows:
        ticks = [sample["tick"] for sample in summary.samples]
        assert ticks == sorted(set(ticks)) and ticks[0] == 0  # this window's reads only
        assert summary.power_source == "energy"
        assert summary.power_avg_w == pytest.approx(400.0, rel=0.1)
        assert summary.gpu_util_avg_pct == 95


def test_power_capping_under_load_is_not_marked_throttled_but_thermal_slowdown_is():
    assert not telemetry.summarize_samples(samples([(100, 700.0, 0x4)])).throttled
    assert telemetry.summarize_samples(samples([(100, 700.0, 0x4)], [(100, 650.0, 0x20)])).throttled


@pytest.mark.skipif(nvml.nvml_available(), reason="this machine has NVML; see tests/gpu")
def test_without_nvml_a_gpu_profile_is_refused_and_telemetry_is_unavailable():
    with pytest.raises(PreflightError, match="NVML cannot be loaded"):
        preflight.preflight(H200)
    sampler = telemetry.GpuSampler()
    sampler.start()
    summary = sampler.stop()
    assert summary.available is False
    assert summary.gpu_util_avg_pct is None and summary.power_avg_w is None
