"""What a run sees of windows already measured: an engine that died in one (seed 004 §9:
OOM stops the doubling), and which configuration a run_id may resume.

The faults come from the backends' own classification (:func:`process_fault`,
:func:`container_fault`) and pass through the window statistics, as in a run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from runner.config import build_config
from runner.engines.base import EngineFault, container_fault, process_fault
from runner.errors import ConfigError
from runner.measure.benchmark import BenchmarkRow
from runner.measure.result import WindowResult
from runner.output.benchmark import BENCHMARK_NAME, read_benchmark_rows
from runner.output.results import ResultsWriter, read_results
from runner.run.benchmark import measured_before
from runner.run.context import RunContext, measurement_settings
from runner.run.lock import RunLock
from runner.run.resume import check_resumable, holds_run
from runner.search.history import search_history
from tests.conftest import compose
from tests.unit.test_window import measure, record


def window(users: int, fault: EngineFault | None = None) -> WindowResult:
    """A window as summarize_window makes it, the engine dying in it or not."""
    records = [record(user, 100.0, [(105.0, 50)], finished=106.0) for user in range(users)]
    result = measure(records, users, server_tokens=50 * users, fault=fault)
    return result


CRASH = process_fault(1)
OOM_PROCESS = process_fault(-9)
OOM_CONTAINER = container_fault({"Status": "exited", "ExitCode": 137, "OOMKilled": True}, 0)


def test_the_backends_classify_a_kernel_kill_as_out_of_memory() -> None:
    assert OOM_PROCESS.oom_killed and OOM_PROCESS.exit_code == -9
    assert OOM_CONTAINER is not None and OOM_CONTAINER.oom_killed
    assert not CRASH.oom_killed
    assert container_fault({"Status": "running"}, 0) is None
    restarted = container_fault({"Status": "running"}, 2)
    assert restarted is not None and not restarted.oom_killed


def test_stop_mode_counts_an_engine_death_as_a_failed_window() -> None:
    history = search_history([window(7), window(14, CRASH)], relaunch=False)
    assert [(h.users, h.valid, h.oom) for h in history] == [(7, True, False), (14, False, False)]


def test_relaunch_mode_redoes_the_window_the_engine_died_in() -> None:
    history = search_history([window(7), window(14, CRASH)], relaunch=True)
    assert [h.users for h in history] == [7]


@pytest.mark.parametrize("oom", [OOM_PROCESS, OOM_CONTAINER], ids=["process", "container"])
def test_an_oom_kill_is_kept_and_marked_so_the_search_stops_doubling(oom: EngineFault) -> None:
    history = search_history([window(7), window(14, oom)], relaunch=True)
    assert [(h.users, h.oom) for h in history] == [(7, False), (14, True)]


def test_the_fault_survives_the_results_file(tmp_path: Path) -> None:
    """A resumed run reads the typed fault back, so it decides as the live run did."""
    ResultsWriter(tmp_path).append(window(14, OOM_PROCESS))
    (read,) = read_results(tmp_path)
    assert read.detail.engine_fault == OOM_PROCESS
    assert search_history([read], relaunch=True)[0].oom


def test_a_screening_window_stays_one_in_the_results_file(tmp_path: Path) -> None:
    """A resumed run must not take a short screening window for a full one; rows
    written before windows recorded it read as full, their phase telling the rest."""
    screened = window(7)
    screened = dataclasses.replace(
        screened, detail=dataclasses.replace(screened.detail, screening=True)
    )
    ResultsWriter(tmp_path).append(screened)
    ResultsWriter(tmp_path).append(window(14))
    seen = search_history(read_results(tmp_path), relaunch=False)
    assert [obs.screening for obs in seen] == [True, False]
    line = json.loads((tmp_path / "windows_detail.jsonl").read_text().splitlines()[0])
    assert line["detail"]["screening"] is True


def context_in(folder: Path, config_id: str) -> RunContext:
    config = build_config(compose())
    return RunContext(config, config_id=config_id, family="bf16", run_id="r", results_dir=folder)


def test_a_run_id_resumes_only_the_configuration_it_measured(tmp_path: Path) -> None:
    """Resuming with other engine flags would mix two setups' windows in one search."""
    ResultsWriter(tmp_path).append(window(7))  # run_id "r", config_id "c"
    check_resumable(tmp_path, "r", "c", {})
    check_resumable(tmp_path / "elsewhere", "r", "other", {})
    with pytest.raises(ConfigError, match="run_id=r already holds results of config_id c") as caught:
        check_resumable(tmp_path, "r", "other", {})
    assert "new run_id" in str(caught.value) and "\n" not in str(caught.value)


def test_a_finished_benchmark_is_found_by_its_run_id_and_read_back(tmp_path: Path) -> None:
    """A benchmark row written before a figure was added still reads, the figure as None."""
    names = BenchmarkRow.field_names()
    record_ = {name: None for name in names if name != "burst_source"}
    record_.update(run_id="r", config_id="c", concurrency=4, workload="sharegpt")
    (tmp_path / BENCHMARK_NAME).write_text(json.dumps(record_) + "\n")
    (row,) = read_benchmark_rows(tmp_path)
    assert row.burst_source is None and row.concurrency == 4
    assert measured_before(context_in(tmp_path, "c")) == row
    assert holds_run(tmp_path, "r") and not holds_run(tmp_path, "s")
    with pytest.raises(ConfigError, match="config_id c"):
        check_resumable(tmp_path, "r", "other", {})


def test_a_run_id_resumes_only_the_workload_search_and_slo_it_measured(tmp_path: Path) -> None:
    """Same engine, other windows or floor: the rows would measure two different things."""
    config = build_config(compose())
    context = RunContext(config, config_id="c", family="bf16", run_id="r", results_dir=tmp_path)
    context.manifest["measurement"] = measurement_settings(config)
    context.write_manifest()
    ResultsWriter(tmp_path).append(window(7))
    check_resumable(tmp_path, "r", "c", measurement_settings(config))
    other = build_config(compose(["search.window_s=7", "slo.min_user_tok_s=20"]))
    with pytest.raises(ConfigError, match="another search, slo than this command gives"):
        check_resumable(tmp_path, "r", "c", measurement_settings(other))
    assert not list(tmp_path.glob("*.tmp"))


def test_a_second_runner_on_the_same_run_id_or_folder_is_refused(tmp_path: Path) -> None:
    with RunLock(tmp_path / "a", "r", tmp_path / "cache"):
        with pytest.raises(ConfigError, match=rf"pid {os.getpid()}\) is using run_id=r"):
            RunLock(tmp_path / "b", "r", tmp_path / "cache").__enter__()
        with pytest.raises(ConfigError, match="is using the results folder"):
            RunLock(tmp_path / "a", "s", tmp_path / "cache").__enter__()
    with RunLock(tmp_path / "b", "r", tmp_path / "cache"):  # released with the first
        assert (tmp_path / "b" / ".runner.lock").read_text() == str(os.getpid())


def test_the_search_sees_the_latency_figures_slo_tiers_need() -> None:
    """A tier's TTFT, ITL, TPOT and request-latency ceilings are judged on the row's
    p99 figures and the streams' ITL/TPOT p99; a window without streams meets no
    ITL or TPOT ceiling."""
    result = window(7)
    (seen,) = search_history([result], relaunch=False)
    assert result.detail.streams is not None
    assert (seen.ttft_p99_ms, seen.request_latency_p99_ms) == (
        result.row.ttft_p99_ms, result.row.request_latency_p99_ms,
    )  # fmt: skip
    assert seen.itl_p99_ms == result.detail.streams.itl_p99_ms
    assert seen.tpot_p99_ms == result.detail.streams.tpot_p99_ms
    bare = dataclasses.replace(result, detail=dataclasses.replace(result.detail, streams=None))
    (old,) = search_history([bare], relaunch=False)
    assert old.itl_p99_ms is None and old.aggregate_ci is None and old.min_user_ci is None
