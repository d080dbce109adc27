"""One place that builds window rows and details for tests, from a few figures."""

from __future__ import annotations

import dataclasses
from typing import Any

from runner.measure.result import BucketStats, WindowDetail, WindowResult, WindowRow
from runner.measure.streams import StreamSummary


def make_row(users: int = 28, **changes: Any) -> WindowRow:
    """A valid seed 004 §8 row; ``changes`` replace any field."""
    row = WindowRow(
        timestamp_utc="2026-07-10T12:00:00Z",
        run_id="run-a",
        config_id="cfg-a",
        window_s=300.0,
        users=users,
        in_flight_pct=99.9,
        server_in_flight_mean=float(users),
        aggregate_output_tok_s=512.25,
        server_output_tok_s=514.0,
        mean_user_tok_s=18.29,
        min_user_tok_s=16.5,
        p05_user_tok_s=16.9,
        ttft_p50_ms=120.0,
        ttft_p95_ms=900.0,
        ttft_p99_ms=1234.56,
        request_latency_p50_ms=20000.0,
        request_latency_p95_ms=28000.0,
        request_latency_p99_ms=31000.04,
        request_errors=0,
        preemptions=None,
        peak_kv_cache_pct=71.5,
        prefix_cache_hit_pct=None,
        gpu_util_avg_pct=None,
        power_avg_w=None,
        valid=True,
    )
    return dataclasses.replace(row, **changes)


def make_detail(users: int = 2, **changes: Any) -> WindowDetail:
    """A detail with one bucket and an agreeing audit; ``changes`` replace any field."""
    detail = WindowDetail(
        phase="confirm",
        user_tok_s=[16.5] * users,
        user_bucket=[1000] * users,
        buckets=[BucketStats(1000, users, 10, 70.0, 16.5, 100.0, 300.0, 20000.0, 30000.0)],
        client_tokens=153675,
        server_tokens=154200,
        audit_delta_pct=0.34,
        requests_dispatched=300,
        requests_completed=300,
        invalid_reasons=[],
    )
    return dataclasses.replace(detail, **changes)


def make_result(users: int = 28, *, detail: dict[str, Any] | None = None, **row: Any) -> WindowResult:
    """A window: :func:`make_row` with ``row`` changes, :func:`make_detail` with ``detail``'s."""
    return WindowResult(make_row(users, **row), make_detail(users, **(detail or {})))


def make_streams(bursty: bool, source: str | None = None) -> StreamSummary:
    """Stream figures of a window whose tokens did (or did not) arrive in lumps."""
    return StreamSummary(
        tpot_p50_ms=20.0, tpot_p99_ms=30.0, itl_p50_ms=20.0, itl_p99_ms=40.0, bursty=bursty,
        burst_share=0.5 if bursty else 0.0, bursty_requests=5 if bursty else 0,
        judged_requests=10, burst_source=source, tokens_per_chunk_mean=1.0,
        tokens_per_event_mean=1.0, events_per_read_mean=1.0, largest_chunk_share_p50=0.1,
        decode_tok_s_aggregate=100.0,
    )  # fmt: skip
