"""Seed 000's fixed-concurrency benchmark over a ShareGPT file: one row of figures.

Seed 000 runs ``--dataset ShareGPT_V3_unfiltered_cleaned_split.json --num-prompts 1000
--max-seconds 900 --concurrency 32 --max-tokens 256`` and reports aggregate prefill and
decode tok/s, median TTFT and TPOT, the error count and how many prompts completed
within the time cap. ``workload.kind=sharegpt`` runs the same benchmark instead of the
concurrency search; the engine, start-up facts, results folder, manifest and MLflow
parent run are the search's own (:mod:`runner.run`).

The load: ``workload.concurrency`` persistent users (:class:`runner.load.LoadGenerator`)
take the next prompt from one shared queue, each prompt once in the workload's order,
with zero think time, until every prompt is sent or ``workload.max_seconds`` have passed
since the start. At the cap no further prompt is sent and the requests in flight run to
completion (each is bounded by ``workload.request_timeout_s``), and they count: seed 000
hit its 900 s cap at 361/1000 prompts and reports a 938 s run with 0 errors, so its
in-flight prompts finished after the cap.

The figures (:func:`summarize_benchmark`), as seed 000's report uses them:

* ``duration_s``: from the start of the load to the end of the last request (938 s in
  seed 000: the cap plus the tail of the requests in flight);
* ``prefill_tok_s``: prompt tokens of the completed requests / ``duration_s``;
* ``decode_tok_s``: output tokens of the completed requests / ``duration_s``; both are
  whole-system aggregates over the run, not per-stream rates ("aggregate, conc 32" in
  seed 000). Its figures are consistent with exactly these definitions: 96.9 tok/s x
  938 s / 361 prompts is 252 output tokens per prompt (just under its 256 cap) and
  115.2 x 938 / 361 is 299 prompt tokens, a typical first ShareGPT turn;
* ``ttft_median_ms``: median over completed requests of first-token arrival minus
  dispatch, queueing included (seed 000's 78.7 s with 32 long prompts admitted at once);
* ``tpot_median_ms``: median over completed requests of their time per output token,
  first chunk to last chunk over the tokens that arrived after the first chunk
  (:func:`runner.streams.stream_timing`). When the server delivers a queued stream's
  tokens in one burst just before it ends, first and last arrive together and TPOT
  reads about 0 ms: seed 000's "TPOT 0.0 ms" artefact is reproduced, not hidden, and
  ``bursty`` says so (:func:`runner.streams.summarize_streams`); ``decode_tok_s`` is
  then the honest decode figure.

Failed requests are counted in ``errors`` and left out of the figures; a figure that
cannot be measured is None, never 0.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console

from runner import transport
from runner.config import RunConfig
from runner.engines.base import LaunchPlan, RunningEngine
from runner.errors import ConfigError, EngineError, TrackingError
from runner.metrics import EngineMetrics
from runner.records import Prompt
from runner.streams import summarize_streams
from runner.window import RequestRecord

if TYPE_CHECKING:
    from runner.run import RunContext

log = logging.getLogger("runner")

BENCHMARK_NAME = "benchmark.jsonl"


@dataclass(frozen=True)
class BenchmarkMeasurement:
    """Everything one benchmark collected, before any statistics (monotonic seconds)."""

    timestamp_utc: str
    workload: str
    concurrency: int
    num_prompts: int  # prompts in the workload: the most that could be sent
    max_seconds: float | None
    started: float
    records: list[RequestRecord]
    prompt_tokens: dict[str, int]  # prompt id -> templated prompt tokens
    server_start: EngineMetrics | None = None
    server_end: EngineMetrics | None = None


@dataclass(frozen=True)
class BenchmarkRow:
    """One line of ``benchmark.jsonl``; see the module docstring for each figure."""

    timestamp_utc: str
    run_id: str
    config_id: str
    workload: str
    concurrency: int
    num_prompts: int
    max_seconds: float | None
    prompts_sent: int
    prompts_completed: int
    errors: int
    capped: bool  # the time cap stopped dispatch before every prompt was sent
    duration_s: float | None
    prompt_tokens: int
    output_tokens: int
    prefill_tok_s: float | None
    decode_tok_s: float | None
    ttft_median_ms: float | None
    tpot_median_ms: float | None
    bursty: bool | None  # TPOT times token bursts, not decode (seed 000's 0.0 ms)
    burst_share: float | None  # share of the judged streams that arrived in bursts
    burst_source: str | None  # who merged the tokens: "server", "client" or both
    server_prompt_tokens: int | None  # vLLM's own counters over the run
    server_output_tokens: int | None

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median_ms(seconds: Sequence[float]) -> float | None:
    return float(np.median(seconds) * 1000.0) if seconds else None


def _counter_delta(start: EngineMetrics | None, end: EngineMetrics | None, name: str) -> int | None:
    before = getattr(start, name) if start is not None else None
    after = getattr(end, name) if end is not None else None
    if before is None or after is None:
        return None
    return round(after - before)


def summarize_benchmark(
    measurement: BenchmarkMeasurement, *, run_id: str, config_id: str
) -> BenchmarkRow:
    """Seed 000's figures from the request records (definitions in the module docstring)."""
    m = measurement
    completed = [r for r in m.records if r.error is None and r.finished_at is not None]
    ends = [r.finished_at for r in m.records if r.finished_at is not None]
    duration = max(ends) - m.started if ends else None
    prompt_tokens = sum(m.prompt_tokens[r.prompt_id] for r in completed)
    output_tokens = sum(r.tokens for r in completed)
    ttft = [r.first_token_at - r.dispatched_at for r in completed if r.first_token_at is not None]
    measured = duration is not None and duration > 0 and bool(completed)
    decode_tok_s = output_tokens / duration if measured else None
    streams = summarize_streams(completed, decode_tok_s) if completed else {}
    return BenchmarkRow(
        timestamp_utc=m.timestamp_utc,
        run_id=run_id,
        config_id=config_id,
        workload=m.workload,
        concurrency=m.concurrency,
        num_prompts=m.num_prompts,
        max_seconds=m.max_seconds,
        prompts_sent=len(m.records),
        prompts_completed=len(completed),
        errors=sum(1 for r in m.records if r.error is not None),
        capped=len(m.records) < m.num_prompts,
        duration_s=duration,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        prefill_tok_s=prompt_tokens / duration if measured else None,
        decode_tok_s=decode_tok_s,
        ttft_median_ms=_median_ms(ttft),
        tpot_median_ms=streams.get("tpot_p50_ms"),
        bursty=streams.get("bursty"),
        burst_share=streams.get("burst_share"),
        burst_source=streams.get("burst_source"),
        server_prompt_tokens=_counter_delta(m.server_start, m.server_end, "prompt_tokens_total"),
        server_output_tokens=_counter_delta(
            m.server_start, m.server_end, "generation_tokens_total"
        ),
    )


def _figure(value: float | None, decimals: int, unit: str) -> str:
    return "n/a" if value is None else f"{value:.{decimals}f} {unit}"


def console_line(row: BenchmarkRow) -> str:
    """Seed 000's figures in one line, e.g. ``... 361/1000 prompts in 938 s (time cap
    900 s reached), 0 errors: prefill 115.2 tok/s, decode 96.9 tok/s, ...``."""
    cap = ""
    if row.capped and row.max_seconds is not None:
        cap = f" (time cap {row.max_seconds:g} s reached)"
    duration = _figure(row.duration_s, 0, "s")
    return (
        f"{row.workload} concurrency={row.concurrency}: {row.prompts_completed}/{row.num_prompts} "
        f"prompts completed in {duration}{cap}, {row.errors} errors: "
        f"prefill {_figure(row.prefill_tok_s, 1, 'tok/s')}, "
        f"decode {_figure(row.decode_tok_s, 1, 'tok/s')} (aggregate), "
        f"median TTFT {_figure(row.ttft_median_ms, 1, 'ms')}, "
        f"median TPOT {_figure(row.tpot_median_ms, 1, 'ms')}"
        + (
            f" (bursty streams, merged by the {row.burst_source or 'server or client'}: "
            "TPOT times bursts, not decode)"
            if row.bursty
            else ""
        )
    )


def row_metrics(row: BenchmarkRow) -> dict[str, float]:
    """The row's figures for MLflow; unavailable ones are left out, not zeroed."""
    names = (
        "prompts_sent", "prompts_completed", "errors", "capped", "duration_s",
        "prompt_tokens", "output_tokens", "prefill_tok_s", "decode_tok_s",
        "ttft_median_ms", "tpot_median_ms", "bursty", "burst_share",
        "server_prompt_tokens", "server_output_tokens",
    )  # fmt: skip
    values = {name: getattr(row, name) for name in names}
    return {name: float(value) for name, value in values.items() if value is not None}


# --- I/O: the workload, the load and the run -------------------------------------------


def served_context(config: RunConfig) -> int:
    return config.engine.max_model_len or config.model.max_context


def build_benchmark_workload(
    config: RunConfig, host_model_dir: Path | None, results_dir: Path
) -> tuple[list[Prompt], str]:
    """The ShareGPT prompts, frozen to ``workload.jsonl``; returns them and its SHA-256."""
    from runner.sharegpt import build_sharegpt_prompts, load_sharegpt
    from runner.workload import load_tokenizer, write_workload

    workload = config.workload
    if host_model_dir is None:
        raise ConfigError(
            f"runner needs the tokenizer of {config.model.repo} on this host to turn the "
            "ShareGPT conversations into the token IDs it sends, but the model is not "
            "local: set backend.hf_cache to the Hugging Face cache that holds it and "
            "model.revision to the snapshot's commit."
        )
    assert workload.dataset_path is not None and workload.max_tokens is not None  # validated
    prompts = build_sharegpt_prompts(
        load_tokenizer(host_model_dir),
        load_sharegpt(Path(workload.dataset_path).expanduser()),
        max_tokens=workload.max_tokens,
        max_context=served_context(config),
        num_prompts=workload.num_prompts,
        seed=workload.seed,
    )
    sha = write_workload(prompts, results_dir / "workload.jsonl", workload.seed)
    return prompts, sha


def measure_benchmark(
    engine: RunningEngine,
    config: RunConfig,
    prompts: Sequence[Prompt],
    api_key: str | None = None,
) -> BenchmarkMeasurement:
    """Run the load described in the module docstring; the engine is idle afterwards."""
    return transport.run(_measure(engine, config, prompts, api_key))


async def _measure(
    engine: RunningEngine, config: RunConfig, prompts: Sequence[Prompt], api_key: str | None
) -> BenchmarkMeasurement:
    from runner.load import LoadGenerator, auth_headers
    from runner.sampler import metrics_client, read_metrics, wait_idle_async

    workload, drain_s = config.workload, config.search.drain_timeout_s
    assert workload.concurrency is not None  # validated
    headers = auth_headers(api_key)
    load = LoadGenerator(
        engine.base_url,
        prompts,
        workload.concurrency,
        served_name=config.model.served_name,
        ignore_eos=workload.ignore_eos,
        temperature=workload.temperature,
        request_timeout_s=workload.request_timeout_s,
        headers=headers,
        max_requests=len(prompts),
    )
    async with metrics_client(engine.base_url, headers) as metrics, load:
        await wait_idle_async(metrics, drain_s)
        before = (await read_metrics(metrics)).metrics
        started = time.monotonic()
        load.start()
        if not await load.wait_users(workload.max_seconds):
            load.stop_dispatch()
            log.info(
                "time cap of %g s reached after %d of %d prompts; letting the requests in "
                "flight finish",
                workload.max_seconds,
                len(load.records),
                len(prompts),
            )
            # Each request already ends within request_timeout_s; the margin only
            # covers the cancellation of a stuck one.
            await load.drain(workload.request_timeout_s + 5.0)
        after = None
        if engine.fault() is None:
            await wait_idle_async(metrics, drain_s)
            after = (await read_metrics(metrics)).metrics
    return BenchmarkMeasurement(
        timestamp_utc=datetime.now(UTC).isoformat(timespec="seconds"),
        workload=workload.name,
        concurrency=workload.concurrency,
        num_prompts=len(prompts),
        max_seconds=workload.max_seconds,
        started=started,
        records=load.records,
        prompt_tokens={prompt.id: prompt.prompt_tokens for prompt in prompts},
        server_start=before,
        server_end=after,
    )


def read_benchmark_rows(folder: Path) -> list[BenchmarkRow]:
    """The rows in ``folder``'s ``benchmark.jsonl``; a figure added since reads as None."""
    from runner.results import read_jsonl

    names = BenchmarkRow.field_names()
    return [
        BenchmarkRow(**{name: record.get(name) for name in names})
        for record in read_jsonl(Path(folder) / BENCHMARK_NAME)
    ]


def measured_before(context: RunContext) -> BenchmarkRow | None:
    """The row this run_id already wrote, if any: a benchmark is one measurement, so a
    rerun with the same run_id reports it instead of measuring again."""
    rows = [row for row in read_benchmark_rows(context.results_dir) if row.run_id == context.run_id]
    return rows[-1] if rows else None


def report_measured(context: RunContext, row: BenchmarkRow, console: Console) -> dict[str, Any]:
    """What a rerun of a finished benchmark prints and returns, starting nothing."""
    console.print(
        f"run {context.run_id} was already measured; its row in "
        f"{context.results_dir / BENCHMARK_NAME} (use a new run_id to measure again):",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(console_line(row), markup=False, highlight=False)
    return {
        "run_id": context.run_id,
        "config_id": context.config_id,
        "family": context.family,
        "results_dir": str(context.results_dir),
        **row.as_dict(),
    }


def append_row(path: Path, row: BenchmarkRow) -> None:
    """Append the row to ``benchmark.jsonl`` and sync it to disk."""
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row.as_dict()) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise TrackingError(
            f"The benchmark row could not be written to {path} ({exc}); the measurement "
            "is lost for this folder. Free disk space or fix permissions and run again."
        ) from exc


def execute_fixed(
    context: RunContext, plan: LaunchPlan, host_model_dir: Path | None, console: Console
) -> dict[str, Any]:
    """Seed 000's benchmark end to end, for a prepared :class:`runner.run.RunContext`."""
    from runner import run
    from runner.startup import verify_precision

    config = context.config
    prompts, sha = build_benchmark_workload(config, host_model_dir, context.results_dir)
    context.manifest["workload"] = {
        "sha256": sha,
        "seed": config.workload.seed,
        "dataset": str(Path(config.workload.dataset_path or "").expanduser().resolve()),
        "prompts": len(prompts),
    }
    context.write_manifest()
    api_key = run.engine_api_key(config)
    row: BenchmarkRow | None = None
    status = "FAILED"
    with ExitStack() as stack:
        tracker = stack.enter_context(run.open_tracker(context, **{"runner.mode": "benchmark"}))
        try:
            engine = stack.enter_context(run.open_engine(context, plan))
            facts = run.startup_facts(engine)
            facts["precision_notes"] = verify_precision(config, facts)
            context.manifest["startup"] = facts
            context.write_manifest()
            tracker.log_startup_facts(facts)
            measurement = measure_benchmark(engine, config, prompts, api_key)
            row = summarize_benchmark(
                measurement, run_id=context.run_id, config_id=context.config_id
            )
            append_row(context.results_dir / BENCHMARK_NAME, row)
            console.print(console_line(row), markup=False, highlight=False)
            tracker.log_metrics(row_metrics(row), step=row.concurrency)
            fault = engine.fault()
            if fault is not None:
                raise EngineError(
                    f"The engine stopped serving during the benchmark ({fault.reason}); the "
                    f"row in {BENCHMARK_NAME} counts the failed requests. Last log lines:\n"
                    f"{engine.log_tail()}"
                )
            status = "FINISHED"
        finally:
            summary = {
                "run_id": context.run_id,
                "config_id": context.config_id,
                "family": context.family,
                "results_dir": str(context.results_dir),
                **(row.as_dict() if row is not None else {}),
            }
            context.manifest["summary"] = summary
            context.write_manifest()
            for name in ("manifest.json", "workload.jsonl", BENCHMARK_NAME, "engine.log"):
                if (context.results_dir / name).exists():
                    tracker.log_artifact(context.results_dir / name)
            tracker.finish(status)
    console.print(
        f"config_id={context.config_id} run_id={context.run_id} family={context.family}\n"
        f"results: {context.results_dir / BENCHMARK_NAME}  MLflow: "
        f"{config.tracking.uri if config.tracking.enabled else 'disabled'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return summary
