"""One measurement window, end to end (seed 004 section 7).

1. confirm the engine is idle (zero running, zero waiting);
2. start N persistent users and let them warm up, unmeasured;
3. read ``vllm:generation_tokens_total`` (t0), sample ``/metrics`` once a second
   and run the optional GPU telemetry until exactly ``window_s`` later;
4. stop dispatching, read the counter again (t1);
5. follow the requests in flight to completion (or the drain timeout) for their
   latency, and wait until the engine is idle again.

Throughput counts only token IDs that arrived in ``[t0, t1]``; see
:mod:`runner.window` for the statistics.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import httpx

from runner.config import RunConfig
from runner.engines.base import RunningEngine
from runner.errors import EngineError, MeasurementError
from runner.measure.clienthealth import ClientHealthProbe
from runner.measure.load import LoadGenerator, StreamingUsers, UserSettings, auth_headers
from runner.measure.records import MetricsSample, WindowMeasurement
from runner.measure.result import WindowResult
from runner.measure.sampler import Sampler, metrics_client, read_metrics, wait_idle_async
from runner.measure.sessions import SessionUsers
from runner.measure.transport import run as run_async
from runner.measure.window import summarize_window
from runner.workload.conversation import ChatSessions
from runner.workload.prompt import Prompt

log = logging.getLogger("runner")


def run_window(
    engine: RunningEngine,
    config: RunConfig,
    prompts: Sequence[Prompt],
    users: int,
    *,
    config_id: str,
    run_id: str,
    phase: str,
    window_s: float | None = None,
    screening: bool = False,
    telemetry=None,
    api_key: str | None = None,
) -> WindowResult:
    """Measure ``users`` concurrent users for one window; the engine is idle afterwards.

    ``screening`` records the window as a short screening window (its length is
    ``window_s``), which the search never counts as a full one.

    ``prompts`` is the frozen workload; :class:`ChatSessions` makes the users hold
    conversations with think time (:mod:`runner.measure.sessions`).

    ``telemetry`` is anything with ``start()`` and ``stop() -> TelemetrySummary``.
    Raises EngineError when the engine has already failed before the window, and
    MeasurementError when ``/metrics`` cannot be read or the engine does not go idle.
    A fault *during* the window gives an invalid result instead, with its reason.
    """
    measurement = collect_window(
        engine, config, prompts, users, window_s=window_s, telemetry=telemetry, api_key=api_key
    )
    result = summarize_window(
        measurement,
        run_id=run_id,
        config_id=config_id,
        phase=phase,
        screening=screening,
        audit_tolerance_pct=config.slo.audit_tolerance_pct,
        max_loop_lag_ms=config.slo.max_loop_lag_ms,
        min_in_flight_pct=config.slo.min_in_flight_pct,
        prefix_cache=prefix_cache_state(config),
    )
    log.debug(
        "window users=%d aggregate=%.1f tok/s server=%s audit=%s valid=%s",
        users,
        result.row.aggregate_output_tok_s,
        result.row.server_output_tok_s,
        result.detail.audit_delta_pct,
        result.row.valid,
    )
    return result


def collect_window(
    engine: RunningEngine,
    config: RunConfig,
    prompts: Sequence[Prompt],
    users: int,
    *,
    window_s: float | None = None,
    telemetry=None,
    api_key: str | None = None,
) -> WindowMeasurement:
    """The raw window (every request's chunk times included), before any statistics."""
    if users < 1:
        raise ValueError(f"users must be at least 1, got {users}")
    return run_async(
        _collect(
            engine,
            config,
            prompts,
            users,
            window_s=window_s if window_s is not None else config.search.window_s,
            telemetry=telemetry,
            api_key=api_key,
        )
    )


def prefix_cache_state(config: RunConfig) -> str:
    """``off``, or how a window meets the engine's prefix cache: ``cold`` or ``warm``."""
    return config.workload.prefix_cache if config.engine.enable_prefix_caching else "off"


def window_salt(config: RunConfig) -> str | None:
    """A cache salt of this window's own when the cache must start cold (vLLM keys its
    prefix cache by the salt too, so nothing an earlier window cached is reused)."""
    return uuid.uuid4().hex if prefix_cache_state(config) == "cold" else None


def _raise_if_fault(engine: RunningEngine, when: str) -> None:
    fault = engine.fault()
    if fault is not None:
        raise EngineError(
            f"The engine stopped serving {when} ({fault.reason}). No window can be measured "
            f"on it; the run relaunches or stops as backend.on_engine_fault says. "
            f"Last lines of its log:\n{engine.log_tail()}"
        )


async def _collect(
    engine: RunningEngine,
    config: RunConfig,
    prompts: Sequence[Prompt],
    users: int,
    *,
    window_s: float,
    telemetry,
    api_key: str | None,
) -> WindowMeasurement:
    search, workload = config.search, config.workload
    headers = auth_headers(api_key)
    _raise_if_fault(engine, "before the window")
    settings = UserSettings(
        served_name=config.model.served_name,
        ignore_eos=workload.ignore_eos,
        temperature=workload.temperature,
        request_timeout_s=workload.request_timeout_s,
        headers=headers,
        cache_salt=window_salt(config),
    )
    # Chat sessions walk their conversations with think time; any other workload's
    # users cycle through its prompts.
    load: StreamingUsers
    if isinstance(prompts, ChatSessions):
        load = SessionUsers(engine.base_url, prompts, users, **settings)
    else:
        load = LoadGenerator(engine.base_url, prompts, users, **settings)
    async with metrics_client(engine.base_url, headers) as metrics, load:
        await wait_idle_async(metrics, search.drain_timeout_s)
        load.start()
        warm_from = time.monotonic()
        await asyncio.sleep(search.warmup_s)
        cold_users = await _until_every_user_finished_one(load, users, search.drain_timeout_s)
        warmed_s = time.monotonic() - warm_from
        start = await _boundary_read(metrics, engine, "at the start of the window")
        if telemetry is not None:
            telemetry.start()
        sampler = Sampler(metrics, search.metrics_interval_s, engine.fault)
        sampler_task = asyncio.create_task(sampler.run(until=start.at + window_s))
        probe = ClientHealthProbe(engine.base_url, users)
        try:
            await probe.start()
            await _sleep_until(start.at + window_s, sampler.fault_seen)
            load.stop_dispatch()
            end = await _end_read(metrics, engine)
        finally:
            # Stopped even when the window fails, so no telemetry thread outlives it.
            telemetry_summary = telemetry.stop() if telemetry is not None else None
            client = await probe.stop()
        ended_at = end.at if end is not None else time.monotonic()
        sampler_task.cancel()
        (sampler_outcome,) = await asyncio.gather(sampler_task, return_exceptions=True)
        if isinstance(sampler_outcome, Exception):
            raise sampler_outcome  # e.g. the backend's fault() itself failed
        log.debug("window closed; draining %d users", users)
        cancelled = await load.drain(search.drain_timeout_s)
        fault = engine.fault()
        if fault is None:
            await wait_idle_async(metrics, search.drain_timeout_s)
    samples = [start, *sampler.samples, *([end] if end is not None else [])]
    return WindowMeasurement(
        timestamp_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        users=users,
        user_buckets=load.user_buckets,
        window_s=window_s,
        t0=start.at,
        t1=ended_at,
        records=load.records,
        start=start.metrics,
        end=end.metrics if end is not None else None,
        samples=samples,
        telemetry=telemetry_summary,
        engine_fault=fault,
        client=client,
        warmup_s=warmed_s,
        cold_users=cold_users,
        cancelled_at_drain=cancelled,
        failed_metric_reads=sampler.failed_reads,
        start_read_s=start.took_s,
        end_read_s=end.took_s if end is not None else 0.0,
    )


async def _until_every_user_finished_one(load: LoadGenerator, users: int, cap_s: float) -> int:
    """Extend the warm-up until every user has finished a request (at most ``cap_s``);
    returns how many had not.

    All users start together, so their first requests move in step: with seed 004's
    long prompts, the first prefills queue behind each other for tens of seconds, and a
    window that begins then measures that ramp, not the steady state. Once each user
    has finished one request, arrivals have spread out.
    """
    deadline = time.monotonic() + cap_s
    while True:
        finished = {record.user for record in load.records if record.finished_at is not None}
        if len(finished) >= users or time.monotonic() >= deadline:
            return users - len(finished)
        await asyncio.sleep(0.1)


async def _sleep_until(deadline: float, interrupt: asyncio.Event) -> None:
    """Sleep to the monotonic ``deadline``, or less if ``interrupt`` fires."""
    waiter = asyncio.create_task(interrupt.wait())
    try:
        await asyncio.wait([waiter], timeout=max(0.0, deadline - time.monotonic()))
    finally:
        waiter.cancel()


async def _boundary_read(
    client: httpx.AsyncClient, engine: RunningEngine, when: str
) -> MetricsSample:
    try:
        return await read_metrics(client)
    except MeasurementError:
        _raise_if_fault(engine, when)
        raise


async def _end_read(client: httpx.AsyncClient, engine: RunningEngine) -> MetricsSample | None:
    """The closing counter read; None when the engine died (the window is then invalid)."""
    try:
        return await read_metrics(client)
    except MeasurementError:
        if engine.fault() is not None:
            return None
        raise
