"""Planted secrets never reach results, logs, MLflow or the console (issue 8).

A real run against the shared engine, with credentials in ``backend.url`` and a token
in runner's environment; afterwards every file runner, Hydra and MLflow wrote is
searched for them, byte by byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "planted-url-password-0123"
TOKEN = "hf_plantedEnvironmentToken0123"

pytestmark = pytest.mark.integration


def served_context(base_url: str) -> int:
    return int(httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["max_model_len"])


def test_url_credentials_and_tokens_stay_out_of_everything_a_run_writes(
    vllm_server, cache_dir: Path, tmp_path: Path
) -> None:
    port = vllm_server.base_url.rsplit(":", 1)[1]
    url = f"http://runner:{PASSWORD}@127.0.0.1:{port}"
    command = [
        sys.executable,
        "-m",
        "runner",
        "backend=external",
        f"backend.url={url}",
        f"engine.max_model_len={served_context(vllm_server.base_url)}",
        "search=fixed",
        "search.users=[2]",
        "search.window_s=4",
        "search.warmup_s=1",
        "smoke.enabled=false",
        f"hydra.run.dir={tmp_path}/run",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"tracking.artifact_root={tmp_path}/artifacts",
        f"cache_dir={cache_dir}",
        "run_id=secrets",
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", HF_TOKEN=TOKEN, VLLM_API_KEY=TOKEN)
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown = done.stdout + done.stderr
    assert PASSWORD not in shown and TOKEN not in shown
    assert f"http://***@127.0.0.1:{port}" in shown  # the external-backend warning, redacted

    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert any(path.name == "mlflow.db" for path in written)
    for path in written:
        data = path.read_bytes()
        assert PASSWORD.encode() not in data and TOKEN.encode() not in data, path
    assert not list(tmp_path.rglob(".hydra")), "Hydra's copy of the overrides is off"

    run = tmp_path / "run"
    assert (
        yaml.safe_load((run / "config.yaml").read_text())["backend"]["url"]
        == f"http://***@127.0.0.1:{port}"
    )
    assert json.loads((run / "manifest.json").read_text())["run_id"] == "secrets"
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.get_experiment_by_name("runner")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`runner.kind` = 'search'")
    assert parent.data.params["backend.url"] == f"http://***@127.0.0.1:{port}"
