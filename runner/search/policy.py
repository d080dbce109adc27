"""The concurrency search policy (seed 004 §9): which user count to measure next.

The run loop calls :func:`next_step` with every window measured so far, measures the
:class:`Step` it returns, and stops at ``None``; :func:`decide` then names the best
user count. Every choice is derived from the history alone (no hidden state), so a
resumed run that replays its JSONL rows gets exactly the step it would have got.

coarse   ``start_users`` (7: every bucket represented), doubling until the first
         failure, an OOM, two windows in a row with negligible aggregate gain, or
         ``max_users``; if 7 fails, halving until one passes (if 1 user fails there
         is no answer). Only coarse windows may be short screening windows.
refine   the boundary between the last pass and the first fail, found by
         interpolation on the per-user rate with bisection as a safeguard (skipped
         when the last pass is already clearly below the best aggregate: with one
         peak nothing past it can win); a search for an aggregate peak that lies
         between measured points; then every integer within ``neighbourhood`` of the
         peak and of the boundary that has no full-length window yet (above the
         boundary only, when throughput still rises into it).
confirm  the provisional best and its two neighbours until each has
         ``confirm_repeats`` full-length windows, earlier full-length windows at the
         same user count included. A neighbour clearly behind the best is not
         repeated; a full window under the floor rules a user count out and
         reopens the search below it.

Coarse and refine steps pass at ``floor + coarse_margin_tok_s``; a window under the
floor itself, not valid, or out of memory fails. The decision takes the largest user
count whose median aggregate is within ``negligible_gain_pct`` of the highest among
those whose every full window meets the floor.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from runner.config import SLO, FixedSearch, Search

Phase = Literal["coarse", "refine", "confirm"]


@dataclass(frozen=True)
class Observation:
    """One measured window, as the search sees it.

    ``valid`` means no request errors, the client/server audit agreed and the engine
    stayed up; it says nothing about the per-user floor.
    """

    users: int
    aggregate_tok_s: float
    min_user_tok_s: float
    valid: bool
    phase: str
    oom: bool = False


@dataclass(frozen=True)
class Step:
    """The next window to measure; ``screening`` allows the shorter screening window."""

    users: int
    phase: Phase
    screening: bool


@dataclass(frozen=True)
class SearchParams:
    """The knobs of the search, with the floors already resolved."""

    kind: Literal["bracket", "fixed"] = "bracket"
    users: tuple[int, ...] = ()
    start_users: int = 7
    max_users: int = 1024
    floor_tok_s: float = 15.0
    coarse_margin_tok_s: float = 0.5
    negligible_gain_pct: float = 2.0
    confirm_repeats: int = 3
    neighbourhood: int = 2
    screening: bool = False

    @property
    def coarse_floor_tok_s(self) -> float:
        return self.floor_tok_s + self.coarse_margin_tok_s

    @classmethod
    def from_config(cls, search: Search, slo: SLO) -> SearchParams:
        if isinstance(search, FixedSearch):
            return cls(kind="fixed", users=tuple(search.users), floor_tok_s=slo.min_user_tok_s)
        return cls(
            kind="bracket",
            start_users=search.start_users,
            max_users=search.max_users,
            floor_tok_s=slo.min_user_tok_s,
            coarse_margin_tok_s=search.coarse_margin_tok_s,
            negligible_gain_pct=search.negligible_gain_pct,
            confirm_repeats=search.confirm_repeats,
            neighbourhood=search.neighbourhood,
            screening=search.screening_window_s is not None,
        )


@dataclass(frozen=True)
class Decision:
    """The chosen user count and the figures behind it (``windows`` of them)."""

    best_users: int | None
    median_aggregate_tok_s: float | None
    min_user_tok_s: float | None
    mean_user_tok_s: float | None
    windows: int
    reason: str


@dataclass(frozen=True)
class _Point:
    """What the coarse and refine windows say about one user count."""

    users: int
    aggregate_tok_s: float
    min_user_tok_s: float
    passed: bool
    ruled_out: bool
    full: bool


def next_step(history: Sequence[Observation], params: SearchParams) -> Step | None:
    """The next window to measure, or ``None`` when the search is over."""
    if params.kind == "fixed":
        # Counting windows rather than user counts lets a list repeat a user count.
        if len(history) < len(params.users):
            return Step(params.users[len(history)], "coarse", screening=False)
        return None
    coarse = [obs for obs in history if obs.phase == "coarse"]
    step = _coarse_step(coarse, params)
    if step is not None:
        return step
    points = _points(history, params)
    return _refine_step(points, history, params) or _confirm_step(history, points, params)


def decide(history: Sequence[Observation], params: SearchParams) -> Decision:
    """The best user count whose every counted window meets the floor (seed 004 §9
    step 8), and the figures behind it."""
    if params.kind == "fixed":
        samples, needed = _group(history), 1
    else:
        samples, needed = _full_windows(history, params), max(1, params.confirm_repeats)
    eligible = {
        users: windows
        for users, windows in samples.items()
        if len(windows) >= needed and _all_pass(windows, params.floor_tok_s)
    }
    if not eligible:
        return Decision(None, None, None, None, 0, _no_answer_reason(history, params))
    # Medians closer than the negligible gain are a draw that window noise decided;
    # the larger user count serves more users at the same throughput.
    top = max(_median(windows) for windows in eligible.values())
    best = max(
        users
        for users, windows in eligible.items()
        if _median(windows) >= top * (1 - _tolerance(params))
    )
    windows = eligible[best]
    median = _median(windows)
    return Decision(
        best_users=best,
        median_aggregate_tok_s=float(median),
        min_user_tok_s=float(min(obs.min_user_tok_s for obs in windows)),
        mean_user_tok_s=float(median / best),
        windows=len(windows),
        reason=(
            f"{best} users is the largest user count whose median aggregate "
            f"({median:.1f} tok/s) is within {params.negligible_gain_pct:g}% of the highest "
            f"({top:.1f} tok/s) among {len(eligible)} user count(s) with at least {needed} "
            f"window(s), every one valid and at or above {params.floor_tok_s:g} tok/s per user"
        ),
    )


def _coarse_step(coarse: Sequence[Observation], params: SearchParams) -> Step | None:
    if not coarse:
        return Step(min(params.start_users, params.max_users), "coarse", params.screening)
    floor = params.coarse_floor_tok_s
    last = coarse[-1]
    if not _passes(coarse[0], floor):
        if _passes(last, floor) or last.users <= 1:
            return None
        return Step(max(1, last.users // 2), "coarse", params.screening)
    if not _passes(last, floor) or last.users >= params.max_users or _saturated(coarse, params):
        return None
    return Step(min(2 * last.users, params.max_users), "coarse", params.screening)


def _saturated(coarse: Sequence[Observation], params: SearchParams) -> bool:
    """Two windows in a row that improved on the best earlier aggregate by less than
    ``negligible_gain_pct``."""
    aggregates = [obs.aggregate_tok_s for obs in coarse]
    if len(aggregates) < 3:
        return False

    def negligible(index: int) -> bool:
        best = max(aggregates[:index])
        return best > 0 and (aggregates[index] - best) / best * 100 < params.negligible_gain_pct

    return negligible(len(aggregates) - 1) and negligible(len(aggregates) - 2)


def _refine_step(
    points: dict[int, _Point], history: Sequence[Observation], params: SearchParams
) -> Step | None:
    lo = max((users for users, point in points.items() if point.passed), default=0)
    hi = min((users for users in points if users > lo), default=None)
    if lo == 0:
        # Full windows overturned every coarse pass: keep halving, down to 1 user.
        if hi is not None and hi > 1:
            return Step(hi // 2, "refine", screening=False)
        return None
    if hi is None and lo < params.max_users and not _all_pass(
        (obs for obs in history if obs.phase == "coarse"), params.coarse_floor_tok_s
    ):
        # The failure that ended the doubling was a screening window that full
        # windows have since overturned: the ceiling is still to be found.
        return Step(min(2 * lo, params.max_users), "refine", screening=False)
    top = max(point.aggregate_tok_s for point in points.values() if point.passed)
    # With one peak, a last pass clearly below the best aggregate means everything
    # between it and the first fail is lower still: the boundary cannot hold the best.
    boundary_matters = hi is not None and points[lo].aggregate_tok_s >= top * (
        1 - 2 * _tolerance(params)
    )
    if boundary_matters and hi is not None and hi - lo > 1:
        refined = [obs for obs in history if obs.phase == "refine"]
        return Step(_split(points, lo, hi, refined, params), "refine", screening=False)
    peak, at_edge = _provisional_best(points, params) or (lo, True)
    if not points[peak].full:
        # A screening window is too noisy to steer the peak search on its own.
        return Step(peak, "refine", screening=False)
    radius = params.neighbourhood
    if at_edge:
        # Throughput still rises into the floor: below the edge is lower, and the
        # confirmation measures the edge's lower neighbour anyway.
        around = set(range(peak + 1, peak + radius + 1))
    else:
        probe = _peak_probe(points, peak, params)
        if probe is not None:
            return Step(probe, "refine", screening=False)
        around = set(range(peak - radius, peak + radius + 1))
        if boundary_matters:
            around |= set(range(lo - radius, lo + radius + 1))
    # Users only get slower as users are added, so nothing above a full window under
    # the floor itself can pass; a window that missed only the margin proves less.
    ceiling = min(
        (users for users, point in points.items() if point.ruled_out),
        default=params.max_users,
    )
    unmeasured = [
        users
        for users in around
        if 1 <= users <= min(ceiling, params.max_users)
        and not (users in points and points[users].full)
    ]
    if unmeasured:
        return Step(min(unmeasured, key=lambda users: (abs(users - peak), users)), "refine", False)
    return None


def _split(
    points: dict[int, _Point],
    lo: int,
    hi: int,
    refined: Sequence[Observation],
    params: SearchParams,
) -> int:
    """Where to measure inside the bracket (lo passes, hi fails, hi - lo > 1).

    The per-user rate falls roughly as 1/users once throughput saturates, so the
    crossing of the coarse floor is interpolated linearly in 1/min_user_tok_s; this
    usually lands next to the boundary in one window where bisection needs four or
    five. Bisection takes over when hi has no usable rate (OOM, invalid) and when the
    last two refine windows fell on the same side, which is how interpolation stalls
    against a cliff.
    """
    middle = (lo + hi) // 2
    floor = params.coarse_floor_tok_s
    rate_lo, rate_hi = points[lo].min_user_tok_s, points[hi].min_user_tok_s
    last_two = [_passes(obs, floor) for obs in refined[-2:]]
    if not rate_lo > floor > rate_hi > 0 or (len(last_two) == 2 and len(set(last_two)) == 1):
        return middle
    share = (1 / floor - 1 / rate_lo) / (1 / rate_hi - 1 / rate_lo)
    return min(hi - 1, max(lo + 1, math.floor(lo + share * (hi - lo))))


def _peak_probe(points: dict[int, _Point], peak: int, params: SearchParams) -> int | None:
    """A user count between the peak and a measured neighbour too far away for the
    neighbourhood scan to reach; halving the wider gap closes in on a single peak.
    """
    left = max((users for users in points if users < peak), default=0)
    right = min((users for users in points if users > peak), default=peak)
    reach = params.neighbourhood + 1
    if peak - left <= reach and right - peak <= reach:
        return None
    if peak - left >= right - peak:
        return (left + peak) // 2
    return (peak + right) // 2


def _confirm_step(
    history: Sequence[Observation], points: dict[int, _Point], params: SearchParams
) -> Step | None:
    if params.confirm_repeats == 0:
        return None
    provisional = _provisional_best(points, params)
    if provisional is None:
        return None
    best = provisional[0]
    full_windows = _full_windows(history, params)
    for users in (best, best - 1, best + 1):
        if not 1 <= users <= params.max_users:
            continue
        point = points.get(users)
        if point is not None and (point.ruled_out or _clearly_below(point, points[best], params)):
            continue
        if len(full_windows.get(users, [])) < params.confirm_repeats:
            return Step(users, "confirm", screening=False)
    return None


def _clearly_below(point: _Point, best: _Point, params: SearchParams) -> bool:
    """A neighbour whose full window trails the best by more than twice the negligible
    gain cannot take its place; repeating it would only spend engine time."""
    return point.full and point.aggregate_tok_s < best.aggregate_tok_s * (
        1 - 2 * _tolerance(params)
    )


def _points(history: Sequence[Observation], params: SearchParams) -> dict[int, _Point]:
    """What the windows say about each user count.

    Aggregate and rate come from the coarse and refine windows, full-length ones
    outranking screening ones, so that confirmation repeats do not move the
    provisional best about. A full-length window of any phase under the floor itself
    rules its user count out for good, which reopens the refine search below it.
    """
    searched = _group(obs for obs in history if obs.phase != "confirm")
    full_windows = _full_windows(history, params)
    ruled_out = {
        users
        for users, windows in full_windows.items()
        if not _all_pass(windows, params.floor_tok_s)
    }
    points = {}
    for users in searched.keys() | ruled_out:
        windows = searched.get(users) or full_windows[users]
        counted = [obs for obs in windows if _is_full(obs, params)] or windows
        points[users] = _Point(
            users=users,
            aggregate_tok_s=statistics.fmean(obs.aggregate_tok_s for obs in counted),
            min_user_tok_s=statistics.fmean(obs.min_user_tok_s for obs in counted),
            passed=users not in ruled_out and _all_pass(counted, params.coarse_floor_tok_s),
            ruled_out=users in ruled_out,
            full=users in full_windows,
        )
    return points


def _provisional_best(points: dict[int, _Point], params: SearchParams) -> tuple[int, bool] | None:
    """The best user count so far, and whether it is the edge of what passes.

    The edge (the largest passing count, right under a failure or at ``max_users``)
    is preferred unless the highest aggregate beats everything within
    ``neighbourhood`` users of the edge by more than the negligible gain: when
    throughput is still rising at the floor, as it usually is, an arg max below the
    edge is window noise, and following it sends the search on a walk. A peak
    clearly above the edge's neighbourhood is followed (preemption thrash).
    """
    passing = [point for point in points.values() if point.passed]
    if not passing:
        return None
    peak = max(passing, key=lambda point: (point.aggregate_tok_s, -point.users))
    edge = max(passing, key=lambda point: point.users)
    bounded = edge.users >= params.max_users or any(users > edge.users for users in points)
    near_edge = max(
        point.aggregate_tok_s
        for point in passing
        if point.users >= edge.users - params.neighbourhood
    )
    if bounded and near_edge >= peak.aggregate_tok_s * (1 - _tolerance(params)):
        return edge.users, True
    return peak.users, False


def _tolerance(params: SearchParams) -> float:
    return params.negligible_gain_pct / 100


def _full_windows(
    history: Sequence[Observation], params: SearchParams
) -> dict[int, list[Observation]]:
    return _group(obs for obs in history if _is_full(obs, params))


def _group(history: Iterable[Observation]) -> dict[int, list[Observation]]:
    grouped: dict[int, list[Observation]] = {}
    for obs in history:
        grouped.setdefault(obs.users, []).append(obs)
    return grouped


def _is_full(obs: Observation, params: SearchParams) -> bool:
    return obs.phase != "coarse" or not params.screening


def _passes(obs: Observation, floor_tok_s: float) -> bool:
    return obs.valid and not obs.oom and obs.min_user_tok_s >= floor_tok_s


def _all_pass(windows: Iterable[Observation], floor_tok_s: float) -> bool:
    return all(_passes(obs, floor_tok_s) for obs in windows)


def _median(windows: Sequence[Observation]) -> float:
    return statistics.median(obs.aggregate_tok_s for obs in windows)


def _no_answer_reason(history: Sequence[Observation], params: SearchParams) -> str:
    if not history:
        return "no window has been measured yet"
    if params.kind == "bracket" and params.confirm_repeats > 0:
        return (
            f"no user count has {params.confirm_repeats} full-length windows that are all "
            f"valid and at or above {params.floor_tok_s:g} tok/s per user"
        )
    return f"no measured user count is valid and at or above {params.floor_tok_s:g} tok/s"
