"""One objective's reading of the windows: which pass, which are ruled out, which
counts the evidence says meet every constraint.

The same windows serve every objective (the default floor and each SLO tier); a
:class:`View` applies one objective's constraints to them. Where every window near
a count carries intervals, "meets the floor" is a one-sided 95% claim about the
count, read off a local fit through the nearby windows
(:func:`runner.search.evidence.local_fit`); without intervals it is seed 004 §9.8's
"every window at the count meets it".
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from runner.search.evidence import (
    FIT_SPAN,
    Z_ONE_SIDED,
    Cliff,
    Pooled,
    drift,
    find_cliffs,
    has_intervals,
    local_fit,
    pool_aggregate,
    pooled_rates,
    relative_se,
    widen,
)
from runner.search.params import SearchParams
from runner.search.types import Constraint, Metric, Objective, Observation

# Residuals this much wider than the windows' intervals allow mean the curve is not
# smooth at this scale (the buckets' users join one at a time, a long-context user
# costing more than a short one).
SMOOTH_SCATTER = 2.0


@dataclass(frozen=True)
class Point:
    """What the coarse and refine windows say about one user count."""

    users: int
    aggregate_tok_s: float
    min_user_tok_s: float
    passed: bool
    ruled_out: bool
    full: bool
    aggregate: Pooled


class View:
    """``objective``'s reading of ``history`` (computed once, on demand)."""

    def __init__(
        self, history: Sequence[Observation], params: SearchParams, objective: Objective
    ) -> None:
        self.params = params
        self.objective = objective
        self.history = with_drift(history, self.is_full)
        self._meets_cache: dict[tuple[int, float], bool] = {}

    # -- single windows -------------------------------------------------------------
    def passes(self, obs: Observation, coarse: bool = False) -> bool:
        """Valid, no OOM, and every constraint met (coarse: with the safety margin)."""
        if not obs.valid or obs.oom:
            return False
        return all(self._met(constraint, obs, coarse) for constraint in self.objective.constraints)

    def _met(self, constraint: Constraint, obs: Observation, coarse: bool) -> bool:
        value = obs.value(constraint.metric)
        if value is None:
            return False
        limit = self.params.coarse_limit(constraint) if coarse else constraint.limit
        return value >= limit if constraint.is_floor else value <= limit

    def all_pass(self, windows: Iterable[Observation], coarse: bool = False) -> bool:
        return all(self.passes(obs, coarse) for obs in windows)

    def is_full(self, obs: Observation) -> bool:
        """A full-length window. Rows written before windows recorded ``screening``
        say it by their phase: then only the doubling screened."""
        return not obs.screening and (obs.phase != "coarse" or not self.params.screening)

    # -- groups -----------------------------------------------------------------------
    @cached_property
    def full_windows(self) -> dict[int, list[Observation]]:
        return group(obs for obs in self.history if self.is_full(obs))

    @cached_property
    def statistical(self) -> bool:
        """The full windows this objective rests on carry slowest-user intervals:
        decide on evidence, not on every single window."""
        return self._has_intervals("min_user_tok_s")

    def _has_intervals(self, metric: Metric) -> bool:
        """Every full window that meets this objective's constraints outright carries
        an interval for ``metric``, and some full window does.

        A window without an interval that misses a constraint (or is invalid) rules
        its count out under either reading, so it asks for none: the batch tier's
        window far past the others' boundaries, its requests too long for an interval,
        does not take the intervals away from every other tier's decision.
        """
        full = [obs for windows in self.full_windows.values() for obs in windows]
        resting = [obs for obs in full if obs.interval(metric) is not None or self.passes(obs)]
        return has_intervals(resting, metric)

    @cached_property
    def ruled_out(self) -> set[int]:
        """Counts with a full window that misses a constraint: outright without
        intervals, beyond its interval with them."""
        out = set()
        for users, windows in self.full_windows.items():
            for obs in windows:
                if not obs.valid or obs.oom:
                    out.add(users)
                elif self.statistical:
                    if any(c.clearly_missed(obs) for c in self.objective.constraints):
                        out.add(users)
                elif not self.passes(obs):
                    out.add(users)
        return out

    @cached_property
    def rates(self) -> dict[int, Pooled]:
        """The slowest user's rate per count, from full windows and, above the last
        of them, screening windows (where the doubling meets a collapse, as a KV cache
        that overflows). Among full windows a screening window is left out: over 6 s
        the slowest of a few hundred users reads far lower than over 30 s (10.6 tok/s
        at 360 users on the CPU engine, 14.9-17.1 in the 30 s windows round it), and
        set against them it looks like a collapse."""
        top = max(self.full_windows, default=0)
        return pooled_rates(
            obs for obs in self.history if self.is_full(obs) or obs.users > top
        )

    @cached_property
    def cliffs(self) -> list[Cliff]:
        return find_cliffs(self.rates)

    @cached_property
    def ceiling(self) -> int:
        """No count above this can meet the constraints: the search's ceiling, the
        first ruled-out count, the count past which the slowest user collapsed under
        the floor."""
        ceiling = self.params.max_users
        if self.ruled_out:
            ceiling = min(ceiling, min(self.ruled_out) - 1)
        floors = [c for c in self.objective.constraints if c.is_floor]
        for cliff in self.cliffs:
            if floors and cliff.above_tok_s < min(c.limit for c in floors):
                ceiling = min(ceiling, cliff.above - 1)
        return ceiling

    @cached_property
    def points(self) -> dict[int, Point]:
        """What the windows say about each user count, for steering.

        Aggregate and rate come from the coarse and refine windows, full-length ones
        outranking screening ones, so that confirmation repeats do not move the
        provisional best about. A ruled-out count stays ruled out, which reopens the
        refine search below it.
        """
        searched = group(obs for obs in self.history if obs.phase != "confirm")
        points = {}
        for users in searched.keys() | self.ruled_out:
            windows = searched.get(users) or self.full_windows[users]
            counted = [obs for obs in windows if self.is_full(obs)] or windows
            if self.statistical and users in self.full_windows:
                # Full windows steer on the limits themselves: the evidence, not a
                # margin, decides, and the margin would hide the boundary's last users.
                passed = self._pooled_meets(self.full_windows[users])
            else:
                passed = self.all_pass(counted, coarse=True)
            points[users] = Point(
                users=users,
                aggregate_tok_s=statistics.fmean(obs.aggregate_tok_s for obs in counted),
                min_user_tok_s=statistics.fmean(obs.min_user_tok_s for obs in counted),
                # Above the first ruled-out count nothing meets the constraints
                # (:attr:`ceiling`), however its own windows look: the search steers by
                # what the decision will accept.
                passed=users <= self.ceiling and users not in self.ruled_out and passed,
                ruled_out=users in self.ruled_out,
                full=users in self.full_windows,
                # With intervals every full window narrows the count's interval;
                # confirmation repeats included, a draw is told from a real gap.
                aggregate=pool_aggregate(
                    users,
                    self.full_windows[users]
                    if self.statistical and users in self.full_windows
                    else counted,
                    median=False,
                ),
            )
        return points

    # -- the evidence about a count ---------------------------------------------------
    @cached_property
    def measured(self) -> list[int]:
        """Counts with a valid window, ascending."""
        return sorted({obs.users for obs in self.history if obs.valid and not obs.oom})

    def supported(self, users: int) -> bool:
        """A fit may speak for ``users``: it was measured, or measured counts lie on
        both sides of it within the fit's span and on its side of every cliff. The
        search never extrapolates past what it measured. Where the fit reads the
        slowest user's rate, only windows that carry its interval count: a window
        without one (requests too long for the window) does not inform the fit, and
        the batch tier's windows at 512 users left a fit at 510 to run on from 382."""
        windows = self._fit_windows(users)
        if users in {obs.users for obs in windows}:
            return True
        if self.statistical and any(c.is_floor for c in self.objective.constraints):
            windows = [obs for obs in windows if obs.min_user_ci is not None]
        nearby = {obs.users for obs in windows}
        below = any(users / FIT_SPAN < n < users for n in nearby)
        above = any(users < n < users * FIT_SPAN for n in nearby)
        return below and above

    def meets(self, users: int, z: float = Z_ONE_SIDED) -> bool:
        """Whether the windows say ``users`` meets every constraint.

        ``z`` standard errors of caution: positive asks the one-sided 95% claim,
        negative asks only that the count is not clearly beyond a limit (used for the
        far end of the boundary's range).
        """
        if users > self.ceiling or users < 1:
            return False
        key = (users, z)
        if key not in self._meets_cache:
            self._meets_cache[key] = all(
                self._meets(constraint, users, z) for constraint in self.objective.constraints
            )
        return self._meets_cache[key]

    def _meets(self, constraint: Constraint, users: int, z: float) -> bool:
        if self.statistical and self._has_intervals(constraint.metric):
            return self._fit_meets(constraint, users, z) is True
        windows = self.full_windows.get(users, [])
        return bool(windows) and all(
            constraint.met(obs.value(constraint.metric)) for obs in windows
        )

    def _fit_meets(self, constraint: Constraint, users: int, z: float) -> bool | None:
        """Whether a local fit at ``users``, ``z`` standard errors towards caution, is
        within ``constraint``'s limit; None where no fit can be drawn. Windows without
        an interval (a screening window too short for one) are left out of the fit."""
        fit = local_fit(self._fit_windows(users), constraint.metric, users)
        if fit is None:
            return None
        if constraint.is_floor:
            return fit.bound(-z) >= constraint.limit
        return fit.bound(z) <= constraint.limit

    def _fit_windows(self, users: int) -> list[Observation]:
        """Valid windows on ``users``'s side of every cliff."""
        low, high = 1, self.params.max_users
        for cliff in self.cliffs:
            if users < cliff.above:
                high = min(high, cliff.above - 1)
            else:
                low = max(low, cliff.above)
        return [
            obs for obs in self.history if obs.valid and not obs.oom and low <= obs.users <= high
        ]

    def eligible(self) -> dict[int, list[Observation]]:
        """Counts the evidence says meet every constraint, with enough of it
        (:meth:`confirmed`; seed 004 §9.8)."""
        # With intervals, nothing at or above a count whose own windows miss a limit
        # is claimed to meet it, however the neighbours pull the fit.
        cap = (self.first_miss or self.params.max_users + 1) if self.statistical else None
        return {
            users: windows
            for users, windows in self.full_windows.items()
            if users not in self.ruled_out
            and (cap is None or users < cap)
            and self.meets(users)
            and self.confirmed(users)
        }

    def confirmed(self, users: int) -> bool:
        """Enough evidence about ``users``: ``confirm_repeats`` full windows at it
        (seed 004 §9.7), or with intervals, at least one there and a fit as narrow as
        ``confirm_repeats`` windows would give. The fit counts the windows at the
        neighbouring counts too, which is what re-testing the neighbours is for; where
        the curve is not smooth its error widens and asks for more windows."""
        needed = max(1, self.params.confirm_repeats)
        windows = self.full_windows.get(users, [])
        if len(windows) >= needed:
            return True
        if not self.statistical or not windows:
            return False
        nearby = self._fit_windows(users)
        for constraint in self.objective.constraints:
            if not self._has_intervals(constraint.metric):
                return False
            fit = local_fit(nearby, constraint.metric, users)
            if fit is None or fit.se > self._window_se(constraint.metric) / math.sqrt(needed):
                return False
        return True

    def _window_se(self, metric: Metric) -> float:
        """A full window's typical standard error for ``metric``, in log terms."""
        spreads = [
            relative_se(value, obs.interval(metric))
            for windows in self.full_windows.values()
            for obs in windows
            if (value := obs.value(metric))
        ]
        known = [se for se in spreads if se is not None]
        return statistics.median(known) if known else 0.0

    @cached_property
    def first_miss(self) -> int | None:
        """The smallest measured count whose windows, taken together, miss a
        constraint (or that was invalid at full length): nothing at or above it is
        claimed to meet them."""
        # A screening window below a count whose full windows meet the limits steers
        # only: its slowest user reads low over a few seconds.
        passing_full = max(
            (
                users
                for users, windows in self.full_windows.items()
                if users not in self.ruled_out and self._pooled_meets(windows)
            ),
            default=0,
        )
        for users in self.measured:
            windows = self.full_windows.get(users)
            if windows is None:
                if users < passing_full:
                    continue
                windows = [obs for obs in self.history if obs.users == users]
            if users in self.ruled_out or not self._pooled_meets(windows):
                return users
        return None

    def _pooled_meets(self, windows: Sequence[Observation]) -> bool:
        for constraint in self.objective.constraints:
            values = [obs.value(constraint.metric) for obs in windows if obs.valid and not obs.oom]
            known = [v for v in values if v is not None]
            if not known or not constraint.met(statistics.fmean(known)):
                return False
        return True

    def candidate(self) -> int | None:
        """The largest count, measured or not, that the evidence says meets every
        constraint, below the first count that misses: where the boundary lies, on
        the cautious side."""
        top = min(self.ceiling, (self.first_miss or self.params.max_users + 1) - 1)
        top = min(top, max(self.measured, default=0))
        for users in range(top, 0, -1):
            if self.supported(users) and self.meets(users):
                return users
        return None

    def possible(self) -> int | None:
        """The largest count the windows do not clearly rule out: the far end of the
        boundary's range."""
        for users in range(min(self.ceiling, max(self.measured, default=0)), 0, -1):
            if self.supported(users) and self.meets(users, -Z_ONE_SIDED):
                return users
        return None

    def far_end(self) -> int | None:
        """The far end of the boundary's range: one below the smallest count above
        the cautious end (:meth:`candidate`) that the windows rule out.

        A count is ruled out by its own full windows (:attr:`ceiling`, with the cliffs),
        by a fit that says it clearly misses a limit (:meth:`_fit_rules_out`), or, for
        the per-user floor, by the aggregate: the slowest user never outpaces the mean
        one, whose rate is the aggregate over the users, and between measured counts
        the aggregate is taken to stay under the highest any window allows (the top of
        its interval), a bound that no fit is needed for. Between measured counts too
        far apart for a fit, nothing rules a count out: 28 users passing and 56 clearly
        missing leave 29-55 possible, where :meth:`possible` (which steers the search)
        ends at 28.
        """
        low = self.candidate()
        if low is None:
            return None
        top = min(self.ceiling, max(self.measured, default=0))
        floors = [
            c.limit
            for c in self.objective.constraints
            if c.is_floor and c.metric == "min_user_tok_s"
        ]
        if floors:
            peak = max(
                (
                    obs.aggregate_ci.high if obs.aggregate_ci is not None else obs.aggregate_tok_s
                    for obs in self.history
                    if obs.valid and not obs.oom
                ),
                default=0.0,
            )
            top = min(top, int(peak / max(floors)))
        for users in range(low + 1, top + 1):
            if self._fit_rules_out(users):
                return users - 1
        return max(low, top)

    def _fit_rules_out(self, users: int) -> bool:
        """A fit through the windows near ``users`` puts it past a limit beyond its
        one-sided 95% interval. Here a fit may run on past the windows, as it may not
        to say a count meets the limits: ruling a count out on the trend below it is
        the cautious direction for the range's far end, and the fit's interval widens
        with the distance it runs."""
        return any(
            self._has_intervals(constraint.metric)
            and self._fit_meets(constraint, users, -Z_ONE_SIDED) is False
            for constraint in self.objective.constraints
        )

    def rising_into(self, users: int) -> bool:
        """The aggregate rises into ``users`` smoothly: a local fit through the windows
        below it has a slope clearly above zero and no more scatter than their
        intervals allow. Then no count just below can beat it, and the boundary's
        lower neighbourhood need not be measured. Three counts within the fit's span
        are needed: a window at half the users says nothing about a peak just below."""
        below = [
            obs for obs in self._fit_windows(users) if users / FIT_SPAN < obs.users <= users
        ]
        if len({obs.users for obs in below}) < 3:
            return False
        fit = local_fit(below, "aggregate_tok_s", users)
        return (
            fit is not None
            and fit.slope - Z_ONE_SIDED * fit.slope_se > 0
            and fit.scatter < SMOOTH_SCATTER
        )

    def aggregate_gain(self, low: int, high: int) -> float | None:
        """How much more aggregate ``high`` users give than ``low`` (0.05: 5%),
        from local fits of the aggregate through the windows around each."""
        fits = [
            local_fit(self._fit_windows(users), "aggregate_tok_s", users) for users in (low, high)
        ]
        if fits[0] is None or fits[1] is None:
            return None
        return fits[1].value / fits[0].value - 1

    def windows_to_confirm(self, users: int) -> float | None:
        """About how many full windows the windows' own trend says it would take to
        show ``users`` meets its floors (one-sided 95%); None when they say it
        does not meet them."""
        needed = 0.0
        for constraint in self.objective.constraints:
            if not constraint.is_floor:
                continue
            fit = local_fit(self._fit_windows(users), constraint.metric, users)
            if fit is None:
                return None
            margin = fit.log_value - math.log(constraint.limit)
            if margin <= 0:
                return None
            spread = self._window_se(constraint.metric)
            needed = max(needed, (Z_ONE_SIDED * spread / margin) ** 2)
        return needed

    def noise_users(self, lo: int, hi: int) -> int:
        """How many users apart two counts near ``lo`` must be for one full window
        each to tell their slowest users apart: a bracket narrower than this is
        noise, and repeats at the boundary say more than another split."""
        if not self.statistical:
            return 1
        spreads = [
            relative_se(obs.min_user_tok_s, obs.min_user_ci)
            for windows in self.full_windows.values()
            for obs in windows
        ]
        spread = min((se for se in spreads if se is not None), default=None)
        rate_lo, rate_hi = self.points[lo].min_user_tok_s, self.points[hi].min_user_tok_s
        if spread is None or not rate_lo > rate_hi > 0:
            return 1
        slope = math.log(rate_lo / rate_hi) / math.log(hi / lo)
        return max(1, int(2 * spread / slope * lo))


def with_drift(
    history: Sequence[Observation], is_full: Callable[[Observation], bool]
) -> Sequence[Observation]:
    """``history`` with every window's intervals widened by the scatter that full
    windows at one count show beyond them (:func:`runner.search.evidence.drift`):
    on an engine whose pace moves between windows, one window's interval overstates
    what it says about the count, and each window the search reads is worth less."""
    repeats = group(obs for obs in history if is_full(obs) and obs.valid and not obs.oom)
    taus = {
        metric: drift(repeats.values(), metric)
        for metric in ("aggregate_tok_s", "min_user_tok_s")
    }
    if not any(taus.values()):
        return history
    return [
        replace(
            obs,
            aggregate_ci=widen(obs, "aggregate_tok_s", taus["aggregate_tok_s"]),
            min_user_ci=widen(obs, "min_user_tok_s", taus["min_user_tok_s"]),
        )
        for obs in history
    ]


def group(history: Iterable[Observation]) -> dict[int, list[Observation]]:
    grouped: dict[int, list[Observation]] = {}
    for obs in history:
        grouped.setdefault(obs.users, []).append(obs)
    return grouped
