"""Statistics of one measurement window (seed 004 sections 7 and 8), from plain values.

The load generator and sampler collect a :class:`WindowMeasurement`; this module
turns it into the :class:`~runner.records.WindowResult` row and detail. Rules:

* throughput counts only token IDs whose chunk *arrived* inside ``[t0, t1]``: a
  request that started in warm-up contributes its in-window tokens, one that runs
  past the boundary contributes nothing after it;
* latency percentiles cover the requests *dispatched* inside the window, followed to
  completion after the boundary;
* a failed request is counted, never dropped: its time to failure enters both
  latency samples (the window is invalid anyway);
* figures that could not be measured are ``None``, never zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runner.measure.gates import (
    frontend_bound,
    judge,
    offered_load,
    offered_load_reasons,
    overlap,
    pauses,
)
from runner.measure.records import MetricsSample, RequestRecord, WindowMeasurement
from runner.measure.result import BucketStats, QueueSummary, WindowDetail, WindowResult, WindowRow
from runner.measure.streams import summarize_streams
from runner.measure.uncertainty import Interval, aggregate_interval, slowest_user_interval


def percentile_ms(seconds: Sequence[float], q: float) -> float | None:
    if not seconds:
        return None
    return float(np.percentile(np.asarray(seconds, dtype=float), q) * 1000.0)


def _counter_delta(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return end - start


def _latencies(records: Sequence[RequestRecord]) -> tuple[list[float], list[float]]:
    """TTFT and end-to-end seconds; a failed request enters both at its time to failure."""
    ttft, latency = [], []
    for record in records:
        if record.finished_at is None:
            continue
        end = record.finished_at - record.dispatched_at
        first = record.first_token_at
        ttft.append(first - record.dispatched_at if first is not None else end)
        latency.append(end)
    return ttft, latency


def _bucket_stats(
    bucket_total: int,
    user_tok_s: list[float],
    user_buckets: list[int],
    dispatched: list[RequestRecord],
    span_s: float,
    tokens_per_user: list[int],
) -> BucketStats:
    members = [i for i, total in enumerate(user_buckets) if total == bucket_total]
    own = [record for record in dispatched if record.bucket_total == bucket_total]
    ttft, latency = _latencies(own)
    return BucketStats(
        total_tokens=bucket_total,
        users=len(members),
        requests=len(own),
        output_tok_s=sum(tokens_per_user[i] for i in members) / span_s,
        min_user_tok_s=min((user_tok_s[i] for i in members), default=None),
        ttft_p50_ms=percentile_ms(ttft, 50),
        ttft_p99_ms=percentile_ms(ttft, 99),
        request_latency_p50_ms=percentile_ms(latency, 50),
        request_latency_p99_ms=percentile_ms(latency, 99),
    )


def _audit(client_tokens: range, server_tokens: int | None) -> float | None:
    """How far the server's count lies outside what the client could have counted."""
    if server_tokens is None or server_tokens <= 0:
        return None
    if server_tokens in client_tokens:
        return 0.0
    nearest = client_tokens.start if server_tokens < client_tokens.start else client_tokens[-1]
    return abs(nearest - server_tokens) / server_tokens * 100.0


def _client_token_bounds(m: WindowMeasurement) -> range:
    """Client tokens over the shortest and longest window the two boundary reads allow.

    A boundary read is stamped when its answer arrives, but the server read its
    counter somewhere during the GET: the window began in ``[t0 - start_read_s, t0]``
    and ended in ``[t1 - end_read_s, t1]``. On a short window a slow read is a
    visible share of it, so the audit asks only whether the counts can agree.
    """
    shortest = longest = 0
    for record in m.records:
        shortest += record.tokens_between(m.t0, m.t1 - m.end_read_s)
        longest += record.tokens_between(m.t0 - m.start_read_s, m.t1)
    return range(shortest, max(shortest, longest) + 1)


def summarize_window(
    measurement: WindowMeasurement,
    *,
    run_id: str,
    config_id: str,
    phase: str,
    audit_tolerance_pct: float,
    screening: bool = False,
    max_loop_lag_ms: float | None = None,
    min_in_flight_pct: float | None = None,
    prefix_cache: str = "off",
) -> WindowResult:
    """The seed 004 section 8 row and its detail for one measured window.

    ``max_loop_lag_ms`` is the client's loop-lag limit (:func:`runner.measure.gates.judge`)
    and ``min_in_flight_pct`` the offered-load floor
    (:func:`runner.measure.gates.offered_load_reasons`); None leaves that rule unapplied.
    """
    m = measurement
    span_s = m.t1 - m.t0
    if span_s <= 0:
        raise ValueError(f"window end {m.t1} is not after its start {m.t0}")

    tokens_per_user = [0] * m.users
    for record in m.records:
        if record.dispatched_at <= m.t1 and (
            record.finished_at is None or record.finished_at >= m.t0
        ):
            tokens_per_user[record.user] += record.tokens_between(m.t0, m.t1)
    # A chat user's rate is over the seconds it was not in think time: what it sees
    # while it waits for answers, as a user without think time sees over the window.
    user_pauses = pauses(m.records, m.users)
    user_active_s = [span_s - overlap(own, m.t0, m.t1) for own in user_pauses]
    user_tok_s = [
        tokens / active if active > 0 else 0.0
        for tokens, active in zip(tokens_per_user, user_active_s)
    ]
    client_tokens = sum(tokens_per_user)
    aggregate = client_tokens / span_s

    dispatched = [r for r in m.records if m.t0 <= r.dispatched_at <= m.t1]
    # A failure is counted whenever the request overlapped the window: a warm-up
    # request that dies inside the window lost tokens the window should have had.
    overlapping = [
        r
        for r in m.records
        if r.dispatched_at <= m.t1 and (r.finished_at is None or r.finished_at >= m.t0)
    ]
    failed = [r for r in overlapping if r.error is not None]
    ttft, latency = _latencies(dispatched)

    server_delta = _counter_delta(
        m.start.generation_tokens_total, m.end.generation_tokens_total if m.end else None
    )
    server_tokens = round(server_delta) if server_delta is not None else None
    preemption_delta = _counter_delta(
        m.start.preemptions_total, m.end.preemptions_total if m.end else None
    )
    audit_pct = _audit(_client_token_bounds(m), server_tokens)
    queried = _counter_delta(
        m.start.prefix_cache_queries_total, m.end.prefix_cache_queries_total if m.end else None
    )
    hits = _counter_delta(
        m.start.prefix_cache_hits_total, m.end.prefix_cache_hits_total if m.end else None
    )
    hit_pct = 100.0 * hits / queried if prefix_cache != "off" and queried and hits is not None else None
    kv_reads = [s.metrics.kv_cache_usage for s in m.samples if s.metrics.kv_cache_usage is not None]

    invalid: list[str] = []
    if failed:
        invalid.append(f"{len(failed)} request error(s), first: {failed[0].error}")
    if audit_pct is None:
        invalid.append("server generation counter unavailable or unchanged: no audit possible")
    elif audit_pct > audit_tolerance_pct:
        invalid.append(
            f"client tokens {client_tokens} and server tokens {server_tokens} differ by "
            f"{audit_pct:.3f}% beyond what the boundary reads allow (> {audit_tolerance_pct}%)"
        )
    if m.engine_fault is not None:
        invalid.append(f"engine fault: {m.engine_fault.reason}")
    client = m.client
    request_s = float(np.median(latency)) if latency else span_s
    if client is not None and max_loop_lag_ms is not None:
        client = judge(
            client, max_loop_lag_ms, request_s=request_s, min_in_flight_pct=min_in_flight_pct
        )
        invalid.extend(client.reasons)
    if m.cold_users:
        invalid.append(
            f"not at steady state: {m.cold_users} of {m.users} users had not finished a "
            f"request after a {m.warmup_s:.0f} s warm-up, so the window measured the "
            "ramp of the first requests; raise search.drain_timeout_s or lower the users"
        )
    load = offered_load(m.records, m.users, m.t0, m.t1, m.samples)
    if min_in_flight_pct is not None:
        invalid.extend(offered_load_reasons(load, m.users, min_in_flight_pct))

    telemetry = m.telemetry
    row = WindowRow(
        timestamp_utc=m.timestamp_utc,
        run_id=run_id,
        config_id=config_id,
        window_s=m.window_s,
        users=m.users,
        in_flight_pct=load.min_in_flight_pct,
        server_in_flight_mean=load.server_in_flight_mean,
        aggregate_output_tok_s=aggregate,
        server_output_tok_s=server_tokens / span_s if server_tokens is not None else None,
        mean_user_tok_s=float(np.mean(user_tok_s)) if any(user_pauses) else aggregate / m.users,
        min_user_tok_s=min(user_tok_s),
        p05_user_tok_s=float(np.percentile(user_tok_s, 5)),
        ttft_p50_ms=percentile_ms(ttft, 50),
        ttft_p95_ms=percentile_ms(ttft, 95),
        ttft_p99_ms=percentile_ms(ttft, 99),
        request_latency_p50_ms=percentile_ms(latency, 50),
        request_latency_p95_ms=percentile_ms(latency, 95),
        request_latency_p99_ms=percentile_ms(latency, 99),
        request_errors=len(failed),
        preemptions=round(preemption_delta) if preemption_delta is not None else None,
        peak_kv_cache_pct=max(kv_reads) * 100.0 if kv_reads else None,
        prefix_cache_hit_pct=hit_pct,
        gpu_util_avg_pct=telemetry.gpu_util_avg_pct if telemetry else None,
        power_avg_w=telemetry.power_avg_w if telemetry else None,
        valid=not invalid,
    )
    bucket_totals = list(dict.fromkeys(m.user_buckets))  # workload order
    detail = WindowDetail(
        phase=phase,
        screening=screening,
        user_tok_s=user_tok_s,
        user_bucket=list(m.user_buckets),
        buckets=[
            _bucket_stats(total, user_tok_s, m.user_buckets, dispatched, span_s, tokens_per_user)
            for total in bucket_totals
        ],
        client_tokens=client_tokens,
        server_tokens=server_tokens,
        audit_delta_pct=audit_pct,
        requests_dispatched=len(dispatched),
        requests_completed=sum(
            1 for r in dispatched if r.error is None and r.finished_at is not None
        ),
        invalid_reasons=invalid,
        measured_window_s=span_s,
        warmup_s=m.warmup_s,
        queue=_queue_summary(m.samples),
        offered_load=load,
        # 95% intervals of the two figures the search decides on (runner.measure.uncertainty).
        aggregate_ci=aggregate_interval(aggregate, *_counter_steps(m), request_s=request_s),
        min_user_ci=_slowest_user_ci(m, span_s, user_pauses, request_s),
        frontend_bound=min_in_flight_pct is not None
        and frontend_bound(load, m.users, min_in_flight_pct),
        prefix_cache=prefix_cache,
        # TPOT/ITL never without the burst flag, and the aggregate beside them (seed 000).
        streams=summarize_streams(
            [r for r in dispatched if r.error is None and r.finished_at is not None],
            decode_tok_s_aggregate=aggregate,
        ),
        client=client,
        engine_fault=m.engine_fault,
        telemetry_throttled=telemetry.throttled if telemetry else None,
        gpus=list(telemetry.gpus) if telemetry else [],
        power_source=telemetry.power_source if telemetry else None,
        errors=[r.error for r in failed[:20] if r.error is not None],
        usage_mismatches=sum(
            1
            for r in m.records
            if r.usage_completion_tokens is not None and r.usage_completion_tokens != r.tokens
        ),
        requests_total=len(m.records),
        cancelled_at_drain=m.cancelled_at_drain,
        failed_metric_reads=m.failed_metric_reads,
        boundary_read_ms=[round(m.start_read_s * 1000, 3)]
        + ([round(m.end_read_s * 1000, 3)] if m.end is not None else []),
    )
    return WindowResult(row=row, detail=detail)


def _counter_steps(m: WindowMeasurement) -> tuple[list[float], list[float]]:
    """The server counter's growth between consecutive 1 Hz reads inside the window,
    and the seconds each step spans."""
    reads = [
        (s.at, s.metrics.generation_tokens_total)
        for s in m.samples
        if m.t0 <= s.at <= m.t1 and s.metrics.generation_tokens_total is not None
    ]
    steps = [(b[1] - a[1], b[0] - a[0]) for a, b in zip(reads, reads[1:]) if b[0] > a[0]]
    return [delta for delta, _ in steps], [seconds for _, seconds in steps]


def _bin_seconds(span_s: float) -> list[float]:
    """One-second bins over the window, the last one what is left of it."""
    whole = int(span_s)
    rest = span_s - whole
    return [1.0] * whole + ([rest] if rest > 1e-6 else [])


def _user_seconds(m: WindowMeasurement, span_s: float) -> list[list[float]]:
    """Tokens each user received in each one-second bin of the window."""
    bins = len(_bin_seconds(span_s))
    counts = [[0.0] * bins for _ in range(m.users)]
    for record in m.records:
        for arrived, tokens in zip(record.chunk_times, record.chunk_tokens):
            if m.t0 <= arrived <= m.t1:
                counts[record.user][min(bins - 1, int(arrived - m.t0))] += tokens
    return counts


def _slowest_user_ci(
    m: WindowMeasurement,
    span_s: float,
    user_pauses: list[list[tuple[float, float]]],
    request_s: float,
) -> Interval | None:
    """The slowest user's 95% interval. With think time, each user's seconds are counted
    on its own clock that stops while it pauses, cut into one-second bins of that clock."""
    if not any(user_pauses):
        return slowest_user_interval(
            _user_seconds(m, span_s), _bin_seconds(span_s), request_s=request_s
        )
    deltas: list[list[float]] = []
    seconds: list[list[float]] = []
    for user, own in enumerate(user_pauses):
        starts = np.array([max(a, m.t0) for a, b in own if b > m.t0 and a < m.t1])
        ends = np.array([min(b, m.t1) for a, b in own if b > m.t0 and a < m.t1])
        bins = _bin_seconds(span_s - float(np.sum(ends - starts)))
        if not bins:
            return None  # a user that paused through the whole window: nothing to weigh
        counts = np.zeros(len(bins))
        for record in m.records:
            if record.user != user:
                continue
            times = np.asarray(record.chunk_times, dtype=float)
            tokens = np.asarray(record.chunk_tokens, dtype=float)
            inside = (times >= m.t0) & (times <= m.t1)
            if not inside.any():
                continue
            times = times[inside]
            # Seconds of the window before each arrival that the user was not pausing.
            paused = np.clip(times[:, None] - starts[None, :], 0.0, ends - starts).sum(axis=1)
            where = np.minimum(len(bins) - 1, (times - m.t0 - paused).astype(int))
            np.add.at(counts, where, tokens[inside])
        deltas.append(counts.tolist())
        seconds.append(bins)
    return slowest_user_interval(deltas, request_s=request_s, user_seconds=seconds)


def _queue_summary(samples: Sequence[MetricsSample]) -> QueueSummary:
    """What the 1 Hz samples say about the scheduler (seed 004 section 10 cues)."""
    running = [
        s.metrics.requests_running for s in samples if s.metrics.requests_running is not None
    ]
    waiting = [
        s.metrics.requests_waiting for s in samples if s.metrics.requests_waiting is not None
    ]
    return QueueSummary(
        samples=len(samples),
        running_mean=float(np.mean(running)) if running else None,
        running_max=max(running) if running else None,
        waiting_mean=float(np.mean(waiting)) if waiting else None,
        waiting_max=max(waiting) if waiting else None,
    )
