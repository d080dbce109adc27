"""The engine session: one engine and one MLflow parent run, opened and closed in order.

Both run kinds (the capacity search and seed 000's fixed benchmark) measure inside one::

    with EngineSession(context, plan, finish=write_report) as session:
        ... session.engine ... session.tracker ... session.relaunch() ...

On the way in: the MLflow parent run, the engine, its start-up facts, the proof that it
runs the precision asked for (seed 004 §5), all of them written to the manifest and
MLflow. On the way out, in this order whatever happened: the engine is stopped (so a
slow report or upload never keeps a GPU busy), the manifest is written, ``finish``
writes what the run produced (report, plots, artifacts), and the parent run is closed
FINISHED, FAILED or KILLED. A failure in that late I/O never replaces the error that
ended the run: it is logged and the original error keeps its message and exit code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from runner import shutdown
from runner.engines.base import LaunchPlan, RunningEngine
from runner.engines.docker import DockerEngine
from runner.engines.external import ExternalEngine
from runner.engines.process import ProcessEngine
from runner.engines.startup import (
    facts_from_cache_config,
    facts_from_version,
    parse_startup_log,
    verify_precision,
)
from runner.errors import RunnerError
from runner.measure.metrics import parse_metrics
from runner.measure.priority import ClientPriority, raise_client_priority, restore_client_priority
from runner.measure.telemetry import GpuSampler
from runner.nvml import nvml_available
from runner.output.tracking import Status, Tracker, config_params
from runner.run.context import RunContext, engine_api_key

log = logging.getLogger("runner")

# A run whose engine keeps dying is not measuring anything; relaunch at most this often.
MAX_RELAUNCHES = 2


def open_engine(context: RunContext, plan: LaunchPlan) -> AbstractContextManager[RunningEngine]:
    """The engine backend the config names, not started yet."""
    config = context.config
    if config.backend.kind == "external":
        assert config.backend.url is not None  # validated
        return ExternalEngine(config.backend.url, api_key=engine_api_key(config))
    if config.backend.kind == "docker":
        return DockerEngine(
            config,
            plan,
            run_id=context.run_id,
            config_id=context.config_id,
            log_dir=context.results_dir,
        )
    return ProcessEngine(
        plan,
        log_dir=context.results_dir,
        startup_timeout_s=config.backend.startup_timeout_s,
        python=config.backend.python,
    )


def startup_facts(engine: RunningEngine) -> dict[str, Any]:
    """Start-up facts from the engine log and /metrics (seed 000 reports these)."""
    facts: dict[str, Any] = {}
    if engine.log_path is not None and Path(engine.log_path).exists():
        facts.update(parse_startup_log(Path(engine.log_path).read_text(errors="replace")))
    try:
        text = httpx.get(f"{engine.base_url}/metrics", timeout=10.0).text
        facts.update(facts_from_cache_config(parse_metrics(text).cache_config))
    except httpx.HTTPError as exc:
        log.warning("could not read /metrics for start-up facts: %s", exc)
    if "vllm_version" not in facts:  # an external engine: no log, but the server says
        try:
            facts.update(facts_from_version(httpx.get(f"{engine.base_url}/version", timeout=10.0).json()))
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("could not read /version for start-up facts: %s", exc)
    # The image the Docker engine really ran, read back from it: pinned, and proven.
    if engine.image_id:
        facts["image_id"] = engine.image_id
    if engine.repo_digests:
        facts["repo_digests"] = engine.repo_digests
    if engine.ready_s is not None:
        facts["ready_s"] = round(engine.ready_s, 1)
    return facts


class EngineSession:
    """See the module docstring. ``finish(tracker)`` runs after the engine stopped;
    ``engine=False`` opens only the MLflow run (a finished run that logs what it lacks)."""

    def __init__(
        self,
        context: RunContext,
        plan: LaunchPlan,
        *,
        finish: Callable[[Tracker], None] | None = None,
        tags: dict[str, str] | None = None,
        engine: bool = True,
    ) -> None:
        self.context = context
        self.plan = plan
        self.relaunches = 0
        self._finish = finish
        self._tags = tags or {}
        self._with_engine = engine
        self._engine_cm: AbstractContextManager[RunningEngine] | None = None
        self._engine: RunningEngine | None = None
        self._tracker: Tracker | None = None
        self._priority: ClientPriority | None = None

    @property
    def engine(self) -> RunningEngine:
        assert self._engine is not None, "the session's engine is not running"
        return self._engine

    @property
    def tracker(self) -> Tracker:
        assert self._tracker is not None, "the session is not open"
        return self._tracker

    def __enter__(self) -> EngineSession:
        context = self.context
        self._tracker = Tracker(
            context.config.tracking,
            run_id=context.run_id,
            config_id=context.config_id,
            tags={**context.tracking_tags(), **self._tags},
            params=config_params(context.config),
        )
        try:
            if self._with_engine:
                self._note_other_engines()
                self._start_engine()
                self._raise_priority()
                facts = startup_facts(self.engine)
                facts["precision_notes"] = verify_precision(context.config, facts)
                context.manifest["startup"] = facts
                context.write_manifest()
                self.tracker.log_startup_facts(facts)
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # A second Ctrl-C or SIGTERM waits until the engine is gone and the run's
        # records and MLflow status are written (runner.shutdown).
        with shutdown.shielded():
            self._close(exc_type, exc, traceback)

    def _close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop_engine(exc_type, exc, traceback)
        if self._priority is not None:
            restore_client_priority(self._priority)
            self._priority = None
        status: Status = "FINISHED"
        if exc_type is not None:
            status = "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED"
        for step in (self.context.write_manifest, self._run_finish):
            try:
                if self.context.results_dir.exists():
                    step()
            except (RunnerError, OSError) as error:
                if exc_type is None:
                    raise
                log.warning("after the run failed, runner could not finish its records: %s", error)
        try:
            self.tracker.finish(status)
        except RunnerError as error:
            if exc_type is None:
                raise
            log.warning("could not mark the MLflow run %s: %s", status, error)

    def _note_other_engines(self) -> None:
        """Other vLLM servers on this host, named before the run's engine starts: even
        idle, one holds the load loop off the cores (its windows are then refused for a
        late client), and on a GPU one holds memory. Kept in the manifest by pid and port."""
        from runner.prepare.hostcheck import check_other_engines

        seen = check_other_engines(self.context.config)
        self.context.manifest["other_vllm_servers"] = seen.found
        if seen.status != "ok":
            log.warning("other vLLM servers run on this host: %s; %s", seen.found, seen.fix)

    def _raise_priority(self) -> None:
        """Once the engine serves, the load loop's session group gets a larger CPU weight
        (runner.measure.priority); it is given back when the session closes."""
        if self.context.config.backend.client_priority != "raised":
            return
        self._priority = raise_client_priority()
        self.context.manifest["client_priority"] = asdict(self._priority)

    def relaunch(self) -> None:
        """Stop the engine and start a fresh one from the same plan."""
        self.relaunches += 1
        self._stop_engine(None, None, None)
        self._start_engine()

    def telemetry(self) -> GpuSampler | None:
        """A GPU sampler for each window, where the run has a GPU profile and NVML."""
        if self.context.config.hw is None or not nvml_available():
            return None
        return GpuSampler()

    def _start_engine(self) -> None:
        self._engine_cm = open_engine(self.context, self.plan)
        self._engine = self._engine_cm.__enter__()

    def _stop_engine(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        engine_cm, self._engine_cm, self._engine = self._engine_cm, None, None
        if engine_cm is not None:
            with shutdown.shielded():
                engine_cm.__exit__(exc_type, exc, traceback)

    def _run_finish(self) -> None:
        if self._finish is not None:
            self._finish(self.tracker)
