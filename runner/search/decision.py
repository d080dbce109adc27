"""What the windows decide (seed 004 §9 step 8), for the default floor and each tier.

The default floor's answer is the user count with the highest median aggregate among
those that meet the floor; counts whose aggregates are a draw (95% intervals
overlapping; without intervals, within ``negligible_gain_pct``) go to the larger
count, which serves more users at the same throughput. A tier's answer is the most
users that meet every one of its constraints, with the aggregate there and the
constraint that stops one user more.

Both also state how sure they are: the range of user counts the windows are
consistent with (from the largest count they say meets the constraints to the
largest they do not clearly rule out), and flags for a cliff in the slowest user's
rate and for a curve that bends the wrong way.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from runner.search.evidence import (
    draw,
    find_cliffs,
    merge_cliffs,
    non_monotonic,
    pool_aggregate,
    pooled_rates,
)
from runner.search.params import SearchParams
from runner.search.types import Constraint, Objective, Observation
from runner.search.view import View, group


@dataclass(frozen=True)
class TierDecision:
    """One SLO tier's answer: ``max_users`` meet every constraint, with
    ``median_aggregate_tok_s`` there; ``binding`` is the constraint that stops one
    user more (its label, e.g. "ttft_p99_ms <= 1000 ms"); ``users_range`` the
    counts the windows are consistent with as the boundary."""

    name: str
    max_users: int | None
    median_aggregate_tok_s: float | None
    min_user_tok_s: float | None
    binding: str | None
    users_range: tuple[int, int | None] | None
    windows: int
    reason: str


@dataclass(frozen=True)
class Decision:
    """The chosen user count and the figures behind it (``windows`` of them), the
    boundary range for the default floor, flags, and one answer per tier."""

    best_users: int | None
    median_aggregate_tok_s: float | None
    min_user_tok_s: float | None
    mean_user_tok_s: float | None
    windows: int
    reason: str
    users_range: tuple[int, int | None] | None = None
    flags: tuple[str, ...] = ()
    tiers: tuple[TierDecision, ...] = ()


def decide(history: Sequence[Observation], params: SearchParams) -> Decision:
    """The best user count whose counted windows meet the floor, and the figures
    behind it; with ``params.tiers``, each tier's answer too."""
    tiers = tuple(decide_tier(history, params, tier) for tier in params.tiers)
    flags = tuple(_flags(history, params))
    if params.kind == "fixed":
        view = View(history, params, params.default)
        samples, needed = group(history), 1
        eligible = {
            users: windows
            for users, windows in samples.items()
            if all(view.passes(obs) for obs in windows)
        }
        statistical = False
    else:
        view = View(history, params, params.default)
        eligible, needed = view.eligible(), max(1, params.confirm_repeats)
        statistical = view.statistical
    if not eligible:
        reason = _no_answer_reason(history, params, params.default)
        return Decision(None, None, None, None, 0, reason, None, flags, tiers)
    pooled = {users: pool_aggregate(users, windows) for users, windows in eligible.items()}
    top = max(pooled.values(), key=lambda p: p.estimate)
    best = max(
        users
        for users, aggregate in pooled.items()
        if users == top.users or draw(aggregate, top, params.negligible_gain_pct)
    )
    windows = eligible[best]
    median = pooled[best].estimate
    floor = params.floor_tok_s
    if statistical:
        rule = (
            f"draws with the highest ({top.estimate:.1f} tok/s; their 95% intervals overlap) "
            f"among {len(eligible)} user count(s) with at least {needed} window(s), every one "
            f"valid, that the windows say meet {floor:g} tok/s per user (one-sided 95%)"
        )
    else:
        rule = (
            f"is within {params.negligible_gain_pct:g}% of the highest ({top.estimate:.1f} "
            f"tok/s) among {len(eligible)} user count(s) with at least {needed} window(s), "
            f"every one valid and at or above {floor:g} tok/s per user"
        )
    return Decision(
        best_users=best,
        median_aggregate_tok_s=float(median),
        min_user_tok_s=float(min(obs.min_user_tok_s for obs in windows)),
        mean_user_tok_s=float(median / best),
        windows=len(windows),
        reason=f"{best} users is the largest user count whose median aggregate ({median:.1f} tok/s) {rule}",
        users_range=_users_range(view) if params.kind == "bracket" else None,
        flags=flags,
        tiers=tiers,
    )


def decide_tier(
    history: Sequence[Observation], params: SearchParams, tier: Objective
) -> TierDecision:
    """The most users that meet every constraint of ``tier``, with the figures there."""
    view = View(history, params, tier)
    eligible = (
        view.eligible()
        if params.kind == "bracket"
        else {
            users: windows
            for users, windows in group(history).items()
            if all(view.passes(obs) for obs in windows)
        }
    )
    if not eligible:
        return TierDecision(
            tier.name,
            None,
            None,
            None,
            _binding(view, 0),
            _users_range(view) if params.kind == "bracket" else None,
            0,
            _no_answer_reason(history, params, tier),
        )
    users = max(eligible)
    windows = eligible[users]
    median = statistics.median(obs.aggregate_tok_s for obs in windows)
    binding = _binding(view, users)
    limits = " and ".join(c.label for c in tier.constraints)
    return TierDecision(
        name=tier.name,
        max_users=users,
        median_aggregate_tok_s=float(median),
        min_user_tok_s=float(min(obs.min_user_tok_s for obs in windows)),
        binding=binding,
        users_range=_users_range(view) if params.kind == "bracket" else None,
        windows=len(windows),
        reason=(
            f"{users} users is the most that meet {limits} over {len(windows)} window(s); "
            f"one more is stopped by {binding}"
        ),
    )


def _binding(view: View, users: int) -> str | None:
    """What stops ``users + 1``: the search's ceiling, an OOM, or the constraint with
    the least headroom at the nearest measured count above (at ``users`` itself if
    none was measured)."""
    params = view.params
    if users >= params.max_users:
        return f"max_users ({params.max_users}, the search's ceiling)"
    above = sorted(obs.users for obs in view.history if obs.users > users)
    if params.kind == "fixed" and not above:
        return "the largest user count measured (a fixed search tries nothing above it)"
    if above and any(obs.oom for obs in view.history if obs.users == above[0]):
        return f"out of memory at {above[0]} users"
    reference = next(
        (n for n in above if any(o.valid and not o.oom for o in view.history if o.users == n)),
        users,
    )
    windows = [o for o in view.history if o.users == reference and o.valid and not o.oom]
    if not windows:
        return None

    def headroom(constraint: Constraint) -> float:
        values = [o.value(constraint.metric) for o in windows]
        known = [v for v in values if v is not None]
        if not known:
            return float("-inf")
        value = statistics.median(known)
        if constraint.is_floor:
            return value / constraint.limit - 1
        return 1 - value / constraint.limit

    return min(view.objective.constraints, key=headroom).label


def _users_range(view: View) -> tuple[int, int | None] | None:
    """The boundary's range: from the largest count the windows say meets every
    constraint to the largest they do not clearly rule out. Where no count measured
    misses a constraint (the search stopped where the aggregate stopped rising), the
    boundary lies at or above the low end and the high end is unknown: ``None``."""
    if view.statistical:
        low, high = view.candidate(), view.far_end()
    else:
        eligible = view.eligible()
        low = max(eligible, default=None)
        failing = [
            n for n in view.full_windows if low is not None and n > low and n in view.ruled_out
        ]
        high = min(failing) - 1 if failing else None
    if low is not None and view.first_miss is None:
        return low, None
    if low is None or high is None:
        return None
    return low, max(low, high)


def _flags(history: Sequence[Observation], params: SearchParams) -> list[str]:
    """What the curve does, from full windows alone: the slowest of a few hundred
    users over a 6 s screening window reads lower than over 30 s (fewer tokens each,
    more spread; 14.2 against 16.9-17.1 tok/s at 318-321 users on the CPU engine),
    and set against a full window's it looks like a collapse."""
    view = View(history, params, params.default)
    # The view's windows carry the engine's drift between windows in their intervals,
    # so a jump between two counts no larger than repeats at one count show is no cliff.
    full = [obs for obs in view.history if view.is_full(obs) and obs.valid and not obs.oom]
    rates = pooled_rates(full)
    flags = [
        f"cliff: the slowest user collapses between {cliff.below} and {cliff.above} users "
        f"({cliff.below_tok_s:.2f} -> {cliff.above_tok_s:.2f} tok/s)"
        for cliff in merge_cliffs(find_cliffs(rates))
    ]
    aggregates = {users: pool_aggregate(users, windows) for users, windows in group(full).items()}
    flags += [
        f"non-monotonic: {note}"
        for note in non_monotonic(aggregates, rates, params.negligible_gain_pct)
    ]
    return flags


def _no_answer_reason(
    history: Sequence[Observation], params: SearchParams, objective: Objective
) -> str:
    if not history:
        return "no window has been measured yet"
    limits = " and ".join(c.label for c in objective.constraints)
    if objective.name == "default":
        limits = f"{params.floor_tok_s:g} tok/s per user"
    if params.kind == "bracket" and params.confirm_repeats > 0:
        return (
            f"no user count has {params.confirm_repeats} full-length windows that are all "
            f"valid and at or above {limits}"
            if objective.name == "default"
            else f"no user count has {params.confirm_repeats} full-length windows that are all "
            f"valid and meet {limits}"
        )
    if objective.name == "default":
        return f"no measured user count is valid and at or above {limits}"
    return f"no measured user count is valid and meets {limits}"
