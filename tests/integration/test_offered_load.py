"""Both validity gates starve the client for real, against the real vLLM CPU engine.

Issue 9: a row that says N users must be a measurement of N users each keeping a
request in flight, read by a client that woke on time. Here the client is made to fail
each way on purpose, with a cause the test controls rather than the machine's load:

* its users dispatch late: each waits 0.4 s (without blocking the event loop) after a
  completion before it sends again, so the engine is offered less than N;
* its event loop is blocked: 0.25 s of synchronous work before every dispatch holds
  every stream's reads and every other user's dispatch.

Either window must come back invalid, with its reason, whatever the client's CPU.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from runner.config import RunConfig, build_config
from runner.measure import load
from runner.measure.protocol import run_window
from runner.workload.context_mix import build_prompts, load_tokenizer
from tests.conftest import compose
from tests.integration.conftest import wait_idle

pytestmark = pytest.mark.integration

USERS = 4
LATE_DISPATCH_S = 0.4
BLOCKED_LOOP_S = 0.25


def gate_config(served_name: str) -> RunConfig:
    return build_config(
        compose(
            [
                "workload.buckets=[{total_tokens:256}]", "workload.max_tokens=32",
                "workload.prompts_per_bucket=16", "search=fixed", "search.window_s=8",
                "search.warmup_s=2", f"model.served_name={served_name}",
            ]
        )
    )  # fmt: skip


def window(server):
    config = gate_config(server.served_name)
    prompts = build_prompts(load_tokenizer(server.model_dir), config.workload)
    result = run_window(
        server, config, prompts, USERS, config_id="gate", run_id="gate", phase="coarse"
    )
    wait_idle(server.base_url, 120)
    return result


def test_users_that_dispatch_late_make_the_window_invalid(vllm_server, monkeypatch) -> None:
    """Issue 9 §1: a user idle between a completion and its next dispatch offers less
    than the row claims; the token audit cannot see it, the in-flight share does."""
    send = load.StreamingUsers._send

    async def late_send(self, user, record, body):
        await send(self, user, record, body)  # stamps finished_at at the last byte
        await asyncio.sleep(LATE_DISPATCH_S)  # the loop stays free: no lag, only idleness

    monkeypatch.setattr(load.StreamingUsers, "_send", late_send)
    result = window(vllm_server)
    assert not result.row.valid
    assert result.row.in_flight_pct is not None and result.row.in_flight_pct < 97.0
    reasons = result.detail.invalid_reasons
    assert any(r.startswith(f"offered load below N={USERS}") for r in reasons), reasons
    gap = result.detail.offered_load.dispatch_gap_max_ms
    assert gap is not None and gap >= LATE_DISPATCH_S * 1000.0
    # The client counted every token the server sent: only the load was short.
    assert result.detail.audit_delta_pct is not None and result.detail.audit_delta_pct <= 1.0


def test_a_blocked_event_loop_makes_the_window_invalid(vllm_server, monkeypatch) -> None:
    """Issue 9 §1: a loop that wakes later than one token gap at the floor (66.7 ms at
    seed 004's 15 tok/s) stamped chunks late and merged reads; the window is refused
    with the lag, whatever the client's own CPU."""
    next_prompt = load.LoadGenerator._next_prompt

    def blocking_next_prompt(self, bucket_total):
        time.sleep(BLOCKED_LOOP_S)  # synchronous work on the loop, as a starved client
        return next_prompt(self, bucket_total)

    monkeypatch.setattr(load.LoadGenerator, "_next_prompt", blocking_next_prompt)
    result = window(vllm_server)
    client = result.detail.client
    assert client is not None and not client.kept_up
    assert client.loop_lag_p99_ms is not None and client.loop_lag_p99_ms > 1000.0 / 15.0
    assert not result.row.valid
    reasons = result.detail.invalid_reasons
    assert any("event-loop lag" in r for r in reasons), reasons
