"""``python -m runner`` end to end on the real vLLM CPU engine, read back as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.measure.result import WindowRow
from tests.integration.runs import FAST_START

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


PLANTED = "hf_plantedShellToken0123456789"
ENGINE_PORT = 8391
FORGOTTEN_PORT = 18391


def engine_process(port: int) -> tuple[bytes, bytes] | None:
    """(argv, environment) of the running vLLM server on ``port``, as /proc shows them."""
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            argv = (folder / "cmdline").read_bytes()
            if b"vllm.entrypoints.openai.api_server" in argv and b"--port\0%d\0" % port in argv + b"\0":
                return argv, (folder / "environ").read_bytes()
        except OSError:
            continue
    return None


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    """A real run: its own local vLLM process, two fixed concurrencies, short windows.

    A token and a key sit in runner's environment, as in a user's shell; the engine's
    argv and environment are sampled from /proc while it serves (issue 8)."""
    work = tmp_path_factory.mktemp("e2e")
    uri = f"sqlite:///{work}/mlflow.db"
    command = [
        sys.executable, "-m", "runner",
        "search=fixed", "search.users=[4,8]", "search.window_s=6", "search.warmup_s=2",
        f"results.dir={work}/results", f"tracking.uri={uri}",
        f"tracking.artifact_root={work}/artifacts", f"cache_dir={cache_dir}",
        "run_id=e2e-fixed", f"engine.port={ENGINE_PORT}", FAST_START,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", HF_TOKEN=PLANTED, VLLM_API_KEY=PLANTED)
    # A process named as a vLLM server on another port, as a forgotten engine shows in
    # the process list; it only sleeps, so the windows are not disturbed.
    forgotten = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(900)", "vllm.entrypoints.openai.api_server",
         "--port", str(FORGOTTEN_PORT)]
    )  # fmt: skip
    (work / "forgotten-pid").write_text(str(forgotten.pid))
    try:
        with (work / "stdout").open("w") as out, (work / "stderr").open("w") as err:
            runner = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
            sampled = None
            while runner.poll() is None:
                sampled = engine_process(ENGINE_PORT) or sampled
                time.sleep(0.5)
    finally:
        forgotten.kill()
        forgotten.wait()
    (work / "engine-sample").write_bytes(b"\n".join(sampled) if sampled else b"")
    done = subprocess.CompletedProcess(
        command, runner.returncode, (work / "stdout").read_text(), (work / "stderr").read_text()
    )
    return done, work, uri


def test_rows_have_exactly_the_seed_fields_and_pass_the_audit(fixed_run) -> None:
    """Seed 004 §7-8: one fsynced row per window, the §8 fields, client/server within 1%."""
    done, work, _ = fixed_run
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_jsonl(work / "results" / "results.jsonl")
    assert [row["users"] for row in rows] == [4, 8]
    for row in rows:
        assert list(row) == WindowRow.field_names()
        assert row["run_id"] == "e2e-fixed"
        assert row["window_s"] == 6.0
        assert row["valid"] is True, row
        assert row["request_errors"] == 0
        assert row["server_output_tok_s"] is not None
        audit = abs(row["aggregate_output_tok_s"] - row["server_output_tok_s"]) / row["server_output_tok_s"]
        assert audit <= 0.01, row
        assert row["min_user_tok_s"] > 0
        assert row["gpu_util_avg_pct"] is None and row["power_avg_w"] is None  # no GPU: unavailable
    csv_lines = (work / "results" / "results.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == WindowRow.field_names() and len(csv_lines) == 3


def test_console_shows_a_line_per_window_and_the_answer(fixed_run) -> None:
    done, _, _ = fixed_run
    lines = [line for line in done.stdout.splitlines() if line.startswith("users=")]
    assert len(lines) == 2
    assert all(" window=6s " in line and ("PASS" in line or "FAIL" in line) for line in lines)
    assert "best N=" in done.stdout or "No valid concurrency" in done.stdout


def test_mlflow_holds_a_parent_and_a_child_per_window(fixed_run) -> None:
    """Tracked runs read back through MLflow's own client."""
    from mlflow.tracking import MlflowClient

    done, work, uri = fixed_run
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    manifest = json.loads((work / "results" / "manifest.json").read_text())
    assert parent.data.tags["config_id"] == manifest["config_id"]
    assert parent.data.tags["run_id"] == "e2e-fixed"
    assert {c.data.tags["users"] for c in children} == {"4", "8"}
    assert all(c.data.tags["config_id"] == manifest["config_id"] for c in children)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"results.jsonl", "manifest.json", "workload.jsonl", "engine.log"} <= artifacts
    history = client.get_metric_history(parent.info.run_id, "aggregate_output_tok_s")
    assert sorted(m.step for m in history) == [4, 8]


def test_manifest_records_startup_facts_and_the_workload_hash(fixed_run) -> None:
    """Seed 000 reports the KV pool and init time; seed 004 §6 fixes the workload hash."""
    import hashlib

    done, work, _ = fixed_run
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((work / "results" / "manifest.json").read_text())
    facts = manifest["startup"]
    assert facts["kv_cache_size_tokens"] > 0
    assert facts["engine_init_s"] > 0
    assert facts["engine_cache_dtype"] == "auto"
    workload = (work / "results" / "workload.jsonl").read_bytes()
    assert manifest["workload"]["sha256"] == hashlib.sha256(workload).hexdigest()
    assert manifest["summary"]["windows"] == 2


def test_a_vllm_server_already_on_the_host_is_named_before_the_engine_starts(fixed_run) -> None:
    """An engine left running holds runner's client off the cores even when idle
    (docs/benchmarks.md, "Where a late loop's time went"): the run names it by pid and
    port, on the console and in the manifest, and not the engine it starts itself."""
    done, work, _ = fixed_run
    assert done.returncode == 0, done.stderr[-3000:]
    named = f"pid {(work / 'forgotten-pid').read_text()} (port {FORGOTTEN_PORT})"
    manifest = json.loads((work / "results" / "manifest.json").read_text())
    assert named in manifest["other_vllm_servers"]
    assert f"(port {ENGINE_PORT})" not in manifest["other_vllm_servers"]
    assert "other vLLM servers run on this host" in done.stdout + done.stderr


def test_no_secret_reaches_the_engine_argv_logs_mlflow_or_the_console(fixed_run) -> None:
    """The tiny model needs no token and the local engine no key: neither is handed on
    from runner's environment, and neither appears in anything the run wrote."""
    done, work, _ = fixed_run
    assert done.returncode == 0, done.stderr[-3000:]
    argv, environ = (work / "engine-sample").read_bytes().split(b"\n", 1)
    assert b"--kv-cache-memory-bytes\x002147483648" in argv  # the fixed KV size, in bytes
    names = {entry.split(b"=", 1)[0] for entry in environ.split(b"\0")}
    assert b"HF_TOKEN" not in names and b"VLLM_API_KEY" not in names
    for path in work.rglob("*"):
        if path.is_file() and path.name != "engine-sample":
            assert PLANTED.encode() not in path.read_bytes(), path
    assert (work / "results" / "config.yaml").exists() and not list(work.rglob(".hydra"))
