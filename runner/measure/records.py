"""The raw records one window collects, before any statistics.

They sit low in the tree so that the transports, the load generator and the
samplers fill them without importing the statistics that read them
(:mod:`runner.measure.window`). Times are seconds on the client's monotonic clock.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Any, Literal

from runner.engines.base import EngineFault
from runner.measure.metrics import EngineMetrics


@dataclass
class RequestRecord:
    """One streamed request, timed on the client's monotonic clock (seconds).

    ``chunk_times[i]`` is when the i-th read carrying token IDs arrived and
    ``chunk_tokens[i]`` how many token IDs it carried (several when the server
    merged deltas into one event or several events arrived in one read);
    kept compact because a long window at high concurrency holds millions of them,
    and kept at all because bursty delivery (seed 000) shows only in their spacing.
    """

    user: int
    bucket_total: int
    prompt_id: str
    dispatched_at: float
    first_token_at: float | None = None
    finished_at: float | None = None
    chunk_times: array = field(default_factory=lambda: array("d"))
    chunk_tokens: array = field(default_factory=lambda: array("I"))
    # SSE events that carried token IDs: against the tokens, how much the server merged
    # per event; against the reads, how many events the client took in at once.
    token_events: int = 0
    error: str | None = None
    usage_completion_tokens: int | None = None
    # A chat user pauses this long after the request ends, on purpose (think time):
    # not idleness of the client (runner.measure.gates).
    think_after_s: float = 0.0
    # The streamed token IDs as the JSON text of their numbers, comma-separated, kept
    # only when asked for (a bytearray given): a chat user sends them back as its history.
    returned_ids: bytearray | None = None

    @property
    def tokens(self) -> int:
        return sum(self.chunk_tokens)

    def tokens_between(self, start: float, end: float) -> int:
        """Token IDs whose chunk arrived in ``[start, end]``."""
        first = bisect_left(self.chunk_times, start)
        last = bisect_right(self.chunk_times, end)
        return sum(self.chunk_tokens[first:last])


@dataclass(frozen=True)
class MetricsSample:
    """One read of ``/metrics``: ``at`` is when its answer arrived (see
    :mod:`runner.sampler` for why), ``took_s`` the GET's duration."""

    at: float
    metrics: EngineMetrics
    took_s: float = 0.0


@dataclass(frozen=True)
class WindowMeasurement:
    """Everything one window collected, before any statistics.

    ``t0``/``t1`` are the arrival stamps of the two boundary reads of
    ``/metrics`` (``start``/``end``); ``end`` is None when it could not be read.
    """

    timestamp_utc: str
    users: int
    user_buckets: list[int]  # bucket total_tokens of user i
    window_s: float  # nominal, as configured
    t0: float
    t1: float
    records: list[RequestRecord]
    start: EngineMetrics
    end: EngineMetrics | None
    samples: list[MetricsSample] = field(default_factory=list)
    telemetry: TelemetrySummary | None = None
    engine_fault: EngineFault | None = None
    client: ClientHealth | None = None
    warmup_s: float = 0.0  # as it lasted: at least search.warmup_s (runner.measure.protocol)
    cold_users: int = 0  # users without a finished request when the window began
    cancelled_at_drain: int = 0
    failed_metric_reads: int = 0
    # How long each boundary GET took: the server read its counter at some moment
    # between sending and ``t0``/``t1``, and the audit allows for exactly that.
    start_read_s: float = 0.0
    end_read_s: float = 0.0


PowerSource = Literal["energy", "samples"]


@dataclass(frozen=True)
class GpuFigures:
    """One GPU over one window. ``power_source`` says how its power was measured:
    ``energy`` (NVML's energy counter over the window) or ``samples`` (the mean of
    the 1 Hz power reads, where the counter is unsupported)."""

    gpu: int
    util_avg_pct: float | None
    power_avg_w: float | None
    power_source: PowerSource | None
    energy_j: float | None = None
    memory_used_max_gib: float | None = None
    temperature_max_c: float | None = None


@dataclass(frozen=True)
class TelemetrySummary:
    """GPU telemetry over one window; ``None`` figures mean unavailable, not zero."""

    available: bool
    gpu_util_avg_pct: float | None
    power_avg_w: float | None
    samples: list[dict[str, Any]] = field(default_factory=list)
    throttled: bool = False
    # "energy" only when every GPU's power came from its energy counter.
    power_source: PowerSource | None = None
    gpus: list[GpuFigures] = field(default_factory=list)


@dataclass(frozen=True)
class Stalls:
    """Where a window's wall time went besides the client's own work, each ``None`` where
    this machine does not say: the loop thread's seconds runnable but waiting for a CPU,
    the process's major page faults (memory read back from disk), and the seconds of
    the machine's CPUs that the hypervisor gave to other guests (steal, all CPUs)."""

    run_queue_s: float | None
    major_faults: int | None
    steal_s: float | None


@dataclass(frozen=True)
class ClientHealth:
    """The client's own figures over one window; ``None`` means unavailable."""

    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    cpu_pct: float | None
    open_connections: int | None
    users: int
    kept_up: bool = True
    reasons: tuple[str, ...] = ()
    # The loop's mean lag: how late, on average, an event was read after it arrived.
    loop_lag_mean_ms: float | None = None
    # Where a late loop's time went (runner.measure.stalls): the loop's thread waiting
    # for a CPU, the process's major page faults (its memory read back from disk), and
    # the machine's CPU time the hypervisor ran elsewhere.
    stalls: Stalls | None = None




