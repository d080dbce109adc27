"""What every engine backend provides to the measurement stages."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class LaunchPlan:
    """How an engine is started: built purely from the config by :mod:`runner.launch`.

    ``env`` holds values that are not secret; ``secret_env`` holds only the *names*
    of variables whose values are read from the user's environment at launch and
    never written anywhere.
    """

    image: str | None
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secret_env: list[str] = field(default_factory=list)
    mounts: list[tuple[str, str, str]] = field(default_factory=list)  # (host, container, mode)
    port: int = 8000
    gpus: str | None = None  # "all", a count, or comma-separated device ids
    model_path: str | None = None


@dataclass(frozen=True)
class EngineFault:
    """Why an engine stopped serving (exit, OOM kill, restart)."""

    reason: str
    exit_code: int | None = None
    oom_killed: bool = False


def process_fault(exit_code: int) -> EngineFault:
    """Why a local engine process that exited with ``exit_code`` stopped serving.

    Linux's OOM killer ends a process with SIGKILL: Popen reports -9, a shell 137.
    """
    oom = exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL)
    reason = f"the engine process exited with status {exit_code}"
    if oom:
        reason += " (killed by SIGKILL, as the kernel's OOM killer does)"
    return EngineFault(reason, exit_code=exit_code, oom_killed=oom)


def container_fault(state: dict[str, Any], restarts: int) -> EngineFault | None:
    """Why a container in Docker's ``State`` (after ``restarts`` restarts) stopped serving."""
    oom_killed = bool(state.get("OOMKilled"))
    if state.get("Status") in ("exited", "dead"):
        exit_code = state.get("ExitCode")
        reason = f"the engine container exited with status {exit_code}"
        if oom_killed:
            reason += " (killed for lack of memory)"
        return EngineFault(reason=reason, exit_code=exit_code, oom_killed=oom_killed)
    if restarts:
        return EngineFault(
            reason=f"the engine container restarted {restarts} time(s)", oom_killed=oom_killed
        )
    return None


class RunningEngine(Protocol):
    """A started engine, as the run and the window protocol see it.

    ``ready_s`` is how long it took to answer /health (None for a server runner did
    not start); ``image_id`` and ``repo_digests`` name the image a container really
    ran (None and [] for other backends).
    """

    base_url: str
    log_path: Path | None
    ready_s: float | None
    image_id: str | None
    repo_digests: list[str]

    def fault(self) -> EngineFault | None:
        """None while the engine serves; otherwise why it stopped."""
        ...

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the engine log, for error messages."""
        ...
