"""MLflow tracking: one parent run per search, one child run per window.

The parent run carries the resolved config as dotted params, the tags that identify
the setup (``config_id``, ``run_id``, ``hw``, ``model``, ``kv``, ``family``, ...) and
every window's metrics with ``step=users``, so its charts draw metric-vs-N curves.
Each window is also a child run (``mlflow.parentRunId``) tagged with its users, phase
and validity. At the end the run loop logs :data:`BEST_USERS`,
:data:`BEST_AGGREGATE_TOK_S` and :data:`BEST_MIN_USER_TOK_S` on the parent, which
:mod:`runner.compare` reads.

A resumed run finds its parent again (same ``run_id`` and ``config_id``) and skips
windows whose child run is already there, so resuming leaves no duplicate runs.
With ``tracking.enabled=false`` the same API does nothing.
Environment-variable values are never logged, only their names; every param and tag
loses URL credentials on the way (:func:`runner.secret.redact`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import httpx
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from runner.config import RunConfig, Tracking
from runner.errors import TrackingError
from runner.measure.result import WindowResult
from runner.secret import redact

logger = logging.getLogger("runner")

BEST_USERS = "best_users"
BEST_AGGREGATE_TOK_S = "best_aggregate_tok_s"
BEST_MIN_USER_TOK_S = "best_min_user_tok_s"

KIND_TAG = "runner.kind"  # "search" on parents, "window" on children
WINDOW_INDEX_TAG = "window_index"
PARENT_TAG = "mlflow.parentRunId"

# MLflow's documented limits (mlflow.utils.validation); exceeding them is a hard error.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000

Status = Literal["FINISHED", "FAILED", "KILLED"]


def config_tags(config: RunConfig) -> dict[str, str]:
    """The tags that name a run's setup: hardware, model, KV cache and image pinning."""
    return {
        "hw": config.hw.name if config.hw else "cpu",
        "model": config.model.name,
        "kv": config.kv.name,
        "engine": config.engine.name,
        "workload": config.workload.name,
        "image": config.image.reference,
        "image_pinned": "pinned" if config.image.pinned else "unpinned",
    }


def config_params(config: RunConfig) -> dict[str, Any]:
    """The resolved config as dotted keys; environment variables appear by name only."""
    data = config.model_dump(mode="json")
    engine_env = data["engine"].pop("env", {})
    params = dict(_flatten(data))
    params["engine.env"] = ",".join(sorted(engine_env)) or "-"
    return params


class Tracker:
    """Context manager over one MLflow parent run; see the module docstring."""

    def __init__(
        self,
        tracking: Tracking,
        *,
        run_id: str,
        config_id: str,
        tags: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.tracking = tracking
        self.run_id = run_id
        self.config_id = config_id
        self.parent_run_id: str | None = None
        self.resumed = False
        self._finished = False
        self._logged_windows: set[int] = set()
        if not tracking.enabled:
            self._client: MlflowClient | None = None
            return
        with _translated(tracking, "open the experiment and the parent run"):
            self._client = _client(tracking)
            self._experiment_id = _experiment_id(self._client, tracking)
            existing = _search_parent(self._client, self._experiment_id, run_id, config_id)
            if existing is None:
                all_tags = {**(tags or {}), "config_id": config_id, "run_id": run_id}
                all_tags[KIND_TAG] = "search"
                run = self._client.create_run(
                    self._experiment_id,
                    run_name=f"{config_id}-{run_id}",
                    tags={key: _clip(str(value), MAX_TAG_VALUE) for key, value in all_tags.items()},
                )
                self.parent_run_id = run.info.run_id
            else:
                self.parent_run_id = existing
                self.resumed = True
                self._client.update_run(existing, status="RUNNING")
                self._logged_windows = self._finished_windows()
                logger.info(
                    "resuming MLflow run %s (%d windows already logged)",
                    existing,
                    len(self._logged_windows),
                )
            self._log_params(params or {})

    @staticmethod
    def find_parent(tracking: Tracking, run_id: str, config_id: str) -> str | None:
        """The MLflow id of the parent run for this run_id and config_id, if any."""
        if not tracking.enabled:
            return None
        with _translated(tracking, "look up the parent run"):
            client = _client(tracking)
            experiment = client.get_experiment_by_name(tracking.experiment)
            if experiment is None:
                return None
            return _search_parent(client, experiment.experiment_id, run_id, config_id)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._finished:
            return
        if exc_type is None:
            self.finish("FINISHED")
            return
        status: Status = "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        try:
            self.finish(status)
        except TrackingError as error:
            # The exception already on its way out says more than this one would.
            logger.warning("could not mark the MLflow run %s: %s", status, error)

    def log_window(self, result: WindowResult, index: int) -> None:
        """One child run for window number ``index``; its metrics also go on the parent."""
        if self._client is None or index in self._logged_windows:
            return
        row = result.row
        metrics = _row_metrics(result)
        tags = {
            PARENT_TAG: self.parent_run_id,
            KIND_TAG: "window",
            WINDOW_INDEX_TAG: str(index),
            "config_id": self.config_id,
            "run_id": self.run_id,
            "users": str(row.users),
            "phase": result.detail.phase,
            "valid": str(row.valid).lower(),
        }
        if result.detail.invalid_reasons:
            tags["invalid_reasons"] = _clip("; ".join(result.detail.invalid_reasons), MAX_TAG_VALUE)
        with _translated(self.tracking, f"log the window at users={row.users}"):
            child = self._client.create_run(
                self._experiment_id,
                run_name=f"{self.config_id}-w{index:03d}-n{row.users}",
                tags=tags,
            )
            child_id = child.info.run_id
            self._log_metrics(child_id, metrics, step=row.users)
            self._log_metrics(self.parent_run_id, metrics, step=row.users)
            self._client.set_terminated(child_id, "FINISHED")
        self._logged_windows.add(index)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Metrics on the parent run (e.g. :data:`BEST_USERS` at the end of a search)."""
        if self._client is None:
            return
        with _translated(self.tracking, "log metrics on the parent run"):
            self._log_metrics(self.parent_run_id, metrics, step=step or 0)

    def log_startup_facts(self, facts: Mapping[str, Any]) -> None:
        """Engine startup facts: numbers as ``startup.*`` metrics, the rest as tags."""
        if self._client is None:
            return
        numbers = {
            f"startup.{key}": float(value) for key, value in facts.items() if _is_number(value)
        }
        tags = [
            RunTag(_clip(f"startup.{key}", MAX_KEY), _clip(str(value), MAX_TAG_VALUE))
            for key, value in facts.items()
            if value is not None and not _is_number(value)
        ]
        with _translated(self.tracking, "log the engine startup facts"):
            self._log_metrics(self.parent_run_id, numbers, step=0)
            if tags:
                self._client.log_batch(self.parent_run_id, tags=tags)
            readable = json.loads(json.dumps(dict(facts), default=str))
            self._client.log_dict(self.parent_run_id, readable, "startup_facts.json")

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """Copy a file or a whole folder into the parent run's artifacts."""
        if self._client is None:
            return
        path = Path(path)
        with _translated(self.tracking, f"store {path} as an artifact"):
            if path.is_dir():
                self._client.log_artifacts(self.parent_run_id, str(path), artifact_path)
            else:
                self._client.log_artifact(self.parent_run_id, str(path), artifact_path)

    def finish(self, status: Status) -> None:
        """Close the parent run with FINISHED, FAILED or KILLED (once)."""
        if self._client is None or self._finished:
            self._finished = True
            return
        with _translated(self.tracking, f"mark the parent run {status}"):
            self._client.set_terminated(self.parent_run_id, status)
        self._finished = True

    def _log_params(self, params: Mapping[str, Any]) -> None:
        already = self._client.get_run(self.parent_run_id).data.params
        fresh = [
            Param(_clip(key, MAX_KEY), _clip(_param_text(value), MAX_PARAM_VALUE))
            for key, value in params.items()
            if _clip(key, MAX_KEY) not in already
        ]
        for start in range(0, len(fresh), PARAMS_PER_BATCH):
            self._client.log_batch(
                self.parent_run_id, params=fresh[start : start + PARAMS_PER_BATCH]
            )

    def _log_metrics(self, mlflow_run_id: str, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        entries = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        for start in range(0, len(entries), METRICS_PER_BATCH):
            self._client.log_batch(
                mlflow_run_id, metrics=entries[start : start + METRICS_PER_BATCH]
            )

    def _finished_windows(self) -> set[int]:
        """Window indices with a FINISHED child; a half-logged child is removed and redone."""
        done: set[int] = set()
        for child in self._client.search_runs(
            [self._experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}'",
            max_results=50000,
        ):
            index = child.data.tags.get(WINDOW_INDEX_TAG)
            if child.info.status == "FINISHED" and index is not None:
                done.add(int(index))
            else:
                self._client.delete_run(child.info.run_id)
        return done


def _row_metrics(result: WindowResult) -> dict[str, float]:
    """The row's numeric fields; unavailable (None) figures are skipped, not zeroed."""
    metrics: dict[str, float] = {}
    for key, value in result.row.as_dict().items():
        if isinstance(value, bool):
            metrics[key] = 1.0 if value else 0.0
        elif _is_number(value):
            metrics[key] = float(value)
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value


def _param_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _clip(text: str, limit: int) -> str:
    # Every param, tag and key goes through here: URLs lose their credentials first.
    text = redact(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _client(tracking: Tracking) -> MlflowClient:
    if tracking.uri.startswith(("http://", "https://")):
        check_reachable(tracking.uri)
    if tracking.uri.startswith("sqlite:///"):
        # SQLAlchemy creates the database file but not the folder it lives in.
        Path(tracking.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=tracking.uri)


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


def _experiment_id(client: Any, tracking: Tracking) -> str:
    experiment = client.get_experiment_by_name(tracking.experiment)
    if experiment is None:
        location = None
        if tracking.artifact_root:
            # Resolved now, so artifacts land under the folder the user ran from.
            location = Path(tracking.artifact_root).expanduser().resolve().as_uri()
        return client.create_experiment(tracking.experiment, artifact_location=location)
    if experiment.lifecycle_stage == "deleted":
        raise TrackingError(
            f"The MLflow experiment {tracking.experiment!r} at {redact(tracking.uri)} was "
            "deleted. "
            "MLflow keeps the name reserved until it is purged; restore it "
            "(mlflow experiments restore) or choose another with tracking.experiment=NAME."
        )
    return experiment.experiment_id


def _search_parent(client: Any, experiment_id: str, run_id: str, config_id: str) -> str | None:
    for value in (run_id, config_id):
        if "'" in value:
            raise TrackingError(
                f"{value!r} contains a single quote, which MLflow search filters cannot "
                "hold. Use letters, digits, dots, dashes and underscores in run and "
                "config ids."
            )
    runs = client.search_runs(
        [experiment_id],
        filter_string=(
            f"tags.`{KIND_TAG}` = 'search' and tags.run_id = '{run_id}' "
            f"and tags.config_id = '{config_id}'"
        ),
        max_results=1,
    )
    return runs[0].info.run_id if runs else None


class _translated:
    """Turn MLflow and connection failures into a TrackingError a user can act on."""

    def __init__(self, tracking: Tracking, action: str) -> None:
        self.tracking = tracking
        self.action = action

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, TrackingError):
            return
        if isinstance(exc, MlflowException | OSError):
            detail = redact(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
            raise TrackingError(
                f"Could not {self.action} in MLflow at {redact(self.tracking.uri)} "
                f"(experiment {self.tracking.experiment!r}): {detail}. Check that "
                "tracking.uri points at a reachable server or a writable sqlite file, "
                "or run with tracking.enabled=false; the results folder is written "
                "either way."
            ) from exc
