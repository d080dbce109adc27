"""One window's raw data drawn from a serving curve, to check the intervals of
:mod:`runner.measure.uncertainty` against rates that are known.

Each user of :class:`~runner.search.serving.ServingCurve` runs requests back to back
from a random phase: a prefill wait, then 512 tokens one decode step apart. The wait
and the step vary from request to request by mean-one lognormal factors, so a user's
long-run rate is exactly 512 / (mean wait + 512 mean steps), the curve's own figure.
The window sees what runner's client would: per user, each overlapping request's
in-window tokens and seconds, and the tokens generated in each second (the server
counter sampled at 1 Hz).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runner.search.serving import OUTPUT_TOKENS, ServingCurve

WAIT_SPREAD = 0.3  # lognormal sigma of a request's prefill wait
STEP_SPREAD = 0.05  # lognormal sigma of a request's decode step


@dataclass(frozen=True)
class RawWindow:
    """What one simulated window collected, and the truth it estimates."""

    window_s: float
    pieces: list[list[tuple[float, float]]]  # per user: (tokens, seconds) per request
    requests: list[list[tuple[float, float, float]]]  # per user: (tokens, wait, decode)
    deltas: list[float]  # generated tokens per second
    user_deltas: list[list[float]]  # per user: tokens received per second
    true_aggregate_tok_s: float
    true_min_user_tok_s: float

    @property
    def aggregate_tok_s(self) -> float:
        return sum(tokens for user in self.pieces for tokens, _ in user) / self.window_s

    @property
    def min_user_tok_s(self) -> float:
        return min(sum(tokens for tokens, _ in user) for user in self.pieces) / self.window_s


def _mean_one(rng: np.random.Generator, sigma: float, size: int) -> np.ndarray:
    return rng.lognormal(-(sigma**2) / 2, sigma, size)


def simulate_window(
    curve: ServingCurve, users: int, window_s: float, rng: np.random.Generator
) -> RawWindow:
    """One window of ``window_s`` seconds at ``users`` users, in steady state."""
    state = curve.state(users)
    step_s = state.step_ms / 1000
    arrivals: list[np.ndarray] = []
    per_user: list[np.ndarray] = []
    requests: list[list[tuple[float, float, float]]] = []
    pieces: list[list[tuple[float, float]]] = []
    rates = []
    for wait_ms in state.prefill_ms:
        wait_s = wait_ms / 1000
        cycle_s = wait_s + OUTPUT_TOKENS * step_s
        rates.append(OUTPUT_TOKENS / cycle_s)
        start = -rng.uniform(0, cycle_s)
        own: list[tuple[float, float]] = []
        mine: list[np.ndarray] = []
        done: list[tuple[float, float, float]] = []
        while start < window_s:
            wait = wait_s * _mean_one(rng, WAIT_SPREAD, 1)[0]
            step = step_s * _mean_one(rng, STEP_SPREAD, 1)[0]
            times = start + wait + step * np.arange(1, OUTPUT_TOKENS + 1)
            end = times[-1]
            done.append(
                (float(OUTPUT_TOKENS), float(wait + step), float(end - start - wait - step))
            )
            if end >= 0:
                inside = times[(times >= 0) & (times <= window_s)]
                arrivals.append(inside)
                mine.append(inside)
                own.append((float(inside.size), min(end, window_s) - max(start, 0.0)))
            start = end
        pieces.append(own)
        requests.append(done)
        per_user.append(np.concatenate(mine))
    seconds = int(window_s)
    deltas, _ = np.histogram(np.concatenate(arrivals), bins=seconds, range=(0, seconds))
    user_deltas = [
        [float(d) for d in np.histogram(times, bins=seconds, range=(0, seconds))[0]]
        for times in per_user
    ]
    return RawWindow(
        window_s=window_s,
        pieces=pieces,
        deltas=[float(d) for d in deltas],
        user_deltas=user_deltas,
        requests=requests,
        true_aggregate_tok_s=float(sum(rates)),
        true_min_user_tok_s=float(min(rates)),
    )
