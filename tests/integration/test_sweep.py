"""The engine-tuning loop as a Hydra multirun (seed 004 §10): a sweep file from
sweeps/, one restarted engine and one search per job, compared from MLflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runner.engines.process import port_is_free
from tests.integration.runs import FAST_START

REPO = Path(__file__).resolve().parents[2]
BATCHED_TOKENS = [2048, 4096]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sweep(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    """`python -m runner -m` with the max_num_batched_tokens sweep file, two CPU-sized
    values replacing its GPU grid: two jobs, each its own local vLLM, one after the other."""
    work = tmp_path_factory.mktemp("sweep")
    port = next(port for port in range(8450, 8650) if port_is_free("127.0.0.1", port))
    uri = f"sqlite:///{work}/mlflow.db"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            "-m",
            "--config-dir",
            str(REPO / "sweeps"),
            "--config-name",
            "max_num_batched_tokens",
            f"engine.max_num_batched_tokens={','.join(map(str, BATCHED_TOKENS))}",
            "search=fixed",
            "search.users=[4]",
            "search.window_s=5",
            "search.warmup_s=2",
            f"hydra.sweep.dir={work}/multirun",
            f"tracking.uri={uri}",
            f"tracking.artifact_root={work}/artifacts",
            f"cache_dir={cache_dir}",
            f"engine.port={port}",
            FAST_START,
        ],
        check=False,
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done, work, uri


def test_each_job_is_its_own_config_id_in_mlflow(sweep) -> None:
    """Seed 004 §10: every changed server setup gets a new config_id and a restarted engine."""
    done, work, uri = sweep
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    manifests = [
        json.loads((work / "multirun" / str(job) / "manifest.json").read_text()) for job in (0, 1)
    ]
    assert [m["engine"]["max_num_batched_tokens"] for m in manifests] == BATCHED_TOKENS
    assert all("--max-num-batched-tokens" in m["launch"]["argv"] for m in manifests)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner")
    parents = client.search_runs([experiment.experiment_id], "tags.`runner.kind` = 'search'")
    assert len(parents) == 2
    assert {run.data.tags["config_id"] for run in parents} == {m["config_id"] for m in manifests}
    assert len({m["config_id"] for m in manifests}) == 2
    assert {run.data.params["engine.max_num_batched_tokens"] for run in parents} == {"2048", "4096"}
    assert all(run.info.status == "FINISHED" for run in parents)
    # Each job started and stopped its own engine, so each has its own engine log.
    assert all((work / "multirun" / str(job) / "engine.log").exists() for job in (0, 1))


def test_compare_lists_both_configs_in_one_family_table(sweep) -> None:
    done, work, uri = sweep
    assert done.returncode == 0, done.stderr[-3000:]
    manifests = [
        json.loads((work / "multirun" / str(job) / "manifest.json").read_text()) for job in (0, 1)
    ]
    shown = subprocess.run(
        [sys.executable, "-m", "runner.compare", "--tracking-uri", uri],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("family: ") == 1
    assert f"family: {manifests[0]['family']}" in shown.stdout
    for manifest in manifests:
        assert manifest["config_id"] in shown.stdout
        assert manifest["run_id"] in shown.stdout


def test_the_optuna_tuner_resumes_a_killed_study(
    vllm_server, cache_dir: Path, tmp_path: Path
) -> None:
    """Seed 004 §10 as a sequential Optuna study in sqlite: SIGKILL inside a trial, the
    same command again re-runs that trial with the same flags, its search resumes
    window by window, and the trial is scored with the decision's median aggregate.
    The engine is the shared one (backend=external): the tuned flags only label it."""
    import optuna
    from optuna.trial import TrialState

    space = tmp_path / "space.yaml"
    space.write_text("engine.max_num_batched_tokens: {choices: [2048, 4096]}\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    storage = f"sqlite:///{tmp_path}/optuna.db"
    command = [
        sys.executable,
        "-m",
        "runner.tune",
        "--trials",
        "1",
        "--study",
        "cpu-tune",
        "--storage",
        storage,
        "--space",
        str(space),
        "--results-dir",
        str(tmp_path / "tune"),
        "backend=external",
        f"backend.url={vllm_server.base_url}",
        f"engine.max_model_len={served_context(vllm_server.base_url)}",
        "search=fixed",
        "search.users=[4,6]",
        "search.window_s=4",
        "search.warmup_s=1",
        f"tracking.uri={uri}",
        f"tracking.artifact_root={tmp_path}/artifacts",
        f"cache_dir={cache_dir}",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not list((tmp_path / "tune").glob("*/results.jsonl")):
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the first trial measured nothing within 300 s"
            time.sleep(0.2)
        time.sleep(1.5)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)

    second = subprocess.run(
        command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]

    study = optuna.load_study(study_name="cpu-tune", storage=storage)
    killed, retried = study.trials
    assert killed.state == TrialState.FAIL
    assert retried.state == TrialState.COMPLETE
    assert retried.user_attrs["retry_of"] == killed.number
    assert retried.params == killed.params
    (folder,) = (tmp_path / "tune").iterdir()
    assert folder.name == retried.user_attrs["config_id"]
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert [row["users"] for row in rows] == [4, 6]
    assert {row["run_id"] for row in rows} == {f"cpu-tune-{folder.name}"}
    summary = json.loads((folder / "manifest.json").read_text())["summary"]
    assert retried.value == (summary["median_aggregate_tok_s"] or 0.0)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner")
    parents = client.search_runs([experiment.experiment_id], "tags.`runner.kind` = 'search'")
    assert [run.data.tags["run_id"] for run in parents] == [f"cpu-tune-{folder.name}"]


def served_context(base_url: str) -> int:
    """The shared engine's context length: the engine options must describe it truthfully."""
    import httpx

    return int(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["max_model_len"])
