"""Seed 000's fixed-concurrency benchmark over a ShareGPT file: one row of figures.

Seed 000 runs ``--dataset ShareGPT_V3_unfiltered_cleaned_split.json --num-prompts 1000
--max-seconds 900 --concurrency 32 --max-tokens 256`` and reports aggregate prefill and
decode tok/s, median TTFT and TPOT, the error count and how many prompts completed
within the time cap. ``workload.kind=sharegpt`` runs the same benchmark instead of the
concurrency search (:mod:`runner.run.benchmark`).

The load: ``workload.concurrency`` persistent users (:class:`runner.measure.load.LoadGenerator`)
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
  (:func:`runner.measure.streams.stream_timing`). When the server delivers a queued stream's
  tokens in one burst just before it ends, first and last arrive together and TPOT
  reads about 0 ms: seed 000's "TPOT 0.0 ms" artefact is reproduced, not hidden, and
  ``bursty`` says so (:func:`runner.measure.streams.summarize_streams`); ``decode_tok_s`` is
  then the honest decode figure.

Failed requests are counted in ``errors`` and left out of the figures; a figure that
cannot be measured is None, never 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

import numpy as np

from runner.config import RunConfig
from runner.engines.base import RunningEngine
from runner.measure import transport
from runner.measure.load import LoadGenerator, auth_headers
from runner.measure.metrics import EngineMetrics
from runner.measure.records import RequestRecord
from runner.measure.sampler import metrics_client, read_metrics, wait_idle_async
from runner.measure.streams import summarize_streams
from runner.workload.prompt import Prompt

log = logging.getLogger("runner")


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
    streams = summarize_streams(completed, decode_tok_s or 0.0) if completed else None
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
        tpot_median_ms=streams.tpot_p50_ms if streams else None,
        bursty=streams.bursty if streams else None,
        burst_share=streams.burst_share if streams else None,
        burst_source=streams.burst_source if streams else None,
        server_prompt_tokens=_counter_delta(m.server_start, m.server_end, "prompt_tokens_total"),
        server_output_tokens=_counter_delta(
            m.server_start, m.server_end, "generation_tokens_total"
        ),
    )


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
