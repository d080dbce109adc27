"""The results folder and the console line (seed 004 section 8)."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from runner.errors import ResultsError
from runner.measure.result import WindowResult, WindowRow
from runner.output.console import console_line, print_window
from runner.output.results import ResultsWriter, read_jsonl, read_results
from tests.builders import make_detail, make_row, make_streams

SEED_FIELDS = [
    "timestamp_utc", "run_id", "config_id", "window_s", "users",
    "aggregate_output_tok_s", "server_output_tok_s", "mean_user_tok_s",
    "min_user_tok_s", "p05_user_tok_s", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms",
    "request_latency_p50_ms", "request_latency_p95_ms", "request_latency_p99_ms",
    "request_errors", "preemptions", "peak_kv_cache_pct", "gpu_util_avg_pct",
    "power_avg_w", "valid",
]  # fmt: skip


# Beside N, runner's own: how much of N the engine really got.
ROW_FIELDS = [
    *SEED_FIELDS[:5], "in_flight_pct", "server_in_flight_mean",
    *SEED_FIELDS[5:19], "prefix_cache_hit_pct", *SEED_FIELDS[19:],
]  # fmt: skip


def test_row_fields_are_the_seed_fields_in_order_with_the_offered_load_beside_n(
    tmp_path: Path,
) -> None:
    """seed 004 §8: the JSONL row holds the listed fields in that order; the two fields
    added beside ``users`` say whether N users really kept a request in flight."""
    ResultsWriter(tmp_path).append(WindowResult(make_row(), make_detail()))
    line = (tmp_path / "results.jsonl").read_text().splitlines()[0]
    assert list(json.loads(line)) == ROW_FIELDS
    assert [name for name in json.loads(line) if name in SEED_FIELDS] == SEED_FIELDS
    with (tmp_path / "results.csv").open(newline="") as handle:
        header, values = list(csv.reader(handle))
    assert header == ROW_FIELDS
    assert values[ROW_FIELDS.index("preemptions")] == ""
    assert values[ROW_FIELDS.index("valid")] == "true"


def read_rows(folder: Path) -> list[WindowRow]:
    """The rows a user reads in results.jsonl."""
    return [WindowRow(**record) for record in read_jsonl(folder / "results.jsonl")]


def test_appends_never_truncate_and_header_is_written_once(tmp_path: Path) -> None:
    """A resumed run opens a new writer on the same folder and adds after what is there."""
    ResultsWriter(tmp_path).append(WindowResult(make_row(7), make_detail()))
    ResultsWriter(tmp_path).append(WindowResult(make_row(14), make_detail()))
    assert [row.users for row in read_rows(tmp_path)] == [7, 14]
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 3 and csv_lines[0].startswith("timestamp_utc,")
    details = read_results(tmp_path)
    assert [result.row.users for result in details] == [7, 14]
    assert details[0].detail == make_detail()


def test_rows_round_trip_with_unavailable_figures(tmp_path: Path) -> None:
    row = make_row(ttft_p99_ms=None, server_output_tok_s=None, valid=False)
    ResultsWriter(tmp_path).append(WindowResult(row, make_detail(invalid_reasons=["no first token"])))
    assert read_rows(tmp_path) == [row]


def test_a_second_process_reads_each_window_right_after_append(tmp_path: Path) -> None:
    """Each append is flushed and synced: another process sees it while the writer lives."""
    writer = ResultsWriter(tmp_path)
    writer.append(WindowResult(make_row(7), make_detail()))
    code = (
        "import sys; from pathlib import Path; from runner.output.results import read_results; "
        "print([r.row.users for r in read_results(Path(sys.argv[1]))])"
    )
    seen = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert seen.stdout.strip() == "[7]"


@pytest.mark.parametrize("name", ["results.jsonl", "windows_detail.jsonl"])
@pytest.mark.parametrize("tail", ['{"timestamp_utc": "2026-07-10T12:05', '{"users": 9}'])
def test_a_torn_last_line_is_ignored_and_cut_before_the_next_append(
    tmp_path: Path, name: str, tail: str
) -> None:
    """A run killed mid-write leaves a last line without its newline, even one that
    parses: reader and writer agree it is torn, so resume neither fails nor fuses it."""
    ResultsWriter(tmp_path).append(WindowResult(make_row(7), make_detail()))
    with (tmp_path / name).open("a") as handle:
        handle.write(tail)
    assert [result.row.users for result in read_results(tmp_path)] == [7]
    assert [row.users for row in read_rows(tmp_path)] == [7]
    ResultsWriter(tmp_path).append(WindowResult(make_row(14), make_detail()))
    assert [result.row.users for result in read_results(tmp_path)] == [7, 14]
    assert [row.users for row in read_rows(tmp_path)] == [7, 14]


def test_a_kill_between_the_appends_of_a_window_neither_loses_nor_doubles_it(
    tmp_path: Path,
) -> None:
    """windows_detail.jsonl is written first and is the file of record: the next writer
    rebuilds results.jsonl and results.csv from it."""
    writer = ResultsWriter(tmp_path)
    writer.append(WindowResult(make_row(7), make_detail()))
    writer.append(WindowResult(make_row(14), make_detail()))
    for name in ("results.jsonl", "results.csv"):  # as if killed after the first append
        lines = (tmp_path / name).read_text().splitlines(keepends=True)
        (tmp_path / name).write_text("".join(lines[:-1]))
    ResultsWriter(tmp_path).append(WindowResult(make_row(28), make_detail()))
    assert [row.users for row in read_rows(tmp_path)] == [7, 14, 28]
    csv_lines = (tmp_path / "results.csv").read_text().splitlines()
    assert [line.split(",")[4] for line in csv_lines[1:]] == ["7", "14", "28"]
    assert not list(tmp_path.glob("*.tmp"))


def test_a_window_of_another_layout_is_refused_by_name(tmp_path: Path) -> None:
    ResultsWriter(tmp_path).append(WindowResult(make_row(7), make_detail()))
    record = json.loads((tmp_path / "windows_detail.jsonl").read_text())
    record["schema"] = 1
    (tmp_path / "windows_detail.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ResultsError, match="another version of runner") as caught:
        read_results(tmp_path)
    assert "\n" not in str(caught.value)


def test_a_damaged_middle_line_is_an_error(tmp_path: Path) -> None:
    ResultsWriter(tmp_path).append(WindowResult(make_row(7), make_detail()))
    text = (tmp_path / "windows_detail.jsonl").read_text()
    (tmp_path / "windows_detail.jsonl").write_text("{broken\n" + text)
    with pytest.raises(ResultsError, match="Line 1"):
        read_results(tmp_path)


def test_csv_from_another_layout_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results.csv").write_text("users,tok_s\n7,100\n")
    with pytest.raises(ResultsError, match="columns"):
        ResultsWriter(tmp_path)


def test_console_line_pass_has_the_seed_format() -> None:
    """seed 004 §8: users=N window=300s aggregate, slowest user, p99s, then PASS."""
    assert console_line(make_row(), make_detail(), floor=15.0) == (
        "users=28 window=300s aggregate_output_tok_s=512.25 min_user_tok_s=16.50 "
        "ttft_p99_ms=1234.6 request_latency_p99_ms=31000.0 PASS"
    )


def test_console_line_fails_below_the_floor() -> None:
    line = console_line(make_row(min_user_tok_s=14.2), make_detail(), floor=15.0)
    assert line.endswith("FAIL (min_user_tok_s 14.20 < 15)")


def test_console_line_fail_from_invalidity_gives_the_reasons() -> None:
    row = make_row(valid=False)
    line = console_line(row, make_detail(invalid_reasons=["audit 2.3% > 1%"]), floor=15.0)
    assert line.endswith("FAIL (invalid: audit 2.3% > 1%)")
    assert console_line(row).endswith("FAIL (invalid)")


def test_an_invalid_window_shows_what_n_really_was() -> None:
    """The users' least in-flight share and the server's running+waiting mean beside N."""
    row = make_row(8, valid=False, in_flight_pct=61.25, server_in_flight_mean=3.7)
    assert "in_flight=61.2% server_running+waiting=3.7/8 FAIL (invalid" in console_line(row)
    assert "in_flight" not in console_line(make_row(8), make_detail(), floor=15.0)


def test_console_line_prints_unavailable_figures_as_na() -> None:
    line = console_line(make_row(ttft_p99_ms=None, request_latency_p99_ms=None))
    assert "ttft_p99_ms=n/a request_latency_p99_ms=n/a PASS" in line


def test_console_line_marks_a_bursty_window_before_its_verdict() -> None:
    """seed 000: a window whose streams arrived in bursts says so on its line."""
    bursty = dataclasses.replace(make_detail(), streams=make_streams(True))
    steady = dataclasses.replace(make_detail(), streams=make_streams(False))
    assert console_line(make_row(), bursty, floor=15.0).endswith(
        "request_latency_p99_ms=31000.0 BURSTY PASS"
    )
    assert "BURSTY" not in console_line(make_row(), steady, floor=15.0)
    blamed = dataclasses.replace(make_detail(), streams=make_streams(True, "client"))
    assert console_line(make_row(), blamed, floor=15.0).endswith(" BURSTY(client) PASS")
    console = Console(record=True, width=300, color_system=None)
    print_window(console, make_row(), bursty, floor=15.0)
    assert console.export_text().strip().endswith("BURSTY PASS")


def test_print_window_writes_the_line() -> None:
    console = Console(record=True, width=300, color_system=None)
    print_window(console, make_row(min_user_tok_s=1.0), make_detail(), floor=15.0)
    assert console.export_text().strip() == console_line(make_row(min_user_tok_s=1.0), floor=15.0)


def test_the_console_says_how_the_window_met_the_prefix_cache() -> None:
    row = make_row(prefix_cache_hit_pct=63.4)
    warm = console_line(row, make_detail(prefix_cache="warm"), floor=15.0)
    assert warm.endswith(" prefix_cache=warm:63% PASS")
    assert "prefix_cache" not in console_line(make_row(), make_detail(), floor=15.0)


def test_the_console_marks_a_frontend_bound_window() -> None:
    line = console_line(make_row(8, server_in_flight_mean=5.0),
                        make_detail(8, frontend_bound=True), floor=15.0)  # fmt: skip
    assert line.endswith(" FRONTEND-BOUND(engine held 62% of the requests sent) PASS")
