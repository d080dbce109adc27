"""Whether the load generator itself kept up during a window.

A client that falls behind stamps chunks late, dispatches the next request late and
under-counts what the server delivered, and the window then measures the client
instead of the engine. Three figures are read over each window:

* event-loop lag: a probe task asks to sleep ``LAG_PROBE_INTERVAL_S`` over and over
  and records how late it woke up; every chunk arrival is stamped by the same loop,
  so its p99 bounds how late most timestamps are;
* client CPU: process CPU seconds over wall seconds (all threads, so it can exceed
  100% on a multi-core host);
* open connections: TCP connections of this process established to the engine's
  port, against the number of users meant to be streaming. The window's own
  ``/metrics`` client holds one connection to the same port as well, so the count
  is normally ``users + 1`` and a shortfall of a single user cannot be told apart.

:func:`judge` turns the figures into reasons (empty when the client kept up). The
default lag limit is one token gap at the SLO floor: a loop later than that merges a
floor-rate user's tokens into one read, so the client itself would make the bursts
and the per-user delivery it is there to measure.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from urllib.parse import urlsplit

import numpy as np
import psutil

from runner.measure.records import ClientHealth
from runner.measure.stalls import StallCounters, stalls_between

log = logging.getLogger("runner")

LAG_PROBE_INTERVAL_S = 0.010








def engine_addresses(base_url: str) -> tuple[set[str], int]:
    """The IP addresses and port that ``base_url`` connects to."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as exc:
        log.debug("cannot resolve %s for the connection count: %s", host, exc)
        return set(), port
    return {info[4][0] for info in infos}, port


def count_connections(addresses: set[str], port: int) -> int | None:
    """Established TCP connections of this process to ``addresses``:``port``."""
    try:
        connections = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError) as exc:
        log.debug("cannot list this process's connections: %s", exc)
        return None
    return sum(
        1
        for conn in connections
        if conn.status == psutil.CONN_ESTABLISHED
        and conn.raddr
        and conn.raddr.port == port
        and (not addresses or conn.raddr.ip in addresses)
    )


class ClientHealthProbe:
    """Measures the client between :meth:`start` and :meth:`stop`, on the running loop."""

    def __init__(self, base_url: str, users: int) -> None:
        self._base_url = base_url
        self._users = users
        self._lags: list[float] = []
        self._task: asyncio.Task | None = None
        self._cpu0 = self._wall0 = 0.0
        self._connections: list[int] = []
        self._target: tuple[set[str], int] = (set(), 0)
        self._counters: StallCounters | None = None

    async def start(self) -> None:
        self._target = await asyncio.to_thread(engine_addresses, self._base_url)
        # Counted before the probe runs, so the listing's own cost is not read as lag.
        self._count_connections()
        self._cpu0, self._wall0 = time.process_time(), time.monotonic()
        self._counters = StallCounters.now()
        self._task = asyncio.create_task(self._probe(), name="client-health-probe")

    async def stop(self) -> ClientHealth:
        if self._task is None:  # never started: nothing was measured
            return ClientHealth(None, None, None, None, self._users)
        cpu, wall = time.process_time() - self._cpu0, time.monotonic() - self._wall0
        stalls = stalls_between(self._counters, StallCounters.now()) if self._counters else None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._count_connections()
        lags = np.asarray(self._lags)
        return ClientHealth(
            loop_lag_p99_ms=float(np.percentile(lags, 99) * 1000.0) if lags.size else None,
            loop_lag_max_ms=float(lags.max() * 1000.0) if lags.size else None,
            cpu_pct=cpu / wall * 100.0 if wall > 0 else None,
            # The smaller reading: a connection lost at either end is a shortfall.
            open_connections=min(self._connections) if self._connections else None,
            users=self._users,
            loop_lag_mean_ms=float(lags.mean() * 1000.0) if lags.size else None,
            stalls=stalls,
        )

    def _count_connections(self) -> None:
        count = count_connections(*self._target)
        if count is not None:
            self._connections.append(count)

    async def _probe(self) -> None:
        lags = self._lags
        while True:
            asked = time.monotonic()
            await asyncio.sleep(LAG_PROBE_INTERVAL_S)
            lags.append(max(0.0, time.monotonic() - asked - LAG_PROBE_INTERVAL_S))
