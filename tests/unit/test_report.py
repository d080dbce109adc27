"""The final report (seed 004 section 11), its plots, and the family-split comparison."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from runner.measure.result import BucketStats, WindowDetail, WindowRow
from runner.output.compare import SearchRun, render_compare
from runner.output.report import plot_report, render_report
from tests import builders
from tests.builders import make_streams

SUMMARY = {
    "run_id": "run-a",
    "config_id": "nvfp4-w4a4-nvfp4kv-batch-default",
    "family": "nvfp4-w4a4/nvfp4-kv",
    "model_repo": "nvidia/Llama-3.1-8B-Instruct-NVFP4",
    "model_commit": "abc123",
    "gpu": "1x NVIDIA GeForce RTX 5090 (32 GiB)",
    "host": "offer 123",
    "vllm_version": "0.22.1",
    "image": "vllm/vllm-openai@sha256:" + "a" * 64,
    "cuda_version": "13.0",
    "driver_version": "595.58.03",
    "quantization": "ModelOpt NVFP4 W4A4, native SM120",
    "kv_cache": "NVFP4 (packed 4-bit data with FP8 block scales)",
    "context_distribution": "equal 1k/2k/4k/8k/16k/24k/30k",
    "workload_hash": "sha256:feed",
    "floor_tok_s": 15.0,
    "best_users": 28,
    "engine_minutes": 42.5,
}

SECTION_11_LABELS = [
    "Model", "GPU", "Host", "vLLM / image / CUDA / driver", "Quantization backend confirmed",
    "KV cache", "Context distribution", "Best valid concurrency",
    "Median aggregate output throughput", "Minimum user throughput", "Mean user throughput",
    "TTFT p99", "Request latency p99", "Workload hash", "Windows run", "Engine-minutes",
]  # fmt: skip


def make_row(users: int, aggregate: float, slowest: float, valid: bool = True) -> WindowRow:
    return builders.make_row(
        users, config_id="cfg", aggregate_output_tok_s=aggregate, server_output_tok_s=aggregate,
        mean_user_tok_s=aggregate / users, min_user_tok_s=slowest, p05_user_tok_s=slowest + 0.2,
        ttft_p50_ms=100.0, ttft_p95_ms=200.0, ttft_p99_ms=300.0 + users,
        request_latency_p50_ms=1e4, request_latency_p95_ms=2e4, request_latency_p99_ms=3e4 + users,
        preemptions=0, peak_kv_cache_pct=50.0, valid=valid,
    )  # fmt: skip


def make_detail(
    users: int, phase: str = "confirm", reasons: list[str] | None = None
) -> WindowDetail:
    buckets = [
        BucketStats(total, users // 2, 10, 40.0, 16.0, 50.0, 100.0 * index + users, 1e4, 2e4)
        for index, total in enumerate((1000, 30000), start=1)
    ]
    return builders.make_detail(users, phase=phase, buckets=buckets, invalid_reasons=reasons or [])


ROWS = [
    make_row(7, 200.0, 25.0),
    make_row(14, 380.0, 22.0),
    make_row(28, 500.0, 16.0),
    make_row(28, 520.0, 15.5),
    make_row(28, 510.0, 15.8),
    make_row(56, 700.0, 9.0, valid=False),
]
DETAILS = [make_detail(r.users) for r in ROWS[:-1]] + [
    make_detail(56, "bracket", ["audit 2.3% > 1%"])
]


def fact(report: str, label: str) -> str:
    prefix = f"- **{label}:** "
    lines = [line for line in report.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"{label!r} should appear once in the report"
    return lines[0].removeprefix(prefix)


def test_every_section_11_field_is_present() -> None:
    """seed 004 §11 lists the fields a final summary must contain."""
    report = render_report(SUMMARY, ROWS, DETAILS)
    for label in SECTION_11_LABELS:
        assert fact(report, label) != "unavailable", label
    assert fact(report, "Model") == "nvidia/Llama-3.1-8B-Instruct-NVFP4@abc123"
    assert fact(report, "vLLM / image / CUDA / driver").endswith("/ 13.0 / 595.58.03")
    assert fact(report, "Windows run") == "6"


def test_headline_figures_are_derived_from_the_valid_windows_at_best_n() -> None:
    """seed 004 §9.8: the median over the confirmation windows; the slowest user of all."""
    report = render_report(SUMMARY, ROWS, DETAILS)
    assert fact(report, "Best valid concurrency") == "28"
    assert fact(report, "Median aggregate output throughput") == "510.00 tok/s"
    assert fact(report, "Minimum user throughput") == "15.50 tok/s"
    assert fact(report, "TTFT p99") == "328.0 ms"


def test_figures_given_in_the_summary_win_over_derived_ones() -> None:
    report = render_report({**SUMMARY, "median_aggregate_tok_s": 999.0}, ROWS, DETAILS)
    assert fact(report, "Median aggregate output throughput") == "999.00 tok/s"


def test_missing_facts_print_unavailable() -> None:
    report = render_report({"best_users": None}, ROWS[-1:], DETAILS[-1:])
    for label in ("Model", "GPU", "KV cache", "Workload hash", "Engine-minutes",
                  "Minimum user throughput", "TTFT p99", "Best valid concurrency"):  # fmt: skip
        assert fact(report, label) == "unavailable", label
    assert fact(report, "vLLM / image / CUDA / driver") == " / ".join(["unavailable"] * 4)
    assert "no valid optimum" in report


def test_window_table_lists_every_window_with_invalid_reasons() -> None:
    report = render_report(SUMMARY, ROWS, DETAILS)
    table = [line for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(table) == len(ROWS)
    assert table[-1].endswith("| no: audit 2.3% > 1% |")
    assert "| bracket | 56 |" in table[-1]


def test_window_table_says_whether_the_streams_arrived_in_lumps() -> None:
    """seed 000: a bursty window is marked with who merged the tokens."""
    marked = [
        dataclasses.replace(DETAILS[0], streams=make_streams(True, "server")),
        dataclasses.replace(DETAILS[1], streams=make_streams(False)),
        dataclasses.replace(DETAILS[2], streams=None),
    ]
    report = render_report(SUMMARY, ROWS[:3], marked)
    table = [line for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [line.split(" | ")[-2] for line in table] == ["bursty (server)", "steady", "unavailable"]


def test_plots_are_written(tmp_path: Path) -> None:
    paths = plot_report(ROWS, DETAILS, 15.0, tmp_path / "plots")
    assert [path.name for path in paths] == [
        "aggregate_tok_s_vs_users.png",
        "user_tok_s_vs_users.png",
        "ttft_p99_by_bucket_vs_users.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bucket_plot_is_skipped_without_bucket_latencies(tmp_path: Path) -> None:
    bare = [dataclasses.replace(detail, buckets=[]) for detail in DETAILS]
    paths = plot_report(ROWS, bare, None, tmp_path)
    assert len(paths) == 2


def test_compare_never_mixes_families_in_one_table() -> None:
    """seed 004 §10: BF16, FP8 and NVFP4 results never share one leaderboard."""

    def search(family: str, config_id: str, status: str, **metrics: float) -> SearchRun:
        return SearchRun(family, config_id, f"run-{config_id}", status, f"id-{config_id}",
                         metrics=metrics)  # fmt: skip

    runs = [
        search("bf16/bf16-kv", "bf16-a", "FINISHED", best_users=16,
               best_aggregate_tok_s=644.5, best_min_user_tok_s=15.3),
        search("nvfp4/nvfp4-kv", "nvfp4-a", "FINISHED", best_users=16,
               best_aggregate_tok_s=1327.8, best_min_user_tok_s=82.9,
               best_tok_s_per_gpu=1327.8, best_usd_per_mtok=0.1862),
        search("nvfp4/nvfp4-kv", "nvfp4-b", "FAILED"),
    ]  # fmt: skip
    text = render_compare(runs)
    tables = text.split("family: ")[1:]
    assert len(tables) == 2
    bf16, nvfp4 = tables
    assert "bf16-a" in bf16 and "nvfp4" not in bf16
    assert "nvfp4-a" in nvfp4 and "nvfp4-b" in nvfp4 and "bf16-a" not in nvfp4
    assert "n/a" in nvfp4 and "644.50" in bf16
    # Cost columns: a search with a GPU profile and a price has them, a CPU one reads n/a.
    assert "$/Mtok" in bf16 and "0.1862" in nvfp4
    bf16_row = next(line for line in bf16.splitlines() if "bf16-a" in line)
    assert bf16_row.count("n/a") == 2


def test_the_report_says_where_the_frontend_bound_the_load_and_what_to_try() -> None:
    rows = [dataclasses.replace(ROWS[0], server_in_flight_mean=4.5)]
    details = [dataclasses.replace(DETAILS[0], frontend_bound=True)]
    text = render_report(SUMMARY, rows, details)
    assert "## Frontend-bound windows" in text and "N=7 (64%)" in text
    assert "--api-server-count" in text
    assert "Frontend-bound" not in render_report(SUMMARY, ROWS, DETAILS)


def test_the_report_shows_vllms_own_client_at_the_answer() -> None:
    reference = {"users": 28, "output_tok_s": 498.2, "server_output_tok_s": 501.0,
                 "input_len": 12000, "output_len": 512, "completed": 1400,
                 "num_prompts": 1400, "client_cpu_pct": 41.0}  # fmt: skip
    text = render_report({**SUMMARY, "reference": reference}, ROWS, DETAILS)
    assert ("- **vllm bench serve at N=28 (same engine):** 498.20 output tok/s, engine "
            "counter 501.00 tok/s, random 12000 in / 512 out, 1400/1400 prompts") in text
