"""The local engine process never outlives runner, even a SIGKILLed runner, and shares
runner's session so the scheduler does not starve runner's client beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import subprocess, sys, time
from runner.engines.process import ENGINE_PROCESS
child = subprocess.Popen(["sleep", "300"], **ENGINE_PROCESS)
print(child.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def test_the_engine_gets_sigterm_when_runner_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    assert alive(child_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child_pid)


def test_the_engine_leads_its_own_group_inside_runners_session() -> None:
    """Teardown signals the engine's group; the session stays runner's, because Linux
    autogroups CPU time by session and an engine in a session of its own held the
    client off the CPU for up to 1.2 s while it decoded on the same cores."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        assert os.getpgid(child_pid) == child_pid
        assert os.getsid(child_pid) == os.getsid(parent.pid)
    finally:
        parent.kill()
        parent.wait(timeout=10)


def test_the_engine_inherits_no_secret_its_plan_does_not_name() -> None:
    """A token exported in the user's shell reaches the engine only when the model needs
    it and the engine may go online (issue 8)."""
    from runner.engines.base import LaunchPlan
    from runner.engines.process import engine_environment

    shell = {"PATH": "/usr/bin", "HF_TOKEN": "hf_planted", "HUGGING_FACE_HUB_TOKEN": "hf_old",
             "VLLM_API_KEY": "sk-planted"}
    plain = engine_environment(LaunchPlan(image=None, argv=[]), shell)
    assert plain == {"PATH": "/usr/bin"}
    needs = LaunchPlan(image=None, argv=[], secret_env=["HF_TOKEN", "VLLM_API_KEY"])
    assert engine_environment(needs, shell)["HF_TOKEN"] == "hf_planted"
    offline_shell = {**shell, "HF_HUB_OFFLINE": "1"}
    kept_home = engine_environment(needs, offline_shell)
    assert "HF_TOKEN" not in kept_home and kept_home["VLLM_API_KEY"] == "sk-planted"
