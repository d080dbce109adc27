"""Think time in a window (chat sessions): a deliberate pause is not idleness of the
client, and a user's rate is over the seconds it was not pausing."""

from __future__ import annotations

import dataclasses

import pytest

from runner.config import build_config
from runner.errors import ConfigError
from runner.measure.records import MetricsSample, WindowMeasurement
from runner.measure.window import summarize_window
from runner.prepare.validate import validate
from tests.conftest import compose
from tests.unit.test_window import T0, measure, metrics, record, running_waiting

CHAT = ["workload=chat_sessions_cpu", "engine.enable_prefix_caching=true"]


def paused(user: int, dispatched: float, chunks, think: float, finished: float | None = None):
    return dataclasses.replace(
        record(user, dispatched, chunks, finished=finished), think_after_s=think
    )


def test_a_users_think_time_is_not_idleness_and_its_rate_excludes_it() -> None:
    """User 1 answers, pauses 4 s on purpose, asks again: it kept a request in flight
    all the time it was not thinking, so the window is valid; its rate is its tokens
    over the 6 s it was waiting for answers, not over the whole 10 s."""
    records = [
        record(0, 99.0, [(101.0, 10), (109.0, 10)], finished=111.0),
        paused(1, 99.0, [(101.0, 6), (103.0, 6)], think=4.0, finished=103.0),
        paused(1, 107.0, [(108.0, 6), (110.0, 6)], think=2.0, finished=112.0),
    ]
    result = measure(records, 2, server_tokens=44, min_in_flight_pct=97.0)
    load = result.detail.offered_load
    assert result.row.valid, result.detail.invalid_reasons
    assert load.user_in_flight_pct == pytest.approx([100.0, 100.0])
    assert load.thinking_pct == pytest.approx(20.0)  # 4 of user 1's 10 s, 0 of user 0's
    assert load.dispatch_gap_max_ms == pytest.approx(0.0)
    assert result.detail.user_tok_s == [pytest.approx(2.0), pytest.approx(24 / 6)]
    assert result.row.min_user_tok_s == pytest.approx(2.0)
    assert result.row.mean_user_tok_s == pytest.approx(3.0)
    assert result.row.aggregate_output_tok_s == pytest.approx(4.4)  # all tokens, whole window


def test_a_client_late_after_the_think_time_still_invalidates_the_window() -> None:
    """The pause was 2 s, the next request left 1.5 s after it ended: the user was in
    flight 75% of the 6 s it was not thinking."""
    records = [
        paused(0, 99.0, [(101.0, 10)], think=2.0, finished=102.0),
        record(0, 105.5, [(107.0, 10)], finished=111.0),
    ]
    result = measure(records, 1, server_tokens=20, min_in_flight_pct=97.0)
    assert not result.row.valid
    assert result.row.in_flight_pct == pytest.approx(100.0 * 6.5 / 8.0)
    assert result.detail.offered_load.dispatch_gap_max_ms == pytest.approx(1500.0)
    (reason,) = result.detail.invalid_reasons
    assert "outside think time" in reason and "after a completion and its think time" in reason


def test_users_in_think_time_do_not_make_a_window_frontend_bound() -> None:
    """Four users each thinking half the window: the engine holds what was sent at each
    sample (four while they wait, none while they think), as it should; holding two
    while all four wait is a frontend holding the rest back."""
    records = [
        paused(user, 99.0, [(101.0, 10), (105.0, 10)], think=5.0, finished=105.0)
        for user in range(4)
    ]
    held = [
        MetricsSample(at, running_waiting(n, 0)) for at, n in ((101.0, 4), (104.0, 4), (107.0, 0))
    ]
    result = measure(records, 4, server_tokens=80, samples=held, min_in_flight_pct=97.0)
    load = result.detail.offered_load
    assert result.row.valid and load.thinking_pct == pytest.approx(50.0)
    assert load.client_in_flight_mean == pytest.approx(8.0 / 3.0)
    assert not result.detail.frontend_bound
    short = [
        MetricsSample(at, running_waiting(n, 0)) for at, n in ((101.0, 2), (104.0, 2), (107.0, 0))
    ]
    bound = measure(records, 4, server_tokens=80, samples=short, min_in_flight_pct=97.0)
    assert bound.row.valid and bound.detail.frontend_bound


def test_the_slowest_users_interval_is_over_its_seconds_outside_think_time() -> None:
    """A minute of 2 s turns at about 25 tok/s with 1 s pauses: the slowest user's
    interval is around what users see while waiting for answers, well above the
    17 tok/s their tokens make over the whole minute."""
    t1 = T0 + 60.0
    records = []
    for user in range(2):
        at = T0 - 1.0
        while at < t1:
            chunks = [(at + 0.1 * step, 2 + (step + user) % 2) for step in range(1, 21)]
            records.append(paused(user, at, chunks, think=1.0, finished=at + 2.0))
            at += 3.0
    tokens = sum(r.tokens_between(T0, t1) for r in records)
    measurement = WindowMeasurement(
        timestamp_utc="t", users=2, user_buckets=[1000, 1000], window_s=60.0, t0=T0, t1=t1,
        records=records, start=metrics(1000.0), end=metrics(1000.0 + tokens),
    )  # fmt: skip
    result = summarize_window(measurement, run_id="r", config_id="c", phase="confirm",
                              audit_tolerance_pct=1.0)  # fmt: skip
    slowest, interval = result.row.min_user_tok_s, result.detail.min_user_ci
    assert slowest == pytest.approx(25.0, rel=0.03)
    assert interval is not None and interval.low <= slowest <= interval.high
    assert interval.low > 1.2 * result.row.aggregate_output_tok_s / 2


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["workload=chat_sessions_cpu"], "needs engine.enable_prefix_caching=true"),
        ([*CHAT, "workload.ignore_eos=false"], "needs workload.ignore_eos=true"),
        ([*CHAT, "workload.think_time.max_s=4"], "more than half of search.screening_window_s=6"),
        (
            [*CHAT, "workload.system_tokens=2000"],
            "first turn of workload chat_sessions_cpu totals 2128",
        ),
    ],
)
def test_chat_sessions_that_cannot_measure_what_they_claim_are_refused(overrides, says) -> None:
    with pytest.raises(ConfigError, match=says):
        validate(build_config(compose(overrides)))


def test_conversations_longer_than_the_context_restart_early_with_a_warning() -> None:
    config = build_config(compose([*CHAT, "workload.turns=20"]))
    assert config.largest_total == 256 + 14 * 128  # turn 15 would pass the 2,048 served
    (warning,) = validate(config)
    assert "restart after 14 of its 20 turns" in warning
