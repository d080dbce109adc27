"""What a run sees of windows already measured: an engine that died in one (seed 004 §9:
OOM stops the doubling), and which configuration a run_id may resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.config import build_config
from runner.errors import ConfigError
from runner.measure.benchmark import BenchmarkRow
from runner.measure.result import WindowDetail, WindowResult, WindowRow
from runner.output.benchmark import BENCHMARK_NAME, read_benchmark_rows
from runner.output.results import ResultsWriter
from runner.run.benchmark import measured_before
from runner.run.context import RunContext, check_resumable, holds_run
from runner.search.history import search_history
from tests.conftest import compose


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


def context_in(folder: Path, config_id: str) -> RunContext:
    config = build_config(compose())
    return RunContext(config, config_id=config_id, family="bf16", run_id="r", results_dir=folder)


def test_a_run_id_resumes_only_the_configuration_it_measured(tmp_path: Path) -> None:
    """Resuming with other engine flags would mix two setups' windows in one search."""
    ResultsWriter(tmp_path).append(window(7, []))  # run_id "r", config_id "c"
    check_resumable(context_in(tmp_path, "c"))
    check_resumable(context_in(tmp_path / "elsewhere", "other"))
    with pytest.raises(ConfigError, match="run_id=r already holds results of config_id c") as caught:
        check_resumable(context_in(tmp_path, "other"))
    assert "new run_id" in str(caught.value) and "\n" not in str(caught.value)


def test_a_finished_benchmark_is_found_by_its_run_id_and_read_back(tmp_path: Path) -> None:
    """A benchmark row written before a figure was added still reads, the figure as None."""
    names = BenchmarkRow.field_names()
    record = {name: None for name in names if name != "burst_source"}
    record.update(run_id="r", config_id="c", concurrency=4, workload="sharegpt")
    (tmp_path / BENCHMARK_NAME).write_text(json.dumps(record) + "\n")
    (row,) = read_benchmark_rows(tmp_path)
    assert row.burst_source is None and row.concurrency == 4
    assert measured_before(context_in(tmp_path, "c")) == row
    assert holds_run(tmp_path, "r") and not holds_run(tmp_path, "s")
    with pytest.raises(ConfigError, match="config_id c"):
        check_resumable(context_in(tmp_path, "other"))


def test_the_search_sees_the_latency_figures_slo_tiers_need() -> None:
    """A tier's TTFT, ITL, TPOT and request-latency ceilings are judged on the row's
    p99 figures and the streams' ITL/TPOT p99; a row without them meets no ceiling."""
    result = window(7, [])
    result.detail.extra.update({"itl_p99_ms": 40.0, "tpot_p99_ms": 30.0})
    (seen,) = search_history([result], relaunch=False)
    assert (seen.ttft_p99_ms, seen.itl_p99_ms, seen.tpot_p99_ms, seen.request_latency_p99_ms) == (
        1.0, 40.0, 30.0, 1.0,
    )
    (old,) = search_history([window(7, [])], relaunch=False)
    assert old.itl_p99_ms is None and old.aggregate_ci is None and old.min_user_ci is None
