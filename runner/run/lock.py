"""One runner per run_id and per results folder at a time.

Two runners on one run_id would append to the same rows, resume each other's windows
and mark each other's MLflow runs; two on one folder would interleave their rows. A
run therefore holds two advisory locks (``flock``) for its lifetime: one on its
results folder and one on its run_id (under ``cache_dir/locks``, so it holds across
results folders on this host). The kernel drops them when the process ends, however
it ends, so a killed runner never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from types import TracebackType
from typing import IO

from runner.errors import ConfigError, ResultsError

LOCK_NAME = ".runner.lock"


class RunLock:
    """``with RunLock(results_dir, run_id, cache_dir):`` or a ConfigError naming the holder."""

    def __init__(self, results_dir: Path, run_id: str, cache_dir: Path) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)
        self.paths = [
            (results_dir / LOCK_NAME, f"the results folder {results_dir}"),
            (cache_dir / "locks" / f"{safe}.lock", f"run_id={run_id}"),
        ]
        self._handles: list[IO[str]] = []

    def __enter__(self) -> RunLock:
        try:
            for path, what in self.paths:
                self._handles.append(_take(path, what))
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.close()


def _take(path: Path, what: str) -> IO[str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    except OSError as exc:
        raise ResultsError(
            f"runner cannot create its lock file {path} ({exc}); check that the folder "
            "is writable (results.dir, cache_dir)."
        ) from exc
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(
            f"Another runner (pid {holder}) is using {what}: two runners would write the "
            "same rows and MLflow runs. Wait for it to finish, stop it, or give this run "
            "another run_id and results.dir."
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle
