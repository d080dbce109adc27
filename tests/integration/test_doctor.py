"""``python -m runner.doctor`` against this host's real dockerd (seed 003 section 2).

GPU rows are judged here the way a GPU-less host is (no NVML, no NVIDIA runtime);
tests/gpu/test_doctor.py checks them on a GPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from runner.config import build_config
from runner.prepare.hostcheck import check_other_engines
from tests.conftest import compose

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "local/debian:bookworm"

pytestmark = pytest.mark.integration


def doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner.doctor", *args],
        cwd=REPO,
        env=dict(os.environ, COLUMNS="250", **(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


def row(out: str, name: str) -> str:
    """The table row of check ``name`` (its first line)."""
    lines = [line for line in out.splitlines() if line.startswith(f"│ {name} ")]
    assert lines, f"no row {name!r} in:\n{out}"
    return lines[0]


@pytest.fixture(scope="module")
def client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no Docker engine here
        pytest.skip(f"no Docker engine: {exc}")
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BASE_IMAGE} is not built here (scripts/build-engine-image.sh builds it)")
    return client


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_default_cpu_run_is_ready_here(client) -> None:
    done = doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in row(done.stdout, "Docker engine") and "ok" in row(done.stdout, "config")
    assert "ok" in row(done.stdout, "torch companions")
    assert "node 0" in row(done.stdout, "NUMA memory")
    assert "skip" in row(done.stdout, "NVIDIA driver")
    assert "ready" in done.stdout


def test_a_gpu_profile_on_this_gpu_less_host_is_not_ready_and_says_why(client) -> None:
    done = doctor("+hw=h200", "model.revision=" + "a" * 40, "image.digest=sha256:" + "0" * 64)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fail" in row(done.stdout, "NVIDIA driver")
    runtime = row(done.stdout, "NVIDIA container runtime")
    assert "fail" in runtime and "nvidia-ctk" in done.stdout
    assert "not ready:" in done.stdout


def test_an_unreachable_docker_engine_fails_a_docker_run_only(client) -> None:
    gone = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}
    cpu = doctor(env=gone)
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    assert "warn" in row(cpu.stdout, "Docker engine")
    docker_run = doctor("backend=docker", env=gone)
    assert docker_run.returncode == 1
    assert "fail" in row(docker_run.stdout, "Docker engine") and "dockerd" in docker_run.stdout


def test_a_taken_engine_port_fails_a_local_process_run(client) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = doctor(f"engine.port={port}")
    assert done.returncode == 1
    assert "fail" in row(done.stdout, "engine port") and "engine.port=N" in done.stdout


def test_clean_removes_an_orphaned_engine_container_and_keeps_a_live_ones(client) -> None:
    """A container labelled by a runner whose process is gone (SIGKILL, reboot) is an
    orphan holding memory or GPUs; one whose runner is alive is left alone."""
    host = socket.gethostname()
    tag = uuid.uuid4().hex[:8]
    orphan = client.containers.run(
        BASE_IMAGE,
        ["sleep", "600"],
        detach=True,
        name=f"runner-orphan-{tag}",
        labels={"runner.pid": str(dead_pid()), "runner.host": host, "runner.run_id": f"t-{tag}"},
    )
    live = client.containers.run(
        BASE_IMAGE,
        ["sleep", "600"],
        detach=True,
        name=f"runner-live-{tag}",
        labels={"runner.pid": str(os.getpid()), "runner.host": host, "runner.run_id": f"t-{tag}"},
    )
    try:
        seen = doctor()
        assert "warn" in row(seen.stdout, "orphaned containers") and orphan.name in seen.stdout
        assert live.name not in seen.stdout
        cleaned = doctor("--clean")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert f"removed 1: {orphan.name}" in " ".join(cleaned.stdout.split())
        names = {
            c.name
            for c in client.containers.list(all=True, filters={"label": f"runner.run_id=t-{tag}"})
        }
        assert names == {live.name}
    finally:
        for container in (orphan, live):
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already removed by the doctor
                pass


def test_other_vllm_servers_on_the_host_are_named_by_pid_and_port() -> None:
    """A forgotten engine holds runner's client off the cores even when it serves
    nothing (docs/benchmarks.md, "Where a late loop's time went"). Processes whose argv
    names vLLM's server module stand in for engines (the check reads only the process
    list); each forks a child with the same argv, as vLLM's engine processes show, and
    only the parent is listed. A secret in the argv never reaches the row."""
    script = (
        "import os, subprocess, sys, time\n"
        "if not os.environ.get('FORKED'):\n"
        "    subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env={**os.environ, 'FORKED': '1'})\n"
        "time.sleep(60)"
    )
    argv = ["vllm.entrypoints.openai.api_server", "--api-key", "sk-hidden", "--port"]
    servers = [subprocess.Popen([sys.executable, "-c", script, *argv, str(port)])
               for port in (18123, 18124)]  # fmt: skip
    try:
        for server in servers:
            while len(psutil.Process(server.pid).children()) < 1:
                time.sleep(0.05)
        seen = check_other_engines(build_config(compose([])))
        assert seen.status == "warn", seen
        assert f"pid {servers[0].pid} (port 18123)" in seen.found
        assert f"pid {servers[1].pid} (port 18124)" in seen.found
        children = [c.pid for s in servers for c in psutil.Process(s.pid).children()]
        assert not any(f"pid {pid} " in seen.found for pid in children), seen
        assert "sk-hidden" not in repr(seen)
        measured = build_config(compose(["backend=external", "backend.url=http://127.0.0.1:18123"]))
        spared = check_other_engines(measured)
        assert f"pid {servers[0].pid} " not in spared.found
        assert f"pid {servers[1].pid} (port 18124)" in spared.found
    finally:
        for server in servers:
            for child in psutil.Process(server.pid).children():
                child.kill()
            server.kill()
            server.wait()
