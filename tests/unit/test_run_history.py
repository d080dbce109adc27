"""What the search sees of windows an engine died in (seed 004 §9: OOM stops the doubling)."""

from __future__ import annotations

from runner.records import WindowDetail, WindowResult, WindowRow
from runner.run import search_history


def window(users: int, reasons: list[str]) -> WindowResult:
    row = WindowRow(
        timestamp_utc="t", run_id="r", config_id="c", window_s=10.0, users=users,
        aggregate_output_tok_s=100.0, server_output_tok_s=100.0, mean_user_tok_s=100.0 / users,
        min_user_tok_s=20.0, p05_user_tok_s=20.0, ttft_p50_ms=1.0, ttft_p95_ms=1.0, ttft_p99_ms=1.0,
        request_latency_p50_ms=1.0, request_latency_p95_ms=1.0, request_latency_p99_ms=1.0,
        request_errors=0, preemptions=0, peak_kv_cache_pct=1.0, gpu_util_avg_pct=None,
        power_avg_w=None, valid=not reasons,
    )
    detail = WindowDetail(
        phase="coarse", user_tok_s=[20.0] * users, user_bucket=[1] * users, buckets=[],
        client_tokens=1000, server_tokens=1000, audit_delta_pct=0.0, requests_dispatched=1,
        requests_completed=1, invalid_reasons=reasons,
    )
    return WindowResult(row=row, detail=detail)


CRASH = "engine fault: the engine container exited with status 1"
OOM = "engine fault: the engine container exited with status 137 (killed for lack of memory)"


def test_stop_mode_counts_an_engine_death_as_a_failed_window() -> None:
    history = search_history([window(7, []), window(14, [CRASH])], relaunch=False)
    assert [(h.users, h.valid) for h in history] == [(7, True), (14, False)]


def test_relaunch_mode_redoes_the_window_the_engine_died_in() -> None:
    history = search_history([window(7, []), window(14, [CRASH])], relaunch=True)
    assert [h.users for h in history] == [7]


def test_an_oom_kill_is_kept_and_marked_so_the_search_stops_doubling() -> None:
    history = search_history([window(7, []), window(14, [OOM])], relaunch=True)
    assert [(h.users, h.oom) for h in history] == [(7, False), (14, True)]
