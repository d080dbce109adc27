"""Seed 000's benchmark figures from plain request records, and its workload rules."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import pytest

from runner.config import RunConfig, build_config
from runner.errors import ConfigError
from runner.measure.benchmark import BenchmarkMeasurement, BenchmarkRow, summarize_benchmark
from runner.measure.metrics import EngineMetrics
from runner.measure.records import RequestRecord
from runner.output.benchmark import benchmark_line, row_metrics
from runner.prepare.validate import validate


def streamed(
    prompt_id: str,
    dispatched: float,
    chunk_times: list[float],
    *,
    tokens_per_chunk: int = 1,
    error: str | None = None,
) -> RequestRecord:
    """A request whose chunks arrived at ``chunk_times``; it ends with the last chunk."""
    return RequestRecord(
        user=0,
        bucket_total=4096,
        prompt_id=prompt_id,
        dispatched_at=dispatched,
        first_token_at=chunk_times[0] if chunk_times else None,
        finished_at=(chunk_times[-1] if chunk_times else dispatched + 1.0),
        chunk_times=array("d", chunk_times),
        chunk_tokens=array("I", [tokens_per_chunk] * len(chunk_times)),
        error=error,
    )


def metrics(prompt: float, generation: float) -> EngineMetrics:
    return EngineMetrics(generation, prompt, 0, 0, None, None)


def measure(records: list[RequestRecord], **changes: Any) -> BenchmarkMeasurement:
    values: dict[str, Any] = {
        "timestamp_utc": "2026-12-01T00:00:00+00:00",
        "workload": "sharegpt",
        "concurrency": 2,
        "num_prompts": 4,
        "max_seconds": 900.0,
        "started": 100.0,
        "records": records,
        "prompt_tokens": {"a": 300, "b": 100, "c": 50, "d": 70},
    }
    return BenchmarkMeasurement(**(values | changes))


def summarize(records: list[RequestRecord], **changes: Any) -> BenchmarkRow:
    return summarize_benchmark(measure(records, **changes), run_id="r", config_id="c")


def test_prefill_and_decode_are_aggregate_tokens_over_the_whole_run() -> None:
    """seed 000: prefill and decode tok/s are whole-system aggregates, tokens / duration,
    where the duration runs from the start to the end of the last request."""
    records = [
        streamed("a", 100.0, [101.0 + 0.1 * i for i in range(11)]),  # 11 tokens, ends 102.0
        streamed("b", 100.0, [102.0 + 0.2 * i for i in range(6)]),  # 6 tokens, ends 103.0
        streamed("c", 102.0, [105.0 + 0.5 * i for i in range(11)]),  # 11 tokens, ends 110.0
    ]
    row = summarize(records)
    assert row.duration_s == pytest.approx(10.0)
    assert (row.prompt_tokens, row.output_tokens) == (450, 28)
    assert row.prefill_tok_s == pytest.approx(45.0)
    assert row.decode_tok_s == pytest.approx(2.8)
    assert (row.prompts_sent, row.prompts_completed, row.errors) == (3, 3, 0)


def test_ttft_and_tpot_are_medians_over_the_completed_requests() -> None:
    """seed 000: median TTFT includes queueing; TPOT is the time from first to last token
    over the tokens after the first."""
    records = [
        streamed("a", 100.0, [101.0 + 0.1 * i for i in range(11)]),  # TTFT 1 s, TPOT 100 ms
        streamed("b", 100.0, [102.0 + 0.2 * i for i in range(6)]),  # TTFT 2 s, TPOT 200 ms
        streamed("c", 102.0, [105.0 + 0.5 * i for i in range(11)]),  # TTFT 3 s, TPOT 500 ms
    ]
    row = summarize(records)
    assert row.ttft_median_ms == pytest.approx(2000.0)
    assert row.tpot_median_ms == pytest.approx(200.0)
    assert row.bursty is False


def test_a_burst_delivered_stream_reads_tpot_near_zero_and_is_flagged() -> None:
    """seed 000: under overload a queued stream's tokens land in one burst right before it
    ends, so TPOT reads 0.0 ms; the row says the streams were bursty."""
    records = [
        streamed("a", 100.0, [180.0, 180.0001], tokens_per_chunk=128),
        streamed("b", 100.0, [170.0, 170.0001], tokens_per_chunk=128),
    ]
    row = summarize(records)
    assert row.tpot_median_ms is not None and row.tpot_median_ms < 0.01
    assert row.ttft_median_ms == pytest.approx(75000.0)
    assert row.bursty is True
    assert row.decode_tok_s == pytest.approx(512 / 80.0001)
    assert "bursty" in benchmark_line(row)


def test_failed_requests_are_counted_and_left_out_of_the_figures() -> None:
    records = [
        streamed("a", 100.0, [101.0, 102.0]),
        streamed("b", 100.0, [101.5], error="HTTP 500: boom"),
        streamed("c", 100.0, [], error="timeout: no completion within 60 s"),
    ]
    row = summarize(records)
    assert (row.prompts_sent, row.prompts_completed, row.errors) == (3, 1, 2)
    assert (row.prompt_tokens, row.output_tokens) == (300, 2)
    assert row.duration_s == pytest.approx(2.0)  # the failed request also ran until 102.0
    assert row.ttft_median_ms == pytest.approx(1000.0)


def test_the_cap_shows_when_fewer_prompts_were_sent_than_the_workload_holds() -> None:
    """seed 000: "Hit the 15-min time cap at 361/1000 prompts, 0 errors"."""
    records = [streamed("a", 100.0, [101.0, 102.0]), streamed("b", 100.0, [101.0, 103.0])]
    capped = summarize(records, num_prompts=4)
    assert capped.capped is True
    assert "2/4 prompts completed" in benchmark_line(capped)
    assert "time cap 900 s reached" in benchmark_line(capped)
    whole = summarize(records, num_prompts=2)
    assert whole.capped is False and "time cap" not in benchmark_line(whole)


def test_nothing_measured_is_unavailable_not_zero() -> None:
    row = summarize([streamed("a", 100.0, [], error="HTTP 503: down")])
    assert row.prefill_tok_s is None and row.decode_tok_s is None
    assert row.ttft_median_ms is None and row.tpot_median_ms is None
    assert row.server_output_tokens is None
    assert "prefill n/a" in benchmark_line(row)
    assert "decode_tok_s" not in row_metrics(row) and row_metrics(row)["errors"] == 1.0


def test_the_server_counters_are_reported_beside_the_client_counts() -> None:
    records = [streamed("a", 100.0, [101.0, 102.0])]
    row = summarize(records, server_start=metrics(1000, 50), server_end=metrics(1300, 52))
    assert (row.server_prompt_tokens, row.server_output_tokens) == (300, 2)
    assert summarize(records, server_start=metrics(1000, 50)).server_output_tokens is None


# --- the workload's config rules ---------------------------------------------------------


def benchmark_config(tmp_path: Path, **workload: Any) -> RunConfig:
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text("[]")
    fields = {
        "name": "sharegpt", "kind": "sharegpt", "dataset_path": str(dataset),
        "num_prompts": 1000, "max_seconds": 900.0, "concurrency": 32, "max_tokens": 256,
        "ignore_eos": False,
    } | workload  # fmt: skip
    return RunConfig.model_validate(
        {
            "image": {"name": "cpu_local", "repository": "local/vllm-cpu", "tag": "0.32.0",
                      "allow_unpinned": True, "local_build": True},
            "model": {"name": "tiny", "repo": "local/tiny-llama", "allow_unresolved_revision": True,
                      "weights": "bf16", "served_name": "tiny", "max_context": 4096,
                      "generated": True},
            "kv": {"name": "auto", "cache_dtype": "auto", "precision": "auto"},
            "engine": {"name": "cpu", "max_num_seqs": 32, "max_model_len": 2048},
            "workload": {k: v for k, v in fields.items() if v is not None},
            "search": {"kind": "bracket", "start_users": 7, "max_users": 1024},
            "backend": {"kind": "process"},
            "results": {"dir": str(tmp_path / "results")},
        }  # fmt: skip
    )


def refusal(config: RunConfig) -> str:
    with pytest.raises(ConfigError) as caught:
        assert validate(config) == []
    return str(caught.value)


def test_seed_000s_benchmark_validates_without_the_search_ceiling(tmp_path: Path) -> None:
    """seed 000 serves --concurrency 32 with --max-num-seqs 32; the search's max_users
    does not apply to a run without a search."""
    assert validate(benchmark_config(tmp_path)) == []


def test_the_benchmark_needs_its_users_within_max_num_seqs(tmp_path: Path) -> None:
    assert "max_num_seqs=32 is below workload.concurrency=33" in refusal(
        benchmark_config(tmp_path, concurrency=33)
    )
    assert "needs workload.concurrency" in refusal(benchmark_config(tmp_path, concurrency=None))


def test_the_benchmark_needs_an_explicit_max_tokens_that_fits(tmp_path: Path) -> None:
    """seed 004 §12: without max_tokens vLLM silently stops every answer at 16 tokens."""
    assert "16 tokens" in refusal(benchmark_config(tmp_path, max_tokens=None))
    assert "leaves no room" in refusal(benchmark_config(tmp_path, max_tokens=2048))


def test_a_missing_dataset_is_refused_but_only_warned_about_in_a_dry_run(tmp_path: Path) -> None:
    config = benchmark_config(tmp_path, dataset_path=str(tmp_path / "absent.json"))
    assert "is not a file on this host" in refusal(config)
    dry = config.model_copy(update={"dry_run": True})
    assert any("is not a file" in warning for warning in validate(dry))


def test_each_kind_requires_its_input_and_refuses_the_others(tmp_path: Path) -> None:
    """A workload file carries only its kind's keys: what another kind reads is refused
    by name, never silently ignored."""
    with pytest.raises(ConfigError, match=r"workload\.dataset_path: Field required"):
        build_config(benchmark_config(tmp_path).model_dump() | {"workload": {
            "name": "sharegpt", "kind": "sharegpt", "max_tokens": 256}})  # fmt: skip
    mix = benchmark_config(tmp_path).model_dump()
    mix["workload"] = {"name": "mix", "buckets": [{"total_tokens": 1024}], "max_tokens": 64,
                       "concurrency": 8}  # fmt: skip
    with pytest.raises(ConfigError, match=r"workload\.concurrency: Extra inputs are not permitted"):
        build_config(mix)
    mix["workload"] = {"name": "mix", "max_tokens": 64}
    with pytest.raises(ConfigError, match=r"workload\.buckets: Field required"):
        build_config(mix)
