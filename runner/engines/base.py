"""What every engine backend provides to the measurement stages."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


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


class RunningEngine(Protocol):
    """A started engine, as the window protocol sees it."""

    base_url: str
    log_path: Path | None

    def fault(self) -> EngineFault | None:
        """None while the engine serves; otherwise why it stopped."""
        ...

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the engine log, for error messages."""
        ...
