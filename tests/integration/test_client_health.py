"""The client's own health and the burst flag on real vLLM CPU windows.

Seed 004 §7 (window audit), seed 000 (TPOT 0.0 ms from bursty streams). Observed on
vLLM 0.32 CPU: overload (more users than ``--max-num-seqs``) queues requests; on a
quiet machine it then streams them token by token, on a busy one its frontend merges
deltas, so seed 000's bursts come and go with the machine. What always delivers a
real engine's tokens in lumps is ``--stream-interval``, which buffers that many tokens
per event. Both are measured here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest

from runner.config import RunConfig, build_config
from runner.engines.base import LaunchPlan
from runner.engines.process import ProcessEngine
from runner.measure.protocol import run_window
from runner.measure.records import RequestRecord
from runner.measure.streams import BURSTY_WINDOW_SHARE, stream_timing, summarize_streams
from runner.measure.transport import Endpoint, StreamConnection
from runner.output.console import console_line
from runner.workload.context_mix import build_prompts, load_tokenizer
from tests.conftest import compose
from tests.integration.conftest import (
    EAGER,
    KV_CACHE_ARGS,
    TINY_CONTEXT,
    Server,
    free_port,
    wait_idle,
)

pytestmark = pytest.mark.integration

STREAM_INTERVAL = 16


def window_config(served_name: str, window_s: float = 6.0, max_tokens: int = 48) -> RunConfig:
    return build_config(
        compose(
            [
                "workload.buckets=[{total_tokens:128},{total_tokens:256}]",
                f"workload.max_tokens={max_tokens}",
                "workload.prompts_per_bucket=32",
                "workload.request_timeout_s=300",
                "search=fixed",
                f"search.window_s={window_s}",
                "search.warmup_s=2",
                "search.drain_timeout_s=300",
                f"model.served_name={served_name}",
            ]
        )
    )


def measure(server, users: int, config: RunConfig):
    prompts = build_prompts(load_tokenizer(server.model_dir), config.workload)
    return run_window(
        server, config, prompts, users, config_id="cpu-test", run_id="client", phase="coarse"
    )


# Loop lag under which the client reads each streamed event on its own.
QUIET_LOOP_MS = 20.0


@pytest.mark.parametrize("users", [1, 8, 64])
def test_the_audit_and_the_client_figures_hold_at_every_concurrency(vllm_server, users) -> None:
    """seed 004 §7: client and server token counts agree within 1% (aim 0.1%) and the
    window records the client's loop lag, CPU and connections."""
    result = measure(vllm_server, users, window_config(vllm_server.served_name))
    detail = result.detail
    client = detail.client
    streams = detail.streams
    assert client is not None and streams is not None
    assert detail.audit_delta_pct is not None and detail.audit_delta_pct <= 1.0, detail
    # Every user streams on a connection of its own; the /metrics client may add one.
    assert users <= client.open_connections <= users + 1
    assert client.loop_lag_p99_ms is not None and client.loop_lag_p99_ms >= 0
    assert client.cpu_pct > 0
    # seed 004 §7's 15 tok/s floor: one token gap, 66.7 ms, is the default lag limit. A
    # loop lagging past it stamps chunks late whatever the client's own CPU, so the
    # window is invalid either way.
    fell_behind = client.loop_lag_p99_ms > 1000.0 / 15.0
    assert client.kept_up == (not fell_behind)
    assert result.row.valid == (client.kept_up and not detail.invalid_reasons), detail
    assert streams.tpot_p50_ms > 0 and streams.itl_p99_ms > 0
    assert streams.bursty == (streams.burst_share > BURSTY_WINDOW_SHARE)
    if users == 1 and client.loop_lag_p99_ms <= QUIET_LOOP_MS:
        # One stream, read by a client that wakes on time, arrives about one token per
        # read: not bursty. Under load vLLM's frontend merges the deltas it could not
        # send yet, and a client held off by the engine on the same cores reads several
        # events at once: then the flag rightly says the ITL figures are coarse.
        assert streams.bursty is False, streams
        assert streams.tokens_per_chunk_mean < 2.0, streams
        assert "BURSTY" not in console_line(result.row, detail)
    assert streams.decode_tok_s_aggregate == result.row.aggregate_output_tok_s


def test_an_overloaded_window_queues_and_says_whether_its_streams_arrived_in_lumps(
    vllm_server,
) -> None:
    """seed 000: twice the engine's 256 sequences. vLLM CPU queues the excess (the
    waiting queue fills). Whether the admitted streams then arrive token by token
    depends on whether vLLM's frontend and the client keep pace on the cores they share
    with the engine: on a quiet machine they do, on a busy one the frontend merges the
    deltas it could not send yet. Either way the window must say which it was, on the
    console too, and report the aggregate decode rate beside the TPOT/ITL figures."""
    config = window_config(vllm_server.served_name, window_s=6.0, max_tokens=32)
    result = measure(vllm_server, 512, config)
    extra = result.detail.streams
    assert extra is not None and result.detail.queue is not None and result.detail.client is not None
    assert result.detail.queue.waiting_max > 0  # really overloaded
    assert extra.judged_requests > 0
    assert extra.bursty == (extra.burst_share > BURSTY_WINDOW_SHARE)
    assert ("BURSTY" in console_line(result.row, result.detail)) == extra.bursty
    assert extra.decode_tok_s_aggregate == result.row.aggregate_output_tok_s > 0
    if not result.detail.client.kept_up:
        assert not result.row.valid
        assert any("could not keep up" in r for r in result.detail.invalid_reasons)
    wait_idle(vllm_server.base_url, 300)


@pytest.fixture(scope="module")
def lumped_server(tiny_model_dir, tmp_path_factory) -> Iterator[Server]:
    """A second engine that sends its tokens STREAM_INTERVAL at a time."""
    port = free_port(8500)
    plan = LaunchPlan(
        image=None,
        argv=[
            "--model", str(tiny_model_dir),
            "--served-model-name", "tiny-lumped",
            "--load-format", "dummy",
            *KV_CACHE_ARGS,
            "--max-model-len", str(TINY_CONTEXT),
            "--max-num-seqs", "16",
            "--stream-interval", str(STREAM_INTERVAL),
            *EAGER,
            "--no-enable-prefix-caching",
            "--host", "127.0.0.1",
            "--port", str(port),
        ],
        port=port,
    )  # fmt: skip
    engine = ProcessEngine(plan, log_dir=tmp_path_factory.mktemp("lumped"), startup_timeout_s=600)
    with engine:
        yield Server(engine=engine, served_name="tiny-lumped", model_dir=tiny_model_dir)


def test_a_window_whose_tokens_arrive_in_lumps_carries_the_burst_flag(lumped_server) -> None:
    """seed 000: streams delivered many tokens at a time are flagged, on the console
    too, and the aggregate decode rate is reported beside the distorted TPOT/ITL."""
    result = measure(lumped_server, 8, window_config(lumped_server.served_name, max_tokens=64))
    extra = result.detail.streams
    assert extra is not None
    assert extra.bursty is True, extra
    assert extra.burst_share > 0.5
    assert extra.tokens_per_chunk_mean >= STREAM_INTERVAL / 2
    assert extra.decode_tok_s_aggregate == result.row.aggregate_output_tok_s > 0
    assert result.detail.audit_delta_pct <= 1.0  # the counts still agree: only timing lies
    # The server packed the tokens (--stream-interval), not the client's reads.
    assert extra.burst_source == "server", extra
    assert extra.tokens_per_event_mean >= STREAM_INTERVAL / 2
    assert " BURSTY(server) " in console_line(result.row, result.detail)


def test_a_client_that_wakes_late_reads_events_in_lumps_and_the_flag_blames_it(
    vllm_server,
) -> None:
    """seed 000's TPOT of 0.0 ms can be the client's own doing: a loop held up (here
    for 0.3 s at a time) finds many of the server's one-token events waiting and reads
    them at once. The stream is bursty and its source is the client, not the engine."""

    async def stream_while_stalling() -> RequestRecord:
        endpoint = Endpoint(vllm_server.base_url, "/v1/completions", {})
        connection = StreamConnection(endpoint, lambda record, event: None)
        body = {
            "model": vllm_server.served_name,
            "prompt": list(range(1, 33)),
            "max_tokens": 96,
            "min_tokens": 96,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        record = RequestRecord(user=0, bucket_total=128, prompt_id="p", dispatched_at=0.0)

        async def stall() -> None:
            while record.finished_at is None:
                time.sleep(0.3)  # blocks the loop, as a starved client would be
                await asyncio.sleep(0)

        staller = asyncio.create_task(stall())
        try:
            await connection.stream(record, endpoint.request(json.dumps(body).encode()))
        finally:
            record.finished_at = time.monotonic()
            await staller
            connection.close()
        return record

    record = asyncio.run(stream_while_stalling())
    assert record.error is None and record.tokens == 96
    timing = stream_timing(record)
    assert timing.bursty and timing.burst_source == "client", timing
    summary = summarize_streams([record], decode_tok_s_aggregate=1.0)
    assert summary.burst_source == "client"
    assert summary.events_per_read_mean > summary.tokens_per_event_mean
