"""A server that is already running: runner measures it and never starts or stops it."""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

import httpx

from runner.engines.base import EngineFault
from runner.errors import EngineStartError

# How long /health may fail in a row before the server counts as stopped.
HEALTH_GRACE_S = 30.0


class ExternalEngine:
    """Context manager over an existing OpenAI-compatible vLLM server."""

    log_path: Path | None = None

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.base_url = url.rstrip("/")
        self.api_key = api_key
        self.ready_s: float | None = None
        self._failing_since: float | None = None
        self.image_id: str | None = None
        self.repo_digests: list[str] = []

    def __enter__(self) -> "ExternalEngine":
        try:
            response = httpx.get(f"{self.base_url}/health", timeout=10.0)
        except httpx.HTTPError as exc:
            raise EngineStartError(
                f"No engine answers at {self.base_url} ({exc}). backend=external measures a "
                "server that is already running: start it first, or check backend.url."
            ) from exc
        if response.status_code != 200:
            raise EngineStartError(
                f"The engine at {self.base_url} answered /health with HTTP {response.status_code}; "
                "runner measures only a server that reports itself healthy."
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    def fault(self) -> EngineFault | None:
        """None while /health answers 200. A server under full load can answer one
        check late: only /health failing for HEALTH_GRACE_S in a row is a fault."""
        try:
            status = httpx.get(f"{self.base_url}/health", timeout=10.0).status_code
            problem = None if status == 200 else f"/health answered HTTP {status}"
        except httpx.HTTPError as exc:
            problem = f"the engine stopped answering /health ({exc.__class__.__name__})"
        if problem is None:
            self._failing_since = None
            return None
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since < HEALTH_GRACE_S:
            return None
        return EngineFault(f"{problem} for {now - self._failing_since:.0f} s")

    def log_tail(self, lines: int = 40) -> str:
        return "(the log of an external engine is not available to runner)"
