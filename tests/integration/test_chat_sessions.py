"""Chat sessions against the real vLLM CPU engine with prefix caching on: users walk
their conversations with think time, every prompt holds exactly the tokens the workload
says (the engine's own answers included), the history is found in the prefix cache,
and think time is not counted as idleness of the client."""

from __future__ import annotations

from itertools import pairwise

import httpx
import pytest

from runner.config import RunConfig, build_config
from runner.measure.metrics import parse_metrics
from runner.measure.protocol import collect_window, prefix_cache_state
from runner.measure.records import WindowMeasurement
from runner.measure.result import WindowResult
from runner.measure.window import summarize_window
from runner.workload.chat_sessions import build_sessions
from runner.workload.context_mix import load_tokenizer
from runner.workload.conversation import ChatSessions
from tests.conftest import compose
from tests.integration.conftest import CACHED_NAME, TINY_CONTEXT, Server, wait_idle

pytestmark = pytest.mark.integration

USERS = 4


def chat_config(state: str) -> RunConfig:
    return build_config(
        compose(
            [
                "workload=chat_sessions_cpu", "engine.enable_prefix_caching=true",
                # Four turns, so every user restarts a conversation within a window.
                "workload.turns=4", "workload.conversations=8",
                f"workload.prefix_cache={state}",
                "search=fixed", "search.window_s=6", "search.warmup_s=2",
                f"model.served_name={CACHED_NAME}",
            ]
        )
    )  # fmt: skip


def prompt_tokens_total(server: Server) -> float:
    metrics = parse_metrics(httpx.get(f"{server.base_url}/metrics", timeout=30).text)
    assert metrics.prompt_tokens_total is not None
    return metrics.prompt_tokens_total


def turn_of(prompt_id: str) -> int:
    return int(prompt_id.rsplit("-t", 1)[1])


def window(
    server: Server, sessions: ChatSessions, state: str
) -> tuple[WindowMeasurement, WindowResult, float]:
    """One window, its result, and the prompt tokens the engine counted for all of its
    requests (warm-up and drain included)."""
    config = chat_config(state)
    before = prompt_tokens_total(server)
    measurement = collect_window(server, config, sessions, USERS)
    result = summarize_window(
        measurement, run_id="chat", config_id="chat", phase="coarse",
        audit_tolerance_pct=config.slo.audit_tolerance_pct,
        max_loop_lag_ms=config.slo.max_loop_lag_ms,
        min_in_flight_pct=config.slo.min_in_flight_pct,
        prefix_cache=prefix_cache_state(config),
    )  # fmt: skip
    return measurement, result, prompt_tokens_total(server) - before


def test_chat_sessions_reuse_their_history_at_exact_counts(prefix_cached_server) -> None:
    sessions = build_sessions(
        load_tokenizer(prefix_cached_server.model_dir), chat_config("cold").workload, TINY_CONTEXT
    )
    # A single request of the last turn's frozen prompt is counted as the workload says.
    last = sessions[-1]
    answer = httpx.post(
        f"{prefix_cached_server.base_url}/v1/completions",
        json={"model": CACHED_NAME, "prompt": last.token_ids, "max_tokens": 1},
        timeout=60,
    ).json()
    assert answer["usage"]["prompt_tokens"] == last.prompt_tokens == sessions.prompt_tokens(4)

    cold = window(prefix_cached_server, sessions, "cold")
    warm = [window(prefix_cached_server, sessions, "warm") for _ in range(2)]
    for measurement, result, counted in [cold, *warm]:
        assert result.row.valid, result.detail.invalid_reasons
        # Think time is not idleness: every user was in flight outside its pauses.
        assert result.detail.offered_load.thinking_pct > 0
        assert result.row.in_flight_pct >= 97.0
        # Each request's prompt is the history so far with the engine's own answers in
        # it: the engine counted exactly turn k's tokens for every turn-k request.
        turns = [turn_of(record.prompt_id) for record in measurement.records]
        assert counted == sum(sessions.prompt_tokens(turn) for turn in turns)
        # Users join at turns 1..4 and walk on, starting a new conversation after the last.
        for user in range(USERS):
            own = [turn_of(r.prompt_id) for r in measurement.records if r.user == user]
            assert own[0] == 1 + user % sessions.turns
            assert all(b == (a % sessions.turns) + 1 for a, b in pairwise(own)), own
        assert 1 in turns[USERS:], "no user started a new conversation"
    # A cold window starts with nothing cached, yet its own earlier turns (and the
    # shared system prompt) are found: most of every prompt is a hit.
    cold_hits = cold[1].row.prefix_cache_hit_pct
    assert cold[1].detail.prefix_cache == "cold"
    assert cold_hits is not None and cold_hits > 40.0, cold[1].row
    # A warm window also finds what the window before it cached.
    warm_hits = warm[1][1].row.prefix_cache_hit_pct
    assert warm[1][1].detail.prefix_cache == "warm"
    assert warm_hits is not None and warm_hits > cold_hits, warm[1][1].row
    wait_idle(prefix_cached_server.base_url, 120)
