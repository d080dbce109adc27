"""95% intervals for one window's aggregate and slowest-user rate, from plain values.

A window measures a steady state for a few minutes; its figures are samples of the
long-run rates, and these functions say how far those can lie from them.

aggregate       batch means over the server's generation counter, sampled once a
                second (seed 004 §7): the per-second deltas are split into
                consecutive batches, each batch's rate is one sample, and Student's t
                over the batch rates gives the interval. Per-second deltas are
                correlated (a prefill burst slows several seconds of decoding), so
                single seconds are not independent, but batches several times longer
                than that are close to it; with fewer than four batches there is no
                interval. The client's aggregate gets the same relative half-width.
slowest user    a bootstrap over each user's requests: every request that overlapped
                the window gives its in-window tokens and seconds, each user's rate is
                their ratio, and resampling each user's requests with replacement and
                taking the minimum over users gives the spread of the slowest user's
                rate. The minimum of noisy rates reads low (several users share the
                slowest bucket), so the basic bootstrap interval (reflected about the
                estimate) is used, which carries that bias back the other way. A
                normal approximation on token counts would take each request's tokens
                as independent draws; they are not (512 forced tokens, one prefill
                wait each), and the requests are what varies.

Both are checked against known truth in ``tests/unit/test_uncertainty.py``: over many
simulated windows of a serving curve whose long-run rates are known, the 95% intervals
cover them about 95% of the time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

Z95 = 1.959964  # two-sided 95% of a normal
MIN_BATCHES = 4
# A batch lasts this many typical requests, so that its neighbours are close to
# independent: checked by simulation from 4.5 to 15 requests per window.
BATCH_REQUESTS = 1.5
MAX_BATCHES = 20
RESAMPLES = 2000
# Student's t, 97.5th percentile, by degrees of freedom (batches - 1).
T975 = {
    3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.306, 9: 2.2622,
    10: 2.2281, 11: 2.201, 12: 2.1788, 13: 2.1604, 14: 2.1448, 15: 2.1314,
    16: 2.1199, 17: 2.1098, 18: 2.1009, 19: 2.093,
}  # fmt: skip


@dataclass(frozen=True)
class Interval:
    """A 95% interval ``[low, high]`` around a window's figure."""

    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high

    @classmethod
    def around(cls, value: float, relative_se: float) -> Interval:
        """The 95% interval of a figure whose standard error is ``relative_se`` of it."""
        return cls(float(value * (1 - Z95 * relative_se)), float(value * (1 + Z95 * relative_se)))


def rate_interval(
    deltas: Sequence[float], seconds: Sequence[float] | None = None, request_s: float = 15.0
) -> Interval | None:
    """95% interval of the long-run rate sum(deltas) / sum(seconds) from consecutive
    counter samples (``seconds`` defaults to one per delta), by batch means.

    Each batch lasts at least :data:`BATCH_REQUESTS` times ``request_s`` (a typical
    request, dispatch to completion: the window's median request latency), so that
    a request's prefill and decode mostly fall within one batch and neighbouring
    batches are close to independent. None when the window holds fewer
    than :data:`MIN_BATCHES` such batches.
    """
    split = _batches(deltas, seconds, request_s)
    if split is None:
        return None
    rates, weights = split
    mean = float(np.sum(rates * weights) / weights.sum())
    half = _t_half_width(rates, weights, mean)
    return Interval(mean - half, mean + half)


def aggregate_interval(
    aggregate_tok_s: float,
    deltas: Sequence[float],
    seconds: Sequence[float] | None = None,
    request_s: float = 15.0,
) -> Interval | None:
    """The window's aggregate with the relative half-width that the server counter's
    samples show (:func:`rate_interval`); None without enough samples."""
    server = rate_interval(deltas, seconds, request_s)
    if server is None:
        return None
    centre = (server.low + server.high) / 2
    if centre <= 0:
        return None
    share = server.half_width / centre
    return Interval(aggregate_tok_s * (1 - share), aggregate_tok_s * (1 + share))


def slowest_user_interval(
    user_deltas: Sequence[Sequence[float]],
    seconds: Sequence[float] | None = None,
    request_s: float = 15.0,
    resamples: int = RESAMPLES,
    seed: int = 0,
    user_seconds: Sequence[Sequence[float]] | None = None,
) -> Interval | None:
    """95% interval of the slowest user's long-run rate.

    ``user_deltas[u]`` are the tokens user ``u`` received in each interval of the
    window (one second each unless ``seconds`` says otherwise), from its requests'
    chunk arrival times; the window's figure is the smallest user total over the
    window. Each user's rate gets a batch-means standard error (batches as in
    :func:`rate_interval`, so each holds whole requests and the edges that cut
    them); the slowest user's spread is the spread of the minimum over users drawn
    from those (Student's t), and the basic bootstrap interval carries the low
    reading of a minimum of noisy rates back up. None without enough batches.
    ``seed`` makes it repeatable: a resumed run gets the same interval.
    ``user_seconds`` gives each user intervals of its own (a chat user's seconds
    outside think time) in place of the shared ``seconds``.
    """
    if not user_deltas:
        return None
    means, errors, dof = [], [], None
    for user, deltas in enumerate(user_deltas):
        spans = user_seconds[user] if user_seconds is not None else seconds
        split = _batches(deltas, spans, request_s)
        if split is None:
            return None
        rates, weights = split
        mean = float(np.sum(rates * weights) / weights.sum())
        means.append(mean)
        errors.append(_t_half_width(rates, weights, mean) / T975[len(rates) - 1])
        # Users with intervals of their own may have fewer batches: the fewest counts.
        dof = len(rates) - 1 if dof is None else min(dof, len(rates) - 1)
    assert dof is not None
    estimate = min(means)
    rng = np.random.default_rng(seed)
    draws = np.asarray(means) + np.asarray(errors) * rng.standard_t(dof, (resamples, len(means)))
    low, high = np.percentile(draws.min(axis=1), [2.5, 97.5])
    # No user's long-run rate is below the slowest one's, so the slowest user is never
    # faster than the mean user: the reflection's upper end stops at the mean's. Where
    # users are alike and their rates noisy (a few requests each), the reflection alone
    # reached twice the window's figure and no window could show a count under a floor.
    mean_high = float(np.mean(means)) + T975[dof] * math.sqrt(
        float(np.sum(np.square(errors)))
    ) / len(means)
    # The reflection can move the interval above the window's own figure when the
    # minimum read low; it is widened to hold that figure, so it never contradicts it.
    return Interval(
        max(0.0, min(estimate, 2 * estimate - float(high))),
        max(estimate, min(2 * estimate - float(low), mean_high)),
    )


def _batches(
    deltas: Sequence[float], seconds: Sequence[float] | None, request_s: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """Batch rates and batch lengths, or None with too few batches."""
    counts = np.asarray(deltas, dtype=float)
    spans = np.ones_like(counts) if seconds is None else np.asarray(seconds, dtype=float)
    if counts.shape != spans.shape or counts.size == 0 or np.any(spans <= 0):
        return None
    batch_s = max(BATCH_REQUESTS * request_s, float(spans.max()))
    batches = min(MAX_BATCHES, int(spans.sum() // batch_s), counts.size)
    if batches < MIN_BATCHES:
        return None
    edges = np.linspace(0, counts.size, batches + 1).round().astype(int)
    weights = np.array([spans[a:b].sum() for a, b in pairwise(edges)])
    rates = np.array([counts[a:b].sum() for a, b in pairwise(edges)]) / weights
    return rates, weights


def _t_half_width(rates: np.ndarray, weights: np.ndarray, mean: float) -> float:
    """Student's t half-width of the batch-means estimate (batches of unequal length
    weighted by their length)."""
    batches = len(rates)
    variance = (
        float(np.sum(weights * (rates - mean) ** 2) / weights.sum()) * batches / (batches - 1)
    )
    return T975[batches - 1] * math.sqrt(variance / batches)
