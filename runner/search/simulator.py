"""Seeded throughput curves with a known optimum, to test and cost the search offline.

A :class:`Curve` gives the true aggregate and minimum-user rate at every user count;
:meth:`Curve.measure` adds gaussian noise whose spread grows as the window shortens
(a 60 s window is about sqrt(5) times noisier than a 300 s one). Shapes, each drawn
with seeded parameters so that the optimum lands anywhere, not only on 7 * 2**k:

saturating     aggregate rises towards a ceiling; the floor binds where the mean user
               rate, falling as 1/N, takes the slowest user under it.
kv_cliff       the slowest user collapses once the KV cache overflows; past four times
               that point the engine runs out of memory.
interior_peak  aggregate peaks, then falls as preemption thrashes; the floor binds far
               later, so the optimum is the peak itself.
low_capacity   even 7 users are too many; the search has to halve.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from runner.search.policy import Decision, Observation, SearchParams, Step, decide, next_step
from runner.search.types import Interval

SHAPES = ("saturating", "kv_cliff", "interior_peak", "low_capacity")
REFERENCE_WINDOW_S = 300.0


@dataclass(frozen=True)
class Curve:
    """True figures as a function of the user count."""

    shape: str
    capacity_tok_s: float
    half_users: float
    fairness: float
    cliff_users: int | None = None
    thrash_users: int | None = None
    thrash_pct: float = 0.0
    oom_users: int | None = None
    noise_pct: float = 1.5
    drift_pct: float = 0.0  # the engine's pace between windows, as in serving.ServingCurve

    def aggregate_tok_s(self, users: int) -> float:
        if self.thrash_users is None:
            return self.capacity_tok_s * users / (users + self.half_users)
        # Batching gains until the cache is full, then preemption eats throughput.
        rate = self.capacity_tok_s * min(1.0, users / self.thrash_users) ** 0.7
        if users > self.thrash_users:
            rate *= max(0.1, 1 - self.thrash_pct / 100 * (users - self.thrash_users))
        return rate

    def min_user_tok_s(self, users: int) -> float:
        rate = self.fairness * self.aggregate_tok_s(users) / users
        if self.cliff_users is not None and users > self.cliff_users:
            rate *= max(0.05, 1 - 0.3 * (users - self.cliff_users))
        return rate

    def optimum(self, floor_tok_s: float, max_users: int) -> int | None:
        """The user count with the highest true aggregate whose slowest user meets the floor."""
        meeting = [
            users
            for users in range(1, max_users + 1)
            if self.min_user_tok_s(users) >= floor_tok_s
            and (self.oom_users is None or users < self.oom_users)
        ]
        return max(meeting, key=self.aggregate_tok_s, default=None)

    def measure(
        self,
        users: int,
        window_s: float,
        phase: str,
        rng: np.random.Generator,
        screening: bool = False,
    ) -> Observation:
        """One noisy window; its noise grows as the window shortens (``screening``
        only marks the window as one)."""
        if self.oom_users is not None and users >= self.oom_users:
            return Observation(users, 0.0, 0.0, valid=False, phase=phase, oom=True)
        spread = self.noise_pct / 100 * math.sqrt(REFERENCE_WINDOW_S / window_s)
        aggregate, slowest = 1 + spread * rng.standard_normal(2)
        if self.drift_pct:
            # Both figures move together between windows, unseen by their intervals.
            pace = 1 + self.drift_pct / 100 * rng.standard_normal()
            aggregate, slowest = aggregate * pace, slowest * pace
        aggregate *= self.aggregate_tok_s(users)
        slowest *= self.min_user_tok_s(users)
        return Observation(
            users=users,
            aggregate_tok_s=float(aggregate),
            min_user_tok_s=float(slowest),
            valid=True,
            phase=phase,
            aggregate_ci=Interval.around(aggregate, spread),
            min_user_ci=Interval.around(slowest, spread),
            screening=screening,
        )


def draw_curve(shape: str, seed: int, noise_pct: float = 1.5) -> Curve:
    """A curve of the given shape with parameters drawn from ``seed``."""
    rng = np.random.default_rng([seed, SHAPES.index(shape)])
    if shape == "saturating":
        return Curve(
            shape,
            capacity_tok_s=rng.uniform(500, 800),
            half_users=rng.uniform(3, 8),
            fairness=0.8,
            noise_pct=noise_pct,
        )
    if shape == "kv_cliff":
        cliff = int(rng.integers(10, 61))
        return Curve(
            shape,
            capacity_tok_s=rng.uniform(3000, 5000),
            half_users=rng.uniform(10, 30),
            fairness=0.7,
            cliff_users=cliff,
            oom_users=4 * cliff,
            noise_pct=noise_pct,
        )
    if shape == "interior_peak":
        return Curve(
            shape,
            capacity_tok_s=rng.uniform(2000, 4000),
            half_users=0.0,
            fairness=0.7,
            thrash_users=int(rng.integers(12, 41)),
            thrash_pct=rng.uniform(3, 5),
            noise_pct=noise_pct,
        )
    if shape == "low_capacity":
        return Curve(
            shape,
            capacity_tok_s=rng.uniform(60, 120),
            half_users=rng.uniform(0.5, 1.5),
            fairness=0.8,
            noise_pct=noise_pct,
        )
    raise ValueError(f"unknown curve shape {shape!r}; known: {', '.join(SHAPES)}")


@dataclass
class Trace:
    """One simulated search: what was asked, what was measured, what was chosen."""

    steps: list[Step] = field(default_factory=list)
    history: list[Observation] = field(default_factory=list)
    decision: Decision | None = None


class Measurable(Protocol):
    """A curve the search can be run on: this simulator's shapes or
    :class:`runner.search.serving.ServingCurve`."""

    def measure(
        self,
        users: int,
        window_s: float,
        phase: str,
        rng: np.random.Generator,
        screening: bool = False,
    ) -> Observation: ...


def true_boundary(curve: Measurable, floor_tok_s: float, max_users: int) -> int | None:
    """The most users whose true slowest user meets the floor, below the first count
    that misses it (None when even one user misses it): what a stated range of
    boundaries should hold."""
    users = 0
    while users < max_users and curve.min_user_tok_s(users + 1) >= floor_tok_s:  # type: ignore[attr-defined]
        users += 1
    return users or None


def run_policy(
    curve: Measurable,
    params: SearchParams,
    seed: int,
    policy: Callable[[list[Observation], SearchParams], Step | None] = next_step,
    window_s: float = 300.0,
    screening_window_s: float = 60.0,
    max_windows: int = 500,
    intervals: bool = True,
) -> Trace:
    """Feed ``policy`` with noisy windows from ``curve`` until it stops.

    ``intervals=False`` drops the windows' intervals, as rows written before runner
    measured them have none: the search then runs on its fixed tolerances.
    """
    rng = np.random.default_rng(seed)
    trace = Trace()
    while (step := policy(trace.history, params)) is not None:
        if len(trace.steps) >= max_windows:
            raise RuntimeError(f"the search did not stop within {max_windows} windows")
        length = screening_window_s if step.screening else window_s
        trace.steps.append(step)
        seen = curve.measure(step.users, length, step.phase, rng, screening=step.screening)
        if not intervals:
            seen = replace(seen, aggregate_ci=None, min_user_ci=None)
        trace.history.append(seen)
    trace.decision = decide(trace.history, params)
    return trace
