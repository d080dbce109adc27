"""Values that cross stage boundaries: the window row and its detail.

``WindowRow`` holds the seed 004 section 8 fields in the seed's order (``config_id``
and ``run_id`` included, which the seed also puts in every row), with two of runner's
own beside ``users``: ``in_flight_pct`` and ``server_in_flight_mean`` say how much of
N the engine really got. It is what goes to JSONL, CSV, the console and MLflow. ``WindowDetail`` carries what the seed
asks to keep beside it (per-user and per-bucket figures, audit, invalid reasons).
Figures that could not be measured are ``None`` ("unavailable"), never zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pydantic import TypeAdapter

from runner.engines.base import EngineFault
from runner.measure.gates import OfferedLoad
from runner.measure.records import ClientHealth, GpuFigures, PowerSource
from runner.measure.streams import StreamSummary
from runner.measure.uncertainty import Interval


@dataclass(frozen=True)
class WindowRow:
    timestamp_utc: str
    run_id: str
    config_id: str
    window_s: float
    users: int
    # Beside N, what N really was: the least share of the window any user had a
    # request in flight, and the server's mean running + waiting requests.
    in_flight_pct: float | None
    server_in_flight_mean: float | None
    aggregate_output_tok_s: float
    server_output_tok_s: float | None
    mean_user_tok_s: float
    min_user_tok_s: float
    p05_user_tok_s: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    request_latency_p50_ms: float | None
    request_latency_p95_ms: float | None
    request_latency_p99_ms: float | None
    request_errors: int
    preemptions: int | None
    peak_kv_cache_pct: float | None
    # Prompt tokens found in the prefix cache over the window; None with caching off.
    prefix_cache_hit_pct: float | None
    gpu_util_avg_pct: float | None
    power_avg_w: float | None
    valid: bool

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BucketStats:
    """Per context bucket, so a fast short-context population cannot hide starvation."""

    total_tokens: int
    users: int
    requests: int
    output_tok_s: float
    min_user_tok_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    request_latency_p50_ms: float | None
    request_latency_p99_ms: float | None


@dataclass(frozen=True)
class QueueSummary:
    """What the 1 Hz ``/metrics`` samples say about the scheduler (seed 004 §10 cues)."""

    samples: int
    running_mean: float | None
    running_max: float | None
    waiting_mean: float | None
    waiting_max: float | None


@dataclass(frozen=True)
class WindowDetail:
    """Everything measured about one window beyond the row."""

    phase: str
    user_tok_s: list[float]
    user_bucket: list[int]
    buckets: list[BucketStats]
    client_tokens: int
    server_tokens: int | None
    audit_delta_pct: float | None
    requests_dispatched: int
    requests_completed: int
    invalid_reasons: list[str] = field(default_factory=list)
    measured_window_s: float | None = None
    warmup_s: float | None = None
    queue: QueueSummary | None = None
    offered_load: OfferedLoad | None = None
    # Every user in flight, yet the engine's scheduler held well under N: the requests
    # waited in its API frontend (runner.measure.gates.frontend_bound).
    frontend_bound: bool = False
    aggregate_ci: Interval | None = None
    min_user_ci: Interval | None = None
    # "off", or how the window met the prefix cache: "cold" (salted) or "warm".
    prefix_cache: str = "off"
    streams: StreamSummary | None = None
    client: ClientHealth | None = None
    engine_fault: EngineFault | None = None
    telemetry_throttled: bool | None = None
    # Each GPU's own figures, and how the row's power_avg_w was measured.
    gpus: list[GpuFigures] = field(default_factory=list)
    power_source: PowerSource | None = None
    errors: list[str] = field(default_factory=list)
    # Streamed token IDs against the server's own usage count, per request.
    usage_mismatches: int = 0
    requests_total: int = 0
    cancelled_at_drain: int = 0
    failed_metric_reads: int = 0
    boundary_read_ms: list[float] = field(default_factory=list)
    # A short screening window (search.screening_window_s): the search steers by it
    # and never counts it as a full window.
    screening: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowDetail:
        """A detail as ``windows_detail.jsonl`` holds it, nested values typed again."""
        return _DETAIL.validate_python(data)


@dataclass(frozen=True)
class WindowResult:
    row: WindowRow
    detail: WindowDetail


_DETAIL = TypeAdapter(WindowDetail)
