"""What runner does when it is stopped, killed, starved of disk or MLflow, or run twice,
against the real engines here: no engine left behind, no row lost or doubled, one
paragraph for the user, and a resume that completes the run."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runner.engines.base import LaunchPlan
from runner.engines.process import ProcessEngine, port_is_free
from runner.errors import EngineStartError
from runner.output.results import read_results
from tests.integration.conftest import free_port, wait_idle
from tests.integration.runs import (
    FAST_START,
    engine_processes,
    external,
    gone_within,
    interrupt,
    rows,
    run,
    runner_command,
    start,
    wait_for_rows,
)

pytestmark = pytest.mark.integration


def mlflow_runs(work: Path, run_id: str) -> tuple[list, list]:
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
    experiment = client.get_experiment_by_name("runner")
    runs = client.search_runs([experiment.experiment_id], f"tags.run_id = '{run_id}'")
    parents = [r for r in runs if r.data.tags.get("runner.kind") == "search"]
    children = [r for r in runs if r.data.tags.get("runner.kind") == "window"]
    return parents, children


def no_traceback(text: str) -> None:
    assert "Traceback" not in text, text[-3000:]


# SIGHUP takes SIGTERM's path (tests/unit/test_shutdown.py); a run in a container gets it
# in tests/integration/test_docker_run.py.
@pytest.mark.parametrize("how", ["SIGTERM", "double SIGINT"])
def test_a_signal_mid_window_stops_the_local_engine_and_keeps_the_rows(
    how: str, tmp_path: Path, cache_dir: Path
) -> None:
    """A scheduler's SIGTERM, a closed terminal's SIGHUP or an impatient second Ctrl-C in
    the middle of a window: the engine and its workers are gone, the port is free, the
    window before it is on disk, and MLflow marks the run KILLED."""
    port = free_port(8700)
    run_id = f"signal-{how.replace(' ', '-')}"
    log = tmp_path / "runner.log"
    child = start(
        runner_command(
            tmp_path, cache_dir, run_id, f"engine.port={port}", "search.window_s=10", FAST_START
        ),
        log,
    )
    try:
        wait_for_rows(tmp_path / "results", 1, child, log)
        time.sleep(3)  # inside the second window: 1 s warm-up, then 10 s measured
        interrupt(child, how)
    finally:
        if child.poll() is None:
            child.kill()
    output = log.read_text()
    assert child.returncode == 130, output[-3000:]
    assert "interrupted" in output
    no_traceback(output)
    assert gone_within(port), [p.pid for p in engine_processes(port)]
    assert port_is_free("127.0.0.1", port)
    assert [row["users"] for row in rows(tmp_path / "results")] == [2]
    assert not list((tmp_path / "results").glob("*.tmp"))
    (parent,), children = mlflow_runs(tmp_path, run_id)
    assert parent.info.status == "KILLED"
    assert [child_run.data.tags["users"] for child_run in children] == ["2"]


def test_sigkill_leaves_no_engine_and_the_same_command_completes_the_run(
    tmp_path: Path, cache_dir: Path
) -> None:
    """SIGKILL cannot be caught: the local engine goes with runner through the kernel's
    parent-death signal, and the resumed run ends with one row and one MLflow child per
    window."""
    port = free_port(8750)
    command = runner_command(
        tmp_path, cache_dir, "sigkill-process", f"engine.port={port}", FAST_START
    )
    log = tmp_path / "first.log"
    child = start(command, log)
    try:
        wait_for_rows(tmp_path / "results", 1, child, log)
        time.sleep(2)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert gone_within(port), [p.pid for p in engine_processes(port)]
    done = run(command)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "1 window(s) already measured" in done.stdout
    assert [row["users"] for row in rows(tmp_path / "results")] == [2, 3]
    (parent,), children = mlflow_runs(tmp_path, "sigkill-process")
    assert parent.info.status == "FINISHED"
    assert sorted(int(c.data.tags["window_index"]) for c in children) == [0, 1]


def test_an_engine_killed_mid_window_and_between_windows_is_relaunched(
    tmp_path: Path, cache_dir: Path
) -> None:
    """backend.on_engine_fault=relaunch. Killed in a window: that window stays on disk,
    invalid, with the typed fault (SIGKILL, as the kernel's OOM killer sends it). Killed
    while no window counts (the relaunched engine, during the next window's warm-up):
    relaunched again and the window measured on the fresh engine. Every planned window
    is measured."""
    port = free_port(8800)
    log = tmp_path / "runner.log"
    child = start(
        runner_command(
            tmp_path, cache_dir, "engine-killed", f"engine.port={port}", "search.users=[2,2,2]",
            "search.warmup_s=8", "search.window_s=10", "backend.on_engine_fault=relaunch", FAST_START,
        ),
        log,
    )  # fmt: skip
    try:
        wait_for_rows(tmp_path / "results", 1, child, log)
        time.sleep(8 + 3)  # the second window's warm-up, then 3 s into its count
        for process in engine_processes(port):
            process.kill()
        wait_for_rows(tmp_path / "results", 2, child, log)
        # runner has seen the relaunched engine ready: it is in the 8 s warm-up of window 3.
        deadline = time.monotonic() + 300
        while log.read_text().count("engine ready at") < 2:
            assert time.monotonic() < deadline and child.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        for process in engine_processes(port):
            process.kill()
        assert child.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
    output = log.read_text()
    assert output.count("relaunching") == 2, output[-3000:]
    assert [row["valid"] for row in rows(tmp_path / "results")] == [True, False, True]
    (faulted,) = [r for r in read_results(tmp_path / "results") if not r.row.valid]
    assert faulted.detail.engine_fault is not None
    assert faulted.detail.engine_fault.exit_code == -signal.SIGKILL
    assert faulted.detail.engine_fault.oom_killed
    assert gone_within(port)


def test_a_full_disk_ends_in_one_paragraph_and_keeps_the_rows(
    vllm_server, tmp_path: Path, cache_dir: Path
) -> None:
    """The results folder's disk fills up during the second window: runner stops with
    one paragraph, the first row is intact, and no temporary file is left."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    try:
        command = [
            *runner_command(tmp_path, cache_dir, "full-disk", *external(vllm_server.base_url)),
            f"hydra.run.dir={disk}/results",
        ]
        log = tmp_path / "runner.log"
        child = start(command, log)
        wait_for_rows(disk / "results", 1, child, log)
        filler = disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        assert child.wait(timeout=300) == 2, log.read_text()[-3000:]
        output = log.read_text()
        no_traceback(output)
        assert "could not be written" in output and "No space left" in output
        assert [row["users"] for row in rows(disk / "results")] == [2]
        assert not list((disk / "results").glob("*.tmp"))
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    wait_idle(vllm_server.base_url, 120)


def test_a_read_only_results_folder_is_refused_before_any_engine(
    tmp_path: Path, cache_dir: Path
) -> None:
    disk = tmp_path / "ro"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(disk)], check=True)
    try:
        port = free_port(8850)
        done = run(
            [*runner_command(tmp_path, cache_dir, "read-only", f"engine.port={port}"),
             f"results.dir={disk}/results"]  # fmt: skip
        )
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert done.returncode == 2, done.stderr[-3000:]
    no_traceback(done.stderr)
    assert "Read-only file system" in done.stderr
    assert not engine_processes(port)


def test_a_locked_mlflow_store_defers_logging_and_the_search_goes_on(
    vllm_server, tmp_path: Path, cache_dir: Path
) -> None:
    """Another writer holds the sqlite store for longer than runner retries: the windows
    are measured and written anyway, and logged to MLflow once the store is free."""
    command = runner_command(
        tmp_path, cache_dir, "mlflow-locked", *external(vllm_server.base_url),
        "tracking.retry_s=2", "search.window_s=8",
    )  # fmt: skip
    log = tmp_path / "runner.log"
    child = start(command, log)
    try:
        wait_for_rows(tmp_path / "results", 1, child, log)
        store = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None, timeout=30)
        store.execute("BEGIN EXCLUSIVE")
        deadline = time.monotonic() + 120
        while "runner tries again at its end" not in log.read_text():
            assert time.monotonic() < deadline and child.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        store.execute("COMMIT")
        store.close()
        assert child.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
    assert [row["users"] for row in rows(tmp_path / "results")] == [2, 3]
    (parent,), children = mlflow_runs(tmp_path, "mlflow-locked")
    assert parent.info.status == "FINISHED"
    assert sorted(c.data.tags["users"] for c in children) == ["2", "3"]
    wait_idle(vllm_server.base_url, 120)


def test_two_runners_on_one_run_id_the_second_is_refused(
    vllm_server, tmp_path: Path, cache_dir: Path
) -> None:
    first_command = runner_command(
        tmp_path / "a", cache_dir, "one-id", *external(vllm_server.base_url), "search.window_s=20"
    )
    log = tmp_path / "first.log"
    first = start(first_command, log)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "a" / "results" / "manifest.json").exists():  # it holds the locks
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        second = run(runner_command(tmp_path / "b", cache_dir, "one-id", *external(vllm_server.base_url)))
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Another runner" in second.stderr and "run_id=one-id" in second.stderr
        no_traceback(second.stderr)
        assert first.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert [row["users"] for row in rows(tmp_path / "a" / "results")] == [2, 3]
    assert not (tmp_path / "b" / "results" / "results.jsonl").exists()
    wait_idle(vllm_server.base_url, 120)


def test_a_parallel_sweep_on_a_fresh_sqlite_store(
    vllm_server, tmp_path: Path, cache_dir: Path
) -> None:
    """Two jobs at once (joblib) on one fresh MLflow sqlite file and one fresh model
    cache: the experiment is created once, locks do not end a job, both jobs finish."""
    fresh_cache = tmp_path / "cache"
    python, module, runner, *overrides = [
        arg
        for arg in runner_command(tmp_path, fresh_cache, "-", *external(vllm_server.base_url))
        if not arg.startswith(("run_id=", "hydra.run.dir="))
    ]
    done = run(
        [
            python, module, runner, "-m", *overrides, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            "engine.max_num_batched_tokens=2048,4096", "search.users=[2]",
            f"hydra.sweep.dir={tmp_path}/multirun",
        ]  # fmt: skip
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "runner"]
    parents = client.search_runs([experiment.experiment_id], "tags.`runner.kind` = 'search'")
    assert sorted(p.data.params["engine.max_num_batched_tokens"] for p in parents) == ["2048", "4096"]
    assert all(p.info.status == "FINISHED" for p in parents)
    assert not list(fresh_cache.rglob("*.partial*"))
    wait_idle(vllm_server.base_url, 120)


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_process_backend_never_adopts_a_server_it_did_not_start(tmp_path: Path) -> None:
    """Between runner's port check and its engine's bind, another server takes the port
    and answers /health: runner must refuse it, not measure it as its engine. The
    "engine" here never listens; the other server binds once it has started."""
    port = free_port(8900)
    started = tmp_path / "started"
    sleeper = tmp_path / "python"
    sleeper.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 120\n")
    sleeper.chmod(0o755)
    server: list[HTTPServer] = []

    def take_the_port() -> None:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        server.append(HTTPServer(("127.0.0.1", port), _Healthy))
        server[0].serve_forever(poll_interval=0.1)

    thread = threading.Thread(target=take_the_port, daemon=True)
    thread.start()
    plan = LaunchPlan(image=None, argv=["--port", str(port)], port=port)
    engine = ProcessEngine(plan, log_dir=tmp_path, startup_timeout_s=30, python=str(sleeper))
    try:
        with pytest.raises(EngineStartError, match="not from the engine runner started"):
            engine.__enter__()
        assert engine.pid is None  # the process it started was stopped again
    finally:
        if server:
            server[0].shutdown()
            server[0].server_close()
