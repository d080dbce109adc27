"""``python -m runner backend=docker`` end to end on the real Docker engine.

The engine is the local vLLM-CPU image (``scripts/build-engine-image.sh``) serving
the tiny model; the runner process drives the container through the Docker SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.measure.result import WindowRow

REPO = Path(__file__).resolve().parents[2]
ENGINE_IMAGE = "local/vllm-cpu:0.32.0"


def docker_client():
    try:
        import docker

        client = docker.from_env()
        client.ping()
        return client
    except Exception as exc:  # noqa: BLE001 - no daemon, no socket, no permission
        pytest.skip(f"no Docker engine answers here ({exc!r})")


pytestmark = [pytest.mark.integration, pytest.mark.docker]


def runner_command(work: Path, cache_dir: Path, run_id: str, users: str) -> list[str]:
    return [
        sys.executable, "-m", "runner",
        "backend=docker", "image=cpu_local", "backend.shm_size=2g", "backend.startup_timeout_s=600",
        "search=fixed", f"search.users={users}", "search.window_s=8", "search.warmup_s=2",
        f"results.dir={work}/results", f"tracking.uri=sqlite:///{work}/mlflow.db",
        f"tracking.artifact_root={work}/artifacts", f"cache_dir={cache_dir}", f"run_id={run_id}",
    ]


def labelled(client, run_id: str) -> list:
    # ignore_removed: a container may go between the listing and its inspection.
    label = {"label": f"runner.run_id={run_id}"}
    return client.containers.list(all=True, ignore_removed=True, filters=label)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_a_short_search_runs_in_a_container_and_leaves_nothing(tmp_path: Path, cache_dir: Path) -> None:
    client = docker_client()
    run_id = f"docker-e2e-{os.getpid()}"
    done = subprocess.run(
        runner_command(tmp_path, cache_dir, run_id, "[4]"),
        cwd=REPO, env=dict(os.environ, COLUMNS="200"), capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    measured = rows(tmp_path / "results" / "results.jsonl")
    assert [row["users"] for row in measured] == [4]
    assert measured[0]["valid"] is True and list(measured[0]) == WindowRow.field_names()
    manifest = json.loads((tmp_path / "results" / "manifest.json").read_text())
    assert manifest["flags"].startswith(f"checked against {ENGINE_IMAGE}")
    assert "docker run" in manifest["launch"]["docker_run"]
    assert manifest["startup"]["kv_cache_size_tokens"] > 0
    assert manifest["startup"]["image_id"] == client.images.get(ENGINE_IMAGE).id
    assert manifest["startup"]["ready_s"] > 0
    assert labelled(client, run_id) == []


def test_sigint_mid_window_removes_the_container_and_keeps_the_rows(tmp_path: Path, cache_dir: Path) -> None:
    """Ctrl-C during a window: no container with the run's label remains, rows stay intact."""
    client = docker_client()
    run_id = f"docker-sigint-{os.getpid()}"
    results = tmp_path / "results" / "results.jsonl"
    child = subprocess.Popen(
        runner_command(tmp_path, cache_dir, run_id, "[4,6,8]"),
        cwd=REPO, env=dict(os.environ, COLUMNS="200"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while len(rows(results)) < 1 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.5)
        assert len(rows(results)) == 1, "the first window never finished"
        assert labelled(client, run_id), "the engine container should be running"
        time.sleep(5)  # inside the second window (2 s warm-up + 8 s window)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    assert labelled(client, run_id) == []
    kept = rows(results)
    assert len(kept) == 1 and kept[0]["users"] == 4 and list(kept[0]) == WindowRow.field_names()
