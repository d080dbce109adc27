"""Window statistics from plain values (seed 004 §7 counting rules, §8 row)."""

from __future__ import annotations

import dataclasses
from array import array

import numpy as np
import pytest

from runner.engines.base import EngineFault
from runner.measure.metrics import EngineMetrics
from runner.measure.records import MetricsSample, RequestRecord, TelemetrySummary, WindowMeasurement
from runner.measure.window import summarize_window

T0, T1 = 100.0, 110.0  # a 10 s window on the client's monotonic clock


def metrics(
    generated: float | None, preempted: float | None = 0.0, kv: float | None = None
) -> EngineMetrics:
    return EngineMetrics(
        generation_tokens_total=generated,
        prompt_tokens_total=None,
        requests_running=0.0,
        requests_waiting=0.0,
        kv_cache_usage=kv,
        preemptions_total=preempted,
    )


def record(
    user: int,
    dispatched: float,
    chunks: list[tuple[float, int]],
    *,
    finished: float | None = None,
    bucket: int = 1000,
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        user=user,
        bucket_total=bucket,
        prompt_id=f"p{user}-{dispatched}",
        dispatched_at=dispatched,
        first_token_at=chunks[0][0] if chunks else None,
        finished_at=finished if finished is not None else (chunks[-1][0] if chunks else dispatched),
        chunk_times=array("d", [t for t, _ in chunks]),
        chunk_tokens=array("I", [n for _, n in chunks]),
        error=error,
    )


def measure(
    records: list[RequestRecord],
    users: int,
    *,
    server_tokens: float | None,
    buckets: list[int] | None = None,
    samples: list[MetricsSample] | None = None,
    telemetry: TelemetrySummary | None = None,
    fault: EngineFault | None = None,
    preemptions: tuple[float | None, float | None] = (2.0, 5.0),
    min_in_flight_pct: float | None = None,
    cold_users: int = 0,
):
    start = metrics(1000.0, preemptions[0])
    end = metrics(1000.0 + server_tokens, preemptions[1]) if server_tokens is not None else None
    measurement = WindowMeasurement(
        timestamp_utc="2026-01-01T00:00:00+00:00",
        users=users,
        user_buckets=buckets or [1000] * users,
        window_s=10.0,
        t0=T0,
        t1=T1,
        records=records,
        start=start,
        end=end,
        samples=samples or [],
        telemetry=telemetry,
        engine_fault=fault,
        warmup_s=8.0,
        cold_users=cold_users,
    )
    return summarize_window(
        measurement, run_id="r", config_id="c", phase="coarse", audit_tolerance_pct=1.0,
        min_in_flight_pct=min_in_flight_pct,
    )


def test_only_tokens_arriving_inside_the_window_count() -> None:
    """seed 004 §7: warm-up tokens and post-boundary tokens never count."""
    records = [
        # started in warm-up: 5 tokens before t0, 10 inside
        record(0, 95.0, [(96.0, 5), (101.0, 4), (105.0, 6)]),
        # dispatched inside, runs past t1: 8 inside, 50 after the boundary
        record(0, 105.5, [(106.0, 3), (109.9, 5), (110.5, 50)], finished=112.0),
        # user 1: a chunk carrying several token IDs counts them all
        record(1, 100.5, [(101.0, 1), (102.0, 7)]),
    ]
    result = measure(records, 2, server_tokens=26)
    row, detail = result.row, result.detail
    assert detail.client_tokens == 10 + 8 + 8
    assert detail.user_tok_s == [pytest.approx(1.8), pytest.approx(0.8)]
    assert row.aggregate_output_tok_s == pytest.approx(2.6)
    assert row.mean_user_tok_s == pytest.approx(1.3)
    assert row.min_user_tok_s == pytest.approx(0.8)
    assert row.server_output_tok_s == pytest.approx(2.6)
    assert detail.audit_delta_pct == 0.0
    assert row.valid
    assert row.preemptions == 3


def test_chunks_exactly_on_the_boundaries_count() -> None:
    result = measure([record(0, 99.0, [(T0, 2), (T1, 3), (T1 + 1e-9, 100)])], 1, server_tokens=5)
    assert result.detail.client_tokens == 5


def test_latency_covers_requests_dispatched_in_the_window_only() -> None:
    """seed 004 §7: percentiles over requests dispatched in the window, followed to the end."""
    records = [
        record(0, 90.0, [(99.0, 1), (101.0, 1)]),  # warm-up request: no latency sample
        record(0, 101.0, [(101.5, 1), (102.0, 1)]),  # ttft 0.5, latency 1.0
        record(1, 102.0, [(104.0, 1), (109.0, 1)]),  # ttft 2.0, latency 7.0
        record(1, 109.0, [(109.5, 1), (115.0, 1)], finished=115.0),  # ttft 0.5, latency 6.0
    ]
    row = measure(records, 2, server_tokens=6).row
    ttft, latency = [0.5, 2.0, 0.5], [1.0, 7.0, 6.0]
    assert row.ttft_p50_ms == pytest.approx(np.percentile(ttft, 50) * 1000)
    assert row.ttft_p95_ms == pytest.approx(np.percentile(ttft, 95) * 1000)
    assert row.ttft_p99_ms == pytest.approx(np.percentile(ttft, 99) * 1000)
    assert row.request_latency_p50_ms == pytest.approx(6000.0)
    assert row.request_latency_p99_ms == pytest.approx(np.percentile(latency, 99) * 1000)


def test_error_before_first_token_is_counted_and_invalidates() -> None:
    """seed 004 §7: a request failing before its first token is an error, not omitted."""
    records = [
        record(0, 101.0, [(101.5, 4), (102.0, 4)]),
        record(1, 101.0, [], finished=131.0, error="HTTP 500: boom"),
    ]
    result = measure(records, 2, server_tokens=8)
    assert result.row.request_errors == 1
    assert not result.row.valid
    assert any("HTTP 500" in reason for reason in result.detail.invalid_reasons)
    # Its time to failure (30 s) is in the latency sample, not dropped.
    assert result.row.request_latency_p99_ms > 20_000
    assert result.row.ttft_p99_ms > 20_000
    assert result.detail.requests_dispatched == 2
    assert result.detail.requests_completed == 1


def test_audit_outside_tolerance_invalidates() -> None:
    """seed 004 §7: client and server differing by more than 1% invalidates the window."""
    records = [record(0, 99.0, [(101.0, 100)])]
    assert measure(records, 1, server_tokens=100.5).row.valid
    bad = measure(records, 1, server_tokens=102)
    assert not bad.row.valid
    assert bad.detail.audit_delta_pct == pytest.approx(2 / 102 * 100)
    assert any("differ" in reason for reason in bad.detail.invalid_reasons)


def test_engine_fault_invalidates_and_is_kept_typed() -> None:
    fault = EngineFault("the engine process exited with status -9", exit_code=-9, oom_killed=True)
    result = measure([record(0, 99.0, [(101.0, 10)])], 1, server_tokens=10, fault=fault)
    assert not result.row.valid
    assert any("status -9" in reason for reason in result.detail.invalid_reasons)
    assert result.detail.engine_fault == fault


def test_p05_and_min_over_users() -> None:
    tokens = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 5]
    records = [record(user, 99.0, [(105.0, n)]) for user, n in enumerate(tokens)]
    row = measure(records, len(tokens), server_tokens=sum(tokens)).row
    rates = [n / 10.0 for n in tokens]
    assert row.min_user_tok_s == pytest.approx(0.5)
    assert row.p05_user_tok_s == pytest.approx(np.percentile(rates, 5))
    assert row.min_user_tok_s < row.p05_user_tok_s < row.mean_user_tok_s


def test_a_user_without_tokens_is_a_zero_not_missing() -> None:
    result = measure([record(0, 99.0, [(105.0, 10)])], 2, server_tokens=10)
    assert result.detail.user_tok_s == [1.0, 0.0]
    assert result.row.min_user_tok_s == 0.0


def test_unmeasured_figures_are_none() -> None:
    """No end counter, no KV samples, no telemetry, no request in the window: None, not 0."""
    result = measure(
        [record(0, 90.0, [(101.0, 3)], finished=101.0)],
        1,
        server_tokens=None,
        preemptions=(None, None),
    )
    row = result.row
    assert row.server_output_tok_s is None
    assert result.detail.audit_delta_pct is None
    assert not row.valid  # no audit, no valid window
    assert row.preemptions is None
    assert row.peak_kv_cache_pct is None
    assert row.gpu_util_avg_pct is None and row.power_avg_w is None
    assert row.ttft_p50_ms is None and row.request_latency_p99_ms is None


def test_peak_kv_and_telemetry() -> None:
    samples = [
        MetricsSample(at=100.0 + i, metrics=metrics(0.0, kv=kv))
        for i, kv in enumerate([0.1, 0.42, 0.3])
    ]
    telemetry = TelemetrySummary(available=True, gpu_util_avg_pct=87.5, power_avg_w=410.0)
    row = measure(
        [record(0, 99.0, [(101.0, 1)])], 1, server_tokens=1, samples=samples, telemetry=telemetry
    ).row
    assert row.peak_kv_cache_pct == pytest.approx(42.0)
    assert row.gpu_util_avg_pct == 87.5
    assert row.power_avg_w == 410.0


def test_per_bucket_figures_keep_long_context_starvation_visible() -> None:
    """seed 004 §8: per-bucket throughput and latency beside the row."""
    records = [
        record(0, 101.0, [(101.2, 100)], bucket=1000),
        record(1, 101.0, [(108.0, 5)], bucket=30000),
    ]
    result = measure(records, 2, server_tokens=105, buckets=[1000, 30000])
    short, long = result.detail.buckets
    assert (short.total_tokens, long.total_tokens) == (1000, 30000)
    assert short.output_tok_s == pytest.approx(10.0)
    assert long.min_user_tok_s == pytest.approx(0.5)
    assert long.ttft_p99_ms == pytest.approx(7000.0)
    assert short.requests == long.requests == 1
    assert result.detail.user_bucket == [1000, 30000]


def test_the_audit_allows_for_the_time_the_boundary_reads_took() -> None:
    """seed 004 §7: the server read its counter somewhere during the closing GET, so
    tokens that arrived while that read was under way may be on either side."""
    records = [record(0, 101.0, [(102.0, 90), (109.8, 10)], finished=109.9)]
    # The server counted 90: the 10 that arrived 0.2 s before t1 came after its read.
    exact = measure(records, 1, server_tokens=90.0)
    assert exact.detail.audit_delta_pct == pytest.approx(10 / 90 * 100)
    late_read = WindowMeasurement(
        **{**exact_measurement(records, 90.0).__dict__, "end_read_s": 0.3}
    )
    result = summarize_window(
        late_read, run_id="r", config_id="c", phase="coarse", audit_tolerance_pct=1.0
    )
    assert result.detail.audit_delta_pct == 0.0
    assert result.detail.client_tokens == 100  # throughput still counts to t1
    # A read shorter than the gap cannot excuse it.
    quick = WindowMeasurement(**{**exact_measurement(records, 90.0).__dict__, "end_read_s": 0.1})
    assert summarize_window(
        quick, run_id="r", config_id="c", phase="coarse", audit_tolerance_pct=1.0
    ).detail.audit_delta_pct == pytest.approx(10 / 90 * 100)


def exact_measurement(records: list[RequestRecord], server_tokens: float) -> WindowMeasurement:
    return WindowMeasurement(
        timestamp_utc="2026-01-01T00:00:00+00:00",
        users=1,
        user_buckets=[1000],
        window_s=10.0,
        t0=T0,
        t1=T1,
        records=records,
        start=metrics(1000.0),
        end=metrics(1000.0 + server_tokens),
    )


def test_users_idle_between_requests_invalidate_the_window_with_the_reason() -> None:
    """A row that says N=2 must be 2 users keeping a request in flight. User 1 waited
    1.5 s between a completion and its next dispatch (a client held off the CPU): it was
    in flight 85% of the 10 s window, under slo.min_in_flight_pct=97."""
    records = [
        record(0, 99.0, [(101.0, 10), (109.0, 10)], finished=111.0),
        record(1, 99.0, [(101.0, 10)], finished=103.0),
        record(1, 104.5, [(106.0, 10)], finished=112.0),
    ]
    samples = [MetricsSample(at, running_waiting(1, 0)) for at in (101.0, 104.0, 107.0)]
    strict = measure(records, 2, server_tokens=40, samples=samples, min_in_flight_pct=97.0)
    assert strict.row.in_flight_pct == pytest.approx(85.0)
    assert strict.row.server_in_flight_mean == pytest.approx(1.0)
    assert strict.detail.offered_load.user_in_flight_pct == pytest.approx([100.0, 85.0])
    assert strict.detail.offered_load.dispatch_gap_max_ms == pytest.approx(1500.0)
    assert not strict.row.valid
    (reason,) = strict.detail.invalid_reasons
    assert "offered load below N=2" in reason and "lowest 85.0%" in reason
    assert "1.0 running+waiting" in reason
    lenient = measure(records, 2, server_tokens=40, samples=samples, min_in_flight_pct=80.0)
    assert lenient.row.valid and lenient.row.in_flight_pct == pytest.approx(85.0)


def test_a_request_still_streaming_at_the_boundary_is_in_flight_to_the_end() -> None:
    records = [record(0, 95.0, [(101.0, 5), (112.0, 5)], finished=113.0)]
    result = measure(records, 1, server_tokens=5, min_in_flight_pct=97.0)
    assert result.row.in_flight_pct == pytest.approx(100.0) and result.row.valid


def running_waiting(running: float, waiting: float) -> EngineMetrics:
    return dataclasses.replace(metrics(1000.0), requests_running=running, requests_waiting=waiting)


def test_the_prefix_cache_hit_rate_is_the_windows_counter_delta() -> None:
    """With caching on, the share of prompt tokens found in the cache during the window."""
    start = dataclasses.replace(metrics(1000.0), prefix_cache_queries_total=500.0,
                                prefix_cache_hits_total=100.0)  # fmt: skip
    end = dataclasses.replace(metrics(1010.0), prefix_cache_queries_total=1500.0,
                              prefix_cache_hits_total=700.0)  # fmt: skip
    measurement = WindowMeasurement(
        timestamp_utc="t", users=1, user_buckets=[1000], window_s=10.0, t0=T0, t1=T1,
        records=[record(0, 99.0, [(101.0, 10)])], start=start, end=end,
    )  # fmt: skip
    warm = summarize_window(measurement, run_id="r", config_id="c", phase="coarse",
                            audit_tolerance_pct=1.0, prefix_cache="warm")  # fmt: skip
    assert warm.row.prefix_cache_hit_pct == pytest.approx(60.0)
    assert warm.detail.prefix_cache == "warm"
    off = summarize_window(measurement, run_id="r", config_id="c", phase="coarse",
                           audit_tolerance_pct=1.0)  # fmt: skip
    assert off.row.prefix_cache_hit_pct is None and off.detail.prefix_cache == "off"


def test_a_window_whose_engine_held_less_than_its_users_is_frontend_bound() -> None:
    """Issue 11 (H200, 8B): the client kept every user in flight while vLLM's scheduler
    held 62-82% of N: the rest waited in its API frontend. Valid, and it says so."""
    records = [record(user, 99.0, [(101.0, 10)], finished=111.0) for user in range(4)]
    held = [MetricsSample(at, running_waiting(2, 0)) for at in (101.0, 105.0, 109.0)]
    bound = measure(records, 4, server_tokens=40, samples=held, min_in_flight_pct=97.0)
    assert bound.row.valid and bound.detail.frontend_bound
    assert bound.row.server_in_flight_mean == pytest.approx(2.0)
    full = [MetricsSample(at, running_waiting(3, 1)) for at in (101.0, 105.0, 109.0)]
    assert not measure(records, 4, server_tokens=40, samples=full,
                       min_in_flight_pct=97.0).detail.frontend_bound  # fmt: skip


def test_a_long_steady_window_carries_95_percent_intervals_a_short_one_does_not() -> None:
    """The search decides on intervals when windows carry them: batch means over the
    1 Hz counter for the aggregate, over each user's seconds for the slowest user."""
    t1 = T0 + 60.0
    records, samples = [], []
    for user in range(2):
        # 30 requests of 2 s each, 40 tokens per second, with a little jitter.
        for k in range(30):
            start = T0 + 2.0 * k
            chunks = [(start + 0.5 + 0.05 * i, 2 + (i + user + k) % 2) for i in range(30)]
            records.append(record(user, start, chunks, finished=start + 2.0))
    total = 0.0
    for second in range(61):
        total += sum(n for r in records for t, n in zip(r.chunk_times, r.chunk_tokens)
                     if T0 + second - 1 < t <= T0 + second)  # fmt: skip
        samples.append(MetricsSample(T0 + second, metrics(1000.0 + total)))
    tokens = sum(r.tokens_between(T0, t1) for r in records)
    measurement = WindowMeasurement(
        timestamp_utc="t", users=2, user_buckets=[1000, 1000], window_s=60.0, t0=T0, t1=t1,
        records=records, start=metrics(1000.0), end=metrics(1000.0 + tokens), samples=samples,
    )  # fmt: skip
    result = summarize_window(measurement, run_id="r", config_id="c", phase="confirm",
                              audit_tolerance_pct=1.0)  # fmt: skip
    ci = result.detail.aggregate_ci
    assert ci is not None and ci.low < result.row.aggregate_output_tok_s < ci.high
    slow = result.detail.min_user_ci
    assert slow is not None and slow.low <= result.row.min_user_tok_s <= slow.high
    short = measure([record(0, 99.0, [(101.0, 10)])], 1, server_tokens=10)
    assert short.detail.aggregate_ci is None and short.detail.min_user_ci is None


def test_a_window_that_began_before_every_user_finished_a_request_measured_the_ramp() -> None:
    """All users start together; on the H200 with seed 004's 30k prompts their first
    prefills queued for tens of seconds and an 8 s warm-up left a window measuring that
    ramp (slowest user 0.0 tok/s at 56 users). Such a window is invalid, with the reason."""
    result = measure([record(0, 99.0, [(101.0, 10)])], 1, server_tokens=10, cold_users=1)
    assert not result.row.valid
    assert "not at steady state: 1 of 1 users" in result.detail.invalid_reasons[0]
    assert "8 s warm-up" in result.detail.invalid_reasons[0]
