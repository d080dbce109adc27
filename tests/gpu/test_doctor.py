"""The doctor's GPU rows on a real NVIDIA GPU (seed 003 section 2); skipped without NVML.

A GPU host without Docker (the H200 machine here) is checked with backend=process,
so the Docker rows are warnings there and the driver and GPU-process rows decide.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from runner import nvml
from runner.config import build_config
from runner.prepare.hostcheck import check_gpus, run_checks
from tests.conftest import compose
from tests.gpu.test_nvml import profile_for_this_gpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml.nvml_available(), reason="no NVIDIA driver (NVML) on this machine"),
]

HOLD_GPU = """
import sys, time, torch
block = torch.empty(2**30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(120)
"""


def config_for_this_gpu(**hw: object):
    profile = profile_for_this_gpu()
    config = build_config(compose([f"+hw={profile.name}", "backend=process"]))
    return config.model_copy(update={"hw": profile.model_copy(update=hw)})


def rows(checks) -> dict:
    return {check.name: check for check in checks}


def test_the_driver_meets_the_profile_and_no_foreign_process_holds_the_gpu() -> None:
    found = rows(check_gpus(config_for_this_gpu()))
    assert found["NVIDIA driver"].status == "ok", found["NVIDIA driver"]
    assert found["foreign GPU processes"].status == "ok", found["foreign GPU processes"]


def test_an_older_driver_than_the_profile_wants_fails_with_the_fix() -> None:
    found = rows(check_gpus(config_for_this_gpu(min_driver="999.0")))
    driver = found["NVIDIA driver"]
    assert driver.status == "fail" and "999.0" in driver.found and "999.0" in driver.fix


def test_a_process_holding_the_gpu_is_named_by_its_pid() -> None:
    """Seed 004 §3: a benchmark on a GPU another process uses measures the wrong thing."""
    pytest.importorskip("torch")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_GPU], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        time.sleep(1.0)
        busy = rows(check_gpus(config_for_this_gpu()))["foreign GPU processes"]
        assert busy.status == "fail" and f"pid {holder.pid}" in busy.found, busy
    finally:
        holder.kill()
        holder.wait()


def test_the_whole_table_runs_on_a_gpu_host() -> None:
    found = rows(run_checks(config_for_this_gpu()))
    assert found["NVIDIA driver"].status == "ok"
    assert found["NVIDIA container runtime"].status in {"ok", "skip", "warn"}
    assert found["NUMA memory"].status in {"ok", "warn"}
