"""A run killed with SIGKILL mid-window and started again with the same run_id
(seed 004 §8: every finished window is on disk the moment it ends)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from runner.measure.metrics import parse_metrics
from runner.output.results import read_results
from runner.search.history import search_history
from runner.search.policy import SearchParams, decide

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "resume-sigkill"
USERS = [4, 6, 8]

pytestmark = pytest.mark.integration


def read_rows(folder: Path) -> list[dict]:
    path = folder / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def run_folders(root: Path) -> list[Path]:
    return sorted(path.parent for path in root.glob("*/config.yaml"))


def wait_until_idle(base_url: str, timeout_s: float = 120.0) -> None:
    """The shared engine must be idle again for the tests that follow."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = parse_metrics(httpx.get(f"{base_url}/metrics", timeout=10).text)
        if snapshot.idle:
            return
        time.sleep(1.0)
    raise AssertionError(f"the engine at {base_url} is still busy after {timeout_s:g} s")


def test_a_killed_run_resumes_at_the_interrupted_window(
    vllm_server, cache_dir: Path, tmp_path: Path
) -> None:
    """SIGKILL in the second window; the same command again skips the first window,
    redoes the second, measures the third, reaches the decision an uninterrupted run
    reaches from the same rows, and leaves one MLflow parent with one child per window.
    The default results folder (one per start) is used, as a user resuming would."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    results_root = tmp_path / "results"
    command = [
        sys.executable,
        "-m",
        "runner",
        "backend=external",
        f"backend.url={vllm_server.base_url}",
        f"engine.max_model_len={served_context(vllm_server.base_url)}",
        "search=fixed",
        f"search.users=[{','.join(map(str, USERS))}]",
        "search.window_s=6",
        "search.warmup_s=2",
        f"hydra.run.dir={results_root}/${{now:%Y%m%d-%H%M%S}}",
        f"tracking.uri={uri}",
        f"tracking.artifact_root={tmp_path}/artifacts",
        f"cache_dir={cache_dir}",
        f"run_id={RUN_ID}",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    first_log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command, cwd=REPO, env=env, stdout=first_log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not any(read_rows(folder) for folder in run_folders(results_root)):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no window finished within 300 s"
            time.sleep(0.2)
        # Inside the second window's warm-up or measurement, well before it can end.
        time.sleep(3.0)
        killed_at = time.time()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
        first_log.close()
    (folder,) = run_folders(results_root)
    before = read_rows(folder)
    assert [row["users"] for row in before] == USERS[:1], "the kill must land in the second window"

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner")
    killed_parent = client.search_runs([experiment.experiment_id], "tags.`runner.kind` = 'search'")
    assert [run.info.status for run in killed_parent] == ["RUNNING"]  # SIGKILL: nothing closed it

    time.sleep(1.1)  # a new second, so the resumed start gets its own default folder
    second = subprocess.run(
        command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert f"resuming run {RUN_ID}: 1 window(s) already measured" in second.stdout

    after = read_rows(folder)
    assert [row["users"] for row in after] == USERS
    assert after[0] == before[0], "the first window must not be measured again"
    redone = [row["timestamp_utc"] for row in after[1:]]
    assert all(_epoch(stamp) > killed_at for stamp in redone), redone
    assert [r for r in run_folders(results_root) if read_rows(r)] == [folder]

    params = SearchParams(kind="fixed", users=tuple(USERS), floor_tok_s=15.0)
    # The windows as the search reads them, intervals included: a draw between two
    # counts is their intervals overlapping, not the 2% rule of rows without them.
    history = search_history(read_results(folder), relaunch=False)
    reference = decide(history, params)
    summary = json.loads((folder / "manifest.json").read_text())["summary"]
    assert summary["windows"] == len(USERS)
    assert summary["best_users"] == reference.best_users
    assert summary["median_aggregate_tok_s"] == reference.median_aggregate_tok_s

    runs = client.search_runs([experiment.experiment_id], f"tags.run_id = '{RUN_ID}'")
    parents = [run for run in runs if run.data.tags.get("runner.kind") == "search"]
    children = [run for run in runs if run.data.tags.get("runner.kind") == "window"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(int(run.data.tags["window_index"]) for run in children) == [0, 1, 2]
    assert sorted(int(run.data.tags["users"]) for run in children) == USERS
    assert all(run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for run in children)

    wait_until_idle(vllm_server.base_url)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def served_context(base_url: str) -> int:
    """The shared engine's context length: the engine options must describe it truthfully."""
    return int(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["max_model_len"])
