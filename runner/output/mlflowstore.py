"""Talking to an MLflow store: connecting, the experiment, and failures a user can act on.

Two kinds of failure are told apart. A store that is locked for a moment (another job
of a parallel sweep writing to the same sqlite file) or a server that drops a
connection is retried with a growing pause, so such a hiccup never ends a job. Any
other failure becomes a :class:`~runner.errors.TrackingError`: one paragraph that
says which store and what to do.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import requests
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import SQLAlchemyError

from runner.config import Tracking
from runner.errors import TrackingError
from runner.secret import redact

log = logging.getLogger("runner")

T = TypeVar("T")

# The first pause before a retry of a transient failure; each next one doubles, up to
# MAX_PAUSE_S, until ``tracking.retry_s`` (30 s by default: longer than a sweep job
# holds the sqlite write lock while it logs a window) is spent.
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 8.0
_TRANSIENT_WORDS = (
    "database is locked", "database table is locked", "temporarily unavailable",
    # A parallel job is creating (or upgrading) a fresh store's tables at this moment.
    "already exists", "out-of-date database schema",
)  # fmt: skip


def connect(tracking: Tracking) -> MlflowClient:
    """A client whose store is ready. A fresh sqlite store is created (MLflow's tables
    and migrations) by one process at a time: the jobs of a parallel sweep that open it
    together would otherwise run the same migrations at once and break each other."""
    if tracking.uri.startswith(("http://", "https://")):
        check_reachable(tracking.uri)
    if not tracking.uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=tracking.uri)
    database = Path(tracking.uri.removeprefix("sqlite:///"))
    # SQLAlchemy creates the database file but not the folder it lives in.
    database.parent.mkdir(parents=True, exist_ok=True)
    with database.with_name(database.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = MlflowClient(tracking_uri=tracking.uri)
        client.search_experiments(max_results=1)  # creates or upgrades the tables now
    return client


def check_reachable(uri: str) -> None:
    """Fail in seconds: MLflow's own client retries an unreachable server for minutes."""
    try:
        httpx.get(f"{uri.rstrip('/')}/health", timeout=10.0)
    except httpx.TransportError as exc:
        raise TrackingError(
            f"The MLflow server at {redact(uri)} does not answer ({redact(str(exc))}). "
            "Start it (mlflow server), fix tracking.uri, or run with "
            "tracking.enabled=false; the results folder is written either way."
        ) from exc


def is_transient(exc: BaseException) -> bool:
    """A failure that passes by itself: a locked sqlite store, a dropped connection."""
    if isinstance(exc, requests.ConnectionError | httpx.TransportError):
        return True
    text = str(exc).lower()
    return any(word in text for word in _TRANSIENT_WORDS)


def call(tracking: Tracking, action: str, operation: Callable[[], T]) -> T:
    """``operation()``, retried while its failure is transient; any failure left over is
    a TrackingError that says what could not be done, where."""
    deadline = time.monotonic() + tracking.retry_s
    pause = FIRST_PAUSE_S
    while True:
        try:
            return operation()
        except (
            MlflowException, OSError, SQLAlchemyError, requests.RequestException, httpx.HTTPError,
        ) as exc:  # fmt: skip
            left = deadline - time.monotonic()
            if left <= 0 or not is_transient(exc):
                raise _paragraph(tracking, action, exc) from exc
            log.info("MLflow store busy while trying to %s (%s); retrying", action, exc)
            time.sleep(min(pause, left))
            pause = min(2 * pause, MAX_PAUSE_S)


def experiment_id(client: MlflowClient, tracking: Tracking) -> str:
    """The experiment's id, created if missing. Parallel jobs on a fresh store may race
    to create it: the loser finds the winner's."""
    experiment = client.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        location = None
        if tracking.artifact_root:
            # Resolved now, so artifacts land under the folder the user ran from.
            location = Path(tracking.artifact_root).expanduser().resolve().as_uri()
        try:
            return client.create_experiment(tracking.experiment, artifact_location=location)
        except MlflowException as exc:
            experiment = client.get_experiment_by_name(tracking.experiment)
            if experiment is None:
                raise
            log.debug("experiment %s was created by a parallel job (%s)", tracking.experiment, exc)
    if experiment.lifecycle_stage == "deleted":
        raise TrackingError(
            f"The MLflow experiment {tracking.experiment!r} at {redact(tracking.uri)} was "
            "deleted. MLflow keeps the name reserved until it is purged; restore it "
            "(mlflow experiments restore) or choose another with tracking.experiment=NAME."
        )
    return experiment.experiment_id


def _paragraph(tracking: Tracking, action: str, exc: BaseException) -> TrackingError:
    detail = redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
    return TrackingError(
        f"Could not {action} in MLflow at {redact(tracking.uri)} "
        f"(experiment {tracking.experiment!r}): {detail}. Check that tracking.uri points "
        "at a reachable server or a writable sqlite file, or run with "
        "tracking.enabled=false; the results folder is written either way."
    )
