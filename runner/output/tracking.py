"""MLflow tracking: one parent run per search, one child run per window.

The parent run carries the resolved config as dotted params, the tags that identify
the setup (``config_id``, ``run_id``, ``hw``, ``model``, ``kv``, ``family``, ...) and
every window's metrics with ``step=users``, so its charts draw metric-vs-N curves.
Each window is also a child run (``mlflow.parentRunId``) tagged with its users, phase
and validity. At the end the run loop logs :data:`BEST_USERS`,
:data:`BEST_AGGREGATE_TOK_S` and :data:`BEST_MIN_USER_TOK_S` on the parent, with
every SLO tier's answer, the 95% intervals and the cost figures
(:mod:`runner.output.capacity` names them), which :mod:`runner.compare` reads.

A resumed run finds its parent again (same ``run_id`` and ``config_id``) and skips
windows whose child run is already there, so resuming leaves no duplicate runs. A
child left half-logged by a runner that died is removed and logged again; one whose
runner still lives (another host, say) is left alone.

MLflow never costs a measurement: the parent run is opened before the engine starts
(a store that cannot be reached is one paragraph, nothing started), and once the
search runs, a window or figure that cannot be logged, even after the retries of
:func:`runner.output.mlflowstore.call`, is kept and logged again at the end. The
rows on disk are the record either way, and a rerun with the run's ``run_id`` logs
whatever MLflow still lacks without measuring anything again.
With ``tracking.enabled=false`` the same API does nothing.
Environment-variable values are never logged, only their names; every param and tag
loses URL credentials on the way (:func:`runner.secret.redact`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from runner.config import RunConfig, Tracking
from runner.errors import TrackingError
from runner.measure.result import WindowResult
from runner.output.capacity import metric_name
from runner.output.mlflowstore import call, connect, experiment_id
from runner.prepare.identity import DUMMY_WEIGHTS, dummy_weights
from runner.search.params import DEFAULT
from runner.secret import redact

log = logging.getLogger("runner")

BEST_USERS = metric_name(DEFAULT, "users")  # "best_users"
BEST_AGGREGATE_TOK_S = metric_name(DEFAULT, "aggregate_tok_s")
BEST_MIN_USER_TOK_S = metric_name(DEFAULT, "min_user_tok_s")

KIND_TAG = "runner.kind"  # "search" on parents, "window" on children
WINDOW_INDEX_TAG = "window_index"
WRITER_TAG = "runner.writer"  # "<host>:<pid>" of the runner that logs a child
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
        # Random weights (a generated model, or --load-format dummy) are never a checkpoint's.
        "weights": DUMMY_WEIGHTS if dummy_weights(config) else "checkpoint",
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
        self._children: dict[int, str] = {}
        # What could not be logged yet: (what, how), tried again at the end.
        self._deferred: list[tuple[str, Callable[[], None]]] = []
        if not tracking.enabled:
            self._client: MlflowClient | None = None
            return
        self._client = call(tracking, "open the MLflow store", lambda: connect(tracking))
        self._experiment_id = call(
            tracking, "open the experiment", lambda: experiment_id(self._client, tracking)
        )
        existing = call(
            tracking,
            "look up this run's parent run",
            lambda: _search_parent(self._client, self._experiment_id, run_id, config_id),
        )
        if existing is None:
            all_tags = {**(tags or {}), "config_id": config_id, "run_id": run_id, KIND_TAG: "search"}
            run = call(
                tracking,
                "create the parent run",
                lambda: self._client.create_run(
                    self._experiment_id,
                    run_name=f"{config_id}-{run_id}",
                    tags={key: _clip(str(value), MAX_TAG_VALUE) for key, value in all_tags.items()},
                ),
            )
            self.parent_run_id = run.info.run_id
        else:
            self.parent_run_id = existing
            self.resumed = True
            call(tracking, "reopen the parent run",
                 lambda: self._client.update_run(existing, status="RUNNING"))  # fmt: skip
            self._logged_windows = call(
                tracking, "read the windows already logged", self._finished_windows
            )
            log.info(
                "resuming MLflow run %s (%d windows already logged)",
                existing,
                len(self._logged_windows),
            )
        call(tracking, "log the run's parameters", lambda: self._log_params(params or {}))

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
            log.warning("could not mark the MLflow run %s: %s", status, error)

    @property
    def deferred(self) -> list[str]:
        """What is waiting to be logged because MLflow failed; empty when all is in."""
        return [what for what, _ in self._deferred]

    def log_window(self, result: WindowResult, index: int) -> None:
        """One child run for window number ``index``; its metrics also go on the parent."""
        if self._client is None or index in self._logged_windows:
            return
        self._attempt(f"log the window at users={result.row.users}", lambda: self._log_window(result, index))

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Metrics on the parent run (e.g. :data:`BEST_USERS` at the end of a search)."""
        if self._client is None:
            return
        self._attempt(
            "log metrics on the parent run",
            lambda: self._log_metrics(self.parent_run_id, metrics, step=step or 0),
        )

    def log_tags(self, tags: Mapping[str, str]) -> None:
        """Tags on the parent run (e.g. each SLO tier's binding limit at the end)."""
        if self._client is None or not tags:
            return
        entries = [
            RunTag(_clip(key, MAX_KEY), _clip(str(value), MAX_TAG_VALUE))
            for key, value in tags.items()
        ]
        self._attempt(
            "log tags on the parent run",
            lambda: self._client.log_batch(self.parent_run_id, tags=entries),
        )

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
        readable = json.loads(json.dumps(dict(facts), default=str))

        def log_facts() -> None:
            self._log_metrics(self.parent_run_id, numbers, step=0)
            if tags:
                self._client.log_batch(self.parent_run_id, tags=tags)
            self._client.log_dict(self.parent_run_id, readable, "startup_facts.json")

        self._attempt("log the engine startup facts", log_facts)

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """Copy a file or a whole folder into the parent run's artifacts."""
        if self._client is None:
            return
        path = Path(path)

        def store() -> None:
            if path.is_dir():
                self._client.log_artifacts(self.parent_run_id, str(path), artifact_path)
            else:
                self._client.log_artifact(self.parent_run_id, str(path), artifact_path)

        self._attempt(f"store {path} as an artifact", store)

    def finish(self, status: Status) -> None:
        """Log what was deferred, then close the parent run with FINISHED, FAILED or
        KILLED (once). Raises TrackingError when MLflow still refuses something."""
        if self._client is None or self._finished:
            self._finished = True
            return
        pending, self._deferred = self._deferred, []
        still = []
        for what, operation in pending:
            try:
                call(self.tracking, what, operation)
            except TrackingError:
                still.append(what)
        call(self.tracking, f"mark the parent run {status}",
             lambda: self._client.set_terminated(self.parent_run_id, status))  # fmt: skip
        self._finished = True
        if still:
            raise TrackingError(
                f"MLflow at {redact(self.tracking.uri)} refused, to the end, to "
                f"{'; '.join(still[:3])}{' and more' if len(still) > 3 else ''}. Every "
                "window is in the results folder; rerun the same command with "
                f"run_id={self.run_id} once MLflow answers to log what it lacks (nothing "
                "is measured again)."
            )

    def _attempt(self, what: str, operation: Callable[[], None]) -> None:
        """``operation`` now, or, if MLflow keeps failing, at :meth:`finish`."""
        try:
            call(self.tracking, what, operation)
        except TrackingError as exc:
            if not self._deferred:
                log.warning("%s The run goes on; runner tries again at its end.", exc)
            self._deferred.append((what, operation))

    def _log_window(self, result: WindowResult, index: int) -> None:
        row = result.row
        metrics = _row_metrics(result)
        tags = {
            PARENT_TAG: self.parent_run_id,
            KIND_TAG: "window",
            WINDOW_INDEX_TAG: str(index),
            WRITER_TAG: _writer(),
            "config_id": self.config_id,
            "run_id": self.run_id,
            "users": str(row.users),
            "phase": result.detail.phase,
            "valid": str(row.valid).lower(),
        }
        if result.detail.invalid_reasons:
            tags["invalid_reasons"] = _clip("; ".join(result.detail.invalid_reasons), MAX_TAG_VALUE)
        # A retry after a failure part-way reuses the child it already created.
        if index not in self._children:
            self._children[index] = self._client.create_run(
                self._experiment_id,
                run_name=f"{self.config_id}-w{index:03d}-n{row.users}",
                tags=tags,
            ).info.run_id
        child_id = self._children[index]
        self._log_metrics(child_id, metrics, step=row.users)
        self._log_metrics(self.parent_run_id, metrics, step=row.users)
        self._client.set_terminated(child_id, "FINISHED")
        self._logged_windows.add(index)

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
        """Window indices with a FINISHED child. A child its writer left half-logged is
        removed (it is logged again); one whose writer may still be logging is kept."""
        done: set[int] = set()
        for child in self._client.search_runs(
            [self._experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{self.parent_run_id}'",
            max_results=50000,
        ):
            index = child.data.tags.get(WINDOW_INDEX_TAG)
            if child.info.status == "FINISHED" and index is not None:
                done.add(int(index))
            elif _writer_gone(child.data.tags.get(WRITER_TAG)):
                self._client.delete_run(child.info.run_id)
            else:
                log.warning(
                    "MLflow child run %s is still being written by %s; leaving it alone",
                    child.info.run_id,
                    child.data.tags.get(WRITER_TAG),
                )
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


def _writer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _writer_gone(writer: str | None) -> bool:
    """Whether the runner named ``<host>:<pid>`` is gone. A child without the tag comes
    from an older runner; one from another host cannot be checked and is left alone."""
    if writer is None:
        return True
    host, _, pid = writer.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


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
