"""GPU preflight and telemetry: the pure parts, and the behaviour without NVML."""

from __future__ import annotations

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


def test_a_tick_missing_one_gpu_power_is_left_out_of_the_power_average():
    summary = telemetry.summarize_samples(samples([(50, 300.0, 0), (50, None, 0)], [(50, 300.0, 0), (50, 200.0, 0)]))
    assert summary.power_avg_w == pytest.approx(500.0)


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
