"""A search's answers as every output shows them: the default floor's and each SLO
tier's, with the 95% intervals at their user count and what they cost.

Pure: built from the search's :class:`~runner.search.decision.Decision`, the windows
it decided on and the hardware profile. The cost figures need a GPU profile: output
tok/s per GPU divides the aggregate by ``hw.count`` (the GPUs the engine uses), and $
per million output tokens divides ``hw.usd_per_hour`` by the output tokens of one
hour. A CPU run (no profile) and a profile without a price have none: ``None``, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runner.config import Hardware
from runner.measure.uncertainty import Interval
from runner.search.decision import Decision, TierDecision
from runner.search.evidence import median_interval
from runner.search.params import DEFAULT, SearchParams
from runner.search.types import Constraint, Objective, Observation
from runner.search.view import View

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6


@dataclass(frozen=True)
class TierAnswer:
    """One objective's answer. ``name`` is ``"default"`` for the default floor (the
    user count with the best aggregate among those meeting it) or a tier's name (the
    most users meeting all its ``limits``). The figures are those of the counted
    windows at ``users``: the median aggregate, the slowest user of all, the worst
    TTFT p99, each interval the 95% one where the windows carry them."""

    name: str
    limits: tuple[Constraint, ...]
    users: int | None
    aggregate_tok_s: float | None
    min_user_tok_s: float | None
    binding: str | None
    users_range: tuple[int, int | None] | None
    windows: int
    reason: str
    ttft_p99_ms: float | None = None
    aggregate_ci: Interval | None = None
    min_user_ci: Interval | None = None
    tok_s_per_gpu: float | None = None
    tok_s_per_gpu_ci: Interval | None = None
    usd_per_mtok: float | None = None
    usd_per_mtok_ci: Interval | None = None

    @property
    def limit_labels(self) -> str:
        return " and ".join(limit.label for limit in self.limits)


@dataclass(frozen=True)
class Capacity:
    """Every answer of one search, the default floor's first, and how sure it is:
    ``flags`` name a cliff in the slowest user's rate or a curve that bends the wrong
    way. ``gpus`` and ``usd_per_hour`` are what the cost figures were computed from."""

    answers: tuple[TierAnswer, ...]
    flags: tuple[str, ...] = ()
    gpus: int | None = None
    usd_per_hour: float | None = None

    @property
    def default(self) -> TierAnswer:
        return self.answers[0]

    @property
    def tiers(self) -> tuple[TierAnswer, ...]:
        """The SLO tiers' answers, in the order configured; empty without tiers."""
        return self.answers[1:]

    @property
    def users_range(self) -> tuple[int, int | None] | None:
        """The default floor's boundary: the user counts the windows are consistent with."""
        return self.default.users_range


def tok_s_per_gpu(aggregate_tok_s: float | None, gpus: int | None) -> float | None:
    """Output tok/s per GPU the engine uses; None without a figure or a GPU count."""
    if aggregate_tok_s is None or gpus is None:
        return None
    return aggregate_tok_s / gpus


def usd_per_mtok(aggregate_tok_s: float | None, usd_per_hour: float | None) -> float | None:
    """US dollars per million output tokens at ``aggregate_tok_s`` for the whole box;
    None without a price, or where nothing was generated."""
    if aggregate_tok_s is None or usd_per_hour is None or aggregate_tok_s <= 0:
        return None
    return usd_per_hour / (aggregate_tok_s * SECONDS_PER_HOUR / TOKENS_PER_MILLION)


def capacity_answer(
    decision: Decision,
    history: Sequence[Observation],
    params: SearchParams,
    hw: Hardware | None,
) -> Capacity:
    """The default floor's answer, then one per tier, with intervals and cost."""
    gpus = hw.count if hw is not None else None
    price = hw.usd_per_hour if hw is not None else None
    default = TierDecision(
        name=DEFAULT,
        max_users=decision.best_users,
        median_aggregate_tok_s=decision.median_aggregate_tok_s,
        min_user_tok_s=decision.min_user_tok_s,
        binding=None,  # the floor's answer is the best aggregate, not the most users
        users_range=decision.users_range,
        windows=decision.windows,
        reason=decision.reason,
    )
    objectives = {objective.name: objective for objective in params.objectives}
    answers = tuple(
        _answer(tier, objectives[tier.name], history, params, gpus, price)
        for tier in (default, *decision.tiers)
    )
    return Capacity(answers=answers, flags=decision.flags, gpus=gpus, usd_per_hour=price)


def _answer(
    tier: TierDecision,
    objective: Objective,
    history: Sequence[Observation],
    params: SearchParams,
    gpus: int | None,
    price: float | None,
) -> TierAnswer:
    users, aggregate = tier.max_users, tier.median_aggregate_tok_s
    windows = _counted(history, params, objective, users)
    # The interval of the figure reported, the windows' median, centred on it.
    aggregate_ci = median_interval(windows) if users else None
    slowest = min(windows, key=lambda obs: obs.min_user_tok_s, default=None)
    ttfts = [obs.ttft_p99_ms for obs in windows if obs.ttft_p99_ms is not None]
    return TierAnswer(
        name=tier.name,
        limits=objective.constraints,
        users=users,
        aggregate_tok_s=aggregate,
        min_user_tok_s=tier.min_user_tok_s,
        binding=tier.binding,
        users_range=tier.users_range,
        windows=tier.windows,
        reason=tier.reason,
        ttft_p99_ms=max(ttfts) if ttfts else None,
        aggregate_ci=aggregate_ci,
        min_user_ci=slowest.min_user_ci if slowest is not None else None,
        tok_s_per_gpu=tok_s_per_gpu(aggregate, gpus),
        tok_s_per_gpu_ci=_scaled(aggregate_ci, gpus),
        usd_per_mtok=usd_per_mtok(aggregate, price),
        usd_per_mtok_ci=_priced(aggregate_ci, price),
    )


def _counted(
    history: Sequence[Observation], params: SearchParams, objective: Objective, users: int | None
) -> list[Observation]:
    """The windows an answer at ``users`` stands on: full-length ones, valid, no OOM."""
    if users is None:
        return []
    windows = View(history, params, objective).full_windows.get(users, [])
    return [obs for obs in windows if obs.valid and not obs.oom]


def _scaled(interval: Interval | None, gpus: int | None) -> Interval | None:
    if interval is None or gpus is None:
        return None
    return Interval(interval.low / gpus, interval.high / gpus)


def _priced(interval: Interval | None, price: float | None) -> Interval | None:
    """The price interval of an aggregate interval: more tokens, cheaper ones."""
    if interval is None or price is None:
        return None
    low, high = usd_per_mtok(interval.high, price), usd_per_mtok(interval.low, price)
    if low is None or high is None:
        return None
    return Interval(low, high)
