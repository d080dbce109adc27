"""Running ``python -m runner`` as a user does, for the tests that stop, kill or starve it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]


# The reasons a window is refused because runner's own client ran late: on a busy
# machine they come and go with its load (runner.measure.gates.judge), so a test whose
# subject is not the measurement accepts them, and only them, on an invalid window.
LATE_CLIENT = ("the client could not keep up", "offered load below")


# Tests that start engines only to stop, kill or restart them skip vLLM's compiled warm-up
# (10-25 s of each start on two cores); what they check does not depend on it.
FAST_START = "engine.extra_args=[--enforce-eager]"


def runner_command(work: Path, cache_dir: Path, run_id: str, *overrides: str) -> list[str]:
    """A short fixed search writing its results (and Hydra's files) to ``work/results``;
    ``overrides`` add to or replace these."""
    return [
        sys.executable, "-m", "runner",
        "search=fixed", "search.users=[2,3]", "search.window_s=6", "search.warmup_s=1",
        f"hydra.run.dir={work}/results", f"tracking.uri=sqlite:///{work}/mlflow.db",
        f"tracking.artifact_root={work}/artifacts", f"cache_dir={cache_dir}", f"run_id={run_id}",
        *overrides,
    ]  # fmt: skip


def external(base_url: str) -> list[str]:
    """Overrides that measure the session's shared engine (its flags only label it)."""
    context = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    return ["backend=external", f"backend.url={base_url}", f"engine.max_model_len={context}"]


def start(command: list[str], log: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    with log.open("w") as sink:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True
        )


def run(command: list[str], timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


def rows(folder: Path) -> list[dict]:
    """The complete rows of ``folder``'s results.jsonl."""
    path = folder / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def wait_for_rows(folder: Path, count: int, child: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 600
    while len(rows(folder)) < count:
        assert child.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"fewer than {count} window(s) within 600 s"
        time.sleep(0.2)


def interrupt(child: subprocess.Popen[str], how: str) -> None:
    """Stop ``child`` as a user or a scheduler would: one signal, or Ctrl-C twice."""
    if how == "double SIGINT":
        child.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the first one is unwinding: the second lands in the teardown
        child.send_signal(signal.SIGINT)
    else:
        child.send_signal(getattr(signal, how))
    child.wait(timeout=180)


def engine_processes(port: int) -> list[psutil.Process]:
    """Local vLLM processes serving ``port``, whoever started them."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "vllm.entrypoints.openai.api_server" in cmdline and str(port) in cmdline:
            found.append(process)
    return found


def gone_within(port: int, timeout_s: float = 60.0) -> bool:
    """Whether every engine process on ``port`` is gone (parent-death signals take a moment)."""
    deadline = time.monotonic() + timeout_s
    while engine_processes(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
