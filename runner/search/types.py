"""The values the search reads and returns: windows as the search sees them, steps,
the constraints of an SLO tier. Plain frozen dataclasses, so a resumed run rebuilds
them from its rows; a window's intervals are :mod:`runner.measure.uncertainty`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runner.measure.uncertainty import Interval

__all__ = ["Constraint", "Interval", "Metric", "Objective", "Observation", "Phase", "Step"]

Phase = Literal["coarse", "refine", "confirm"]
Metric = Literal[
    "min_user_tok_s",
    "ttft_p99_ms",
    "itl_p99_ms",
    "tpot_p99_ms",
    "request_latency_p99_ms",
    "aggregate_tok_s",
]
# The per-user rate is a floor (more is better); every latency is a ceiling.
FLOORS: frozenset[str] = frozenset({"min_user_tok_s"})
UNITS = {"min_user_tok_s": "tok/s"}


@dataclass(frozen=True)
class Observation:
    """One measured window, as the search sees it.

    ``valid`` means no request errors, the client/server audit agreed and the engine
    stayed up; it says nothing about the per-user floor. The latency figures are the
    window's request percentiles (None: not measured, e.g. rows written before runner
    recorded them); the intervals are 95% intervals of the aggregate and of the
    slowest user's rate (None: not known, and the search falls back to fixed
    tolerances and to "every window meets the floor"). ``screening`` marks a short
    screening window (``search.screening_window_s``), in any phase: it steers the
    search but never counts as a full window.
    """

    users: int
    aggregate_tok_s: float
    min_user_tok_s: float
    valid: bool
    phase: str
    oom: bool = False
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    request_latency_p99_ms: float | None = None
    aggregate_ci: Interval | None = None
    min_user_ci: Interval | None = None
    screening: bool = False

    def value(self, metric: Metric) -> float | None:
        value: float | None = getattr(self, metric)
        return value

    def interval(self, metric: Metric) -> Interval | None:
        if metric == "min_user_tok_s":
            return self.min_user_ci
        return self.aggregate_ci if metric == "aggregate_tok_s" else None


@dataclass(frozen=True)
class Step:
    """The next window to measure; ``screening`` allows the shorter screening window."""

    users: int
    phase: Phase
    screening: bool


@dataclass(frozen=True)
class Constraint:
    """One limit of a tier: a floor on the slowest user's rate or a latency ceiling."""

    metric: Metric
    limit: float

    @property
    def is_floor(self) -> bool:
        return self.metric in FLOORS

    @property
    def label(self) -> str:
        unit = UNITS.get(self.metric, "ms")
        return f"{self.metric} {'>=' if self.is_floor else '<='} {self.limit:g} {unit}"

    def met(self, value: float | None, margin: float = 0.0) -> bool:
        """Whether ``value`` meets the limit with a relative safety ``margin``."""
        if value is None:
            return False
        if self.is_floor:
            return value >= self.limit * (1 + margin)
        return value <= self.limit / (1 + margin)

    def clearly_missed(self, obs: Observation) -> bool:
        """The window's whole interval lies beyond the limit; without an interval,
        its figure does."""
        interval = obs.interval(self.metric)
        if interval is None:
            return not self.met(obs.value(self.metric))
        return interval.high < self.limit if self.is_floor else interval.low > self.limit


@dataclass(frozen=True)
class Objective:
    """What one search answers: the default floor (largest aggregate among counts
    meeting it) or an SLO tier (the most users meeting every constraint)."""

    name: str
    constraints: tuple[Constraint, ...]
    goal: Literal["throughput", "users"] = "users"
