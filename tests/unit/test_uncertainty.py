"""A window's 95% intervals, checked against known truth.

:mod:`runner.search.windowsim` draws a window's raw data (each user's tokens per
second, the server's 1 Hz counter) from a serving curve whose long-run rates are
known exactly; nominal 95% intervals must cover them about 95% of the time."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from runner.measure.uncertainty import (
    aggregate_interval,
    rate_interval,
    slowest_user_interval,
)
from runner.search.serving import draw_serving_curve
from runner.search.windowsim import simulate_window

WINDOWS = 300
WINDOW_S = 300.0  # seed 004 §7


def windows() -> list:
    drawn = []
    for seed in range(WINDOWS):
        family = ("decode_bound", "prefill_bound")[seed % 2]
        rng = np.random.default_rng(seed)
        users = int(rng.integers(7, 40))
        drawn.append(simulate_window(draw_serving_curve(family, seed), users, WINDOW_S, rng))
    return drawn


@pytest.fixture(scope="module")
def simulated() -> list:
    return windows()


def request_s(window) -> float:
    """What runner passes: a typical request's dispatch-to-completion time."""
    return statistics.median(wait + decode for user in window.requests for _, wait, decode in user)


def test_aggregate_intervals_cover_the_true_rate_about_95_percent(simulated: list) -> None:
    covered, total = 0, 0
    for window in simulated:
        interval = aggregate_interval(
            window.aggregate_tok_s, window.deltas, request_s=request_s(window)
        )
        if interval is None:
            continue
        total += 1
        covered += interval.low <= window.true_aggregate_tok_s <= interval.high
    assert total >= 0.9 * len(simulated)
    assert 0.90 <= covered / total <= 0.99, covered / total


def test_slowest_user_intervals_cover_the_true_rate_about_95_percent(simulated: list) -> None:
    """The window's slowest user reads low (the minimum of several noisy users);
    the interval carries that back and still covers the true slowest rate."""
    covered, total = 0, 0
    for index, window in enumerate(simulated):
        interval = slowest_user_interval(
            window.user_deltas, request_s=request_s(window), seed=index
        )
        if interval is None:
            continue
        total += 1
        covered += interval.low <= window.true_min_user_tok_s <= interval.high
        # Never an interval that leaves out the window's own figure.
        assert interval.low <= window.min_user_tok_s <= interval.high
    assert total >= 0.9 * len(simulated)
    assert 0.90 <= covered / total <= 0.99, covered / total


def test_a_steady_counter_has_a_tight_interval_and_a_short_window_none() -> None:
    steady = rate_interval([100.0] * 300)
    assert steady is not None and steady.low == pytest.approx(100.0) == steady.high
    assert rate_interval([100.0] * 20) is None  # 20 s: too few 30 s batches
    assert rate_interval([100.0] * 20, request_s=2.0) is not None  # short requests, short batches


def test_the_same_records_give_the_same_interval(simulated: list) -> None:
    """A resumed run recomputes nothing differently."""
    window = simulated[0]
    first = slowest_user_interval(window.user_deltas, request_s=request_s(window), seed=3)
    again = slowest_user_interval(window.user_deltas, request_s=request_s(window), seed=3)
    assert first == again and first is not None


def alike_users(rate: float, users: int, seconds: int, rng: np.random.Generator) -> list:
    """Users of one length class on a CPU engine: 64-token requests streamed at ``rate``
    tok/s after a prefill wait of about a second, each user from its own phase."""
    per_user = []
    for _ in range(users):
        counts = np.zeros(seconds)
        t = -rng.uniform(0, 64 / rate + 1)
        while t < seconds:
            t += rng.uniform(0.5, 1.5)  # waiting for its prefill
            for _ in range(64):
                t += rng.exponential(1 / rate)
                if 0 <= t < seconds:
                    counts[int(t)] += 1
        per_user.append(counts.tolist())
    return per_user


def test_the_slowest_user_is_never_placed_above_the_mean_user() -> None:
    """A 22 s window of 180 alike users holds 4-5 requests each: their rates are noisy,
    and the minimum over them reads far below any one user's long-run rate. The
    reflection of that spread alone put the interval's top near twice the figure
    (a real default run: 16.6 tok/s, interval up to 34.1 with the mean user at 16.7), so
    no window could show a count under the floor and the search walked down one user at
    a time. The top now stops at the mean user's."""
    rng = np.random.default_rng(7)
    deltas = alike_users(14.0, 180, 22, rng)
    interval = slowest_user_interval(deltas, request_s=3.5)
    assert interval is not None
    figure = min(sum(user) for user in deltas) / 22
    mean_user = statistics.fmean(sum(user) for user in deltas) / 22
    assert interval.low <= figure <= interval.high
    assert interval.high <= mean_user * 1.05
    # Every user streams at 14 tok/s, with prefill waits on top: the window can now say
    # that this count misses a 15 tok/s floor, whole interval below it.
    assert interval.high < 15.0
