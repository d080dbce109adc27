"""Reads of vLLM's ``/metrics``: timed boundary reads, the 1 Hz sampler, idle waits.

A read is stamped on the client's monotonic clock when its answer arrives. Under
load most of a read's time is spent queued in the server's busy event loop; the
handler then reads the counter and answers at once, on the same loop that streams
the users' tokens. So the counter matches the tokens the client has received by
the time the answer arrives much better than the GET's midpoint does (measured on
vLLM 0.32 CPU at 64 users with reads of up to 0.8 s: 0.0-0.6% audit gap at the
arrival stamp against 0.1-1.6% at the midpoint).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx

from runner.errors import MeasurementError
from runner.measure.metrics import EngineMetrics, parse_metrics
from runner.measure.records import MetricsSample

log = logging.getLogger("runner")

METRICS_PATH = "/metrics"


async def read_metrics(client: httpx.AsyncClient) -> MetricsSample:
    """One GET of ``/metrics``, parsed, stamped when its answer arrived."""
    sent = time.monotonic()
    try:
        response = await client.get(METRICS_PATH)
        received = time.monotonic()
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise MeasurementError(
            f"Reading {client.base_url}{METRICS_PATH} failed ({type(exc).__name__}: {exc}). "
            "The window protocol needs vLLM's Prometheus metrics for its boundary counters "
            "and idle checks; check that the engine is up and serves /metrics."
        ) from exc
    try:
        metrics = parse_metrics(response.text)
    except ValueError as exc:
        raise MeasurementError(
            f"{client.base_url}{METRICS_PATH} did not return Prometheus text ({exc}). "
            "Check that the URL points at a vLLM OpenAI-compatible server."
        ) from exc
    if metrics.generation_tokens_total is None and metrics.requests_running is None:
        raise MeasurementError(
            f"{client.base_url}{METRICS_PATH} answered, but without vllm:generation_tokens_total "
            "or vllm:num_requests_running. runner measures vLLM servers only; check that the "
            "URL points at vLLM's OpenAI-compatible server."
        )
    return MetricsSample(at=received, metrics=metrics, took_s=received - sent)


class Sampler:
    """Reads ``/metrics`` every ``interval_s`` on a fixed schedule until stopped.

    ``fault`` is polled at every tick (off the event loop: it may ask dockerd) so a
    dead engine ends the window early instead of after minutes of failed requests.
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        interval_s: float,
        fault: Callable[[], object | None] | None = None,
    ) -> None:
        self._client = client
        self._interval_s = interval_s
        self._fault = fault
        self.samples: list[MetricsSample] = []
        self.failed_reads = 0
        self.fault_seen = asyncio.Event()

    async def run(self, until: float) -> None:
        """Sample from now until monotonic time ``until`` or a fault."""
        start = time.monotonic()
        tick = 0
        while True:
            tick += 1
            next_at = start + tick * self._interval_s
            if next_at >= until:
                return
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            try:
                self.samples.append(await read_metrics(self._client))
            except MeasurementError as exc:
                self.failed_reads += 1
                log.debug("metrics sample failed: %s", exc)
            if self._fault is not None and await asyncio.to_thread(self._fault) is not None:
                self.fault_seen.set()
                return


async def wait_idle_async(
    client: httpx.AsyncClient, timeout_s: float, poll_s: float = 0.5
) -> EngineMetrics:
    """Poll until vLLM reports zero running and zero waiting requests."""
    deadline = time.monotonic() + timeout_s
    last: EngineMetrics | None = None
    while True:
        last = (await read_metrics(client)).metrics
        if last.requests_running is None or last.requests_waiting is None:
            raise MeasurementError(
                f"{client.base_url}{METRICS_PATH} exposes no vllm:num_requests_running / "
                "vllm:num_requests_waiting, so runner cannot confirm the engine is idle "
                "between windows. Use a vLLM version that exports them."
            )
        if last.idle:
            return last
        if time.monotonic() >= deadline:
            raise MeasurementError(
                f"The engine at {client.base_url} still had {last.requests_running:g} running "
                f"and {last.requests_waiting:g} waiting requests after {timeout_s:g} s. A window "
                "starts only on an idle engine; raise search.drain_timeout_s or look for stuck "
                "requests in the engine log."
            )
        await asyncio.sleep(poll_s)


def metrics_client(
    base_url: str, headers: dict[str, str], timeout_s: float = 30.0
) -> httpx.AsyncClient:
    """A small client of its own, so boundary reads never queue behind user streams."""
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)
