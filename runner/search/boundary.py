"""Where the boundary is: the bracket between the last pass and the first failure,
narrowed by interpolation, and with intervals the boundary's cautious end measured
until the windows say it meets the constraints (seed 004 §9 steps 5 and 7)."""

from __future__ import annotations

import math

from runner.search.evidence import CLIFF_POWER, local_fit
from runner.search.types import Step
from runner.search.view import View

# The boundary search spends at most this many times ``confirm_repeats`` full
# windows round the boundary before it settles for what the windows show.
PUSH_WINDOWS = 3


def boundary_step(view: View) -> Step | None:
    """Measure the boundary's cautious end until it has ``confirm_repeats`` windows.

    The candidate is the largest count the evidence says meets every constraint; each
    window there narrows the evidence and may move it by a count or two, and the
    search follows it. A count with no full window gets a refine window, a count
    that has one gets confirmation windows.
    """
    candidate = view.candidate()
    if candidate is None:
        measured = [users for users in view.full_windows if users <= view.ceiling]
        if not measured:
            return None
        lowest = min(measured)
        return Step(max(1, lowest - 1), "refine", screening=False) if lowest > 1 else None
    if not view.confirmed(candidate):
        have = len(view.full_windows.get(candidate, []))
        return Step(candidate, "confirm" if have else "refine", screening=False)
    return _push(view, candidate)


def _push(view: View, candidate: int) -> Step | None:
    """A window above the confirmed boundary when the counts the windows still allow
    would be worth it: their aggregate beats the candidate's by more than the
    negligible gain. This is where the aggregate still rises into the floor, and
    where seed 004 §9's three windows at one count stop a few users short of it.

    It goes to the largest such count that the windows left could show meets the
    floor, by the windows' own trend; a measured count on the way whose windows
    miss the floor on average, but not beyond their intervals, is measured again
    first: until its windows say otherwise it caps the boundary."""
    possible = view.possible()
    if possible is None or possible <= candidate:
        return None
    region = [
        obs
        for users, windows in view.full_windows.items()
        if candidate - 1 <= users <= possible + 1
        for obs in windows
    ]
    budget = PUSH_WINDOWS * max(1, view.params.confirm_repeats) - len(region)
    if budget <= 0:
        return None
    gain = view.aggregate_gain(candidate, possible)
    if gain is None or gain * 100 <= view.params.negligible_gain_pct:
        return None
    target = next(
        (
            users
            for users in range(possible, candidate, -1)
            if (needed := view.windows_to_confirm(users)) is not None and needed <= budget
        ),
        None,
    )
    if target is None:
        return None
    miss = view.first_miss
    if miss is not None and candidate < miss < target:
        target = miss
    return Step(target, "confirm" if target in view.full_windows else "refine", screening=False)


def split(view: View, lo: int, hi: int) -> int:
    """Where to measure inside the bracket (lo passes, hi fails, hi - lo > 1).

    The per-user rate falls roughly as 1/users once throughput saturates, so the
    crossing of the coarse floor is interpolated linearly in 1/min_user_tok_s; this
    usually lands next to the boundary in one window where bisection needs four or
    five. Bisection takes over when hi has no usable rate (OOM, invalid, a tier
    bound by latency), when the rate collapsed between lo and hi (a cliff), and
    when the last two refine windows inside the bracket fell on the same side, which
    is how interpolation stalls against a cliff it did not see.
    """
    points = view.points
    middle = (lo + hi) // 2
    floors = [c for c in view.objective.constraints if c.is_floor]
    refined = [
        obs
        for obs in view.history
        if obs.phase == "refine" and _inside_coarse_bracket(view, obs.users)
    ]
    # With intervals the windows aim at the floor itself and land on either side by
    # noise; cliffs are told apart by their collapse instead.
    last_two = [] if view.statistical else [view.passes(obs, coarse=True) for obs in refined[-2:]]
    if (
        len(floors) != len(view.objective.constraints)
        or len(set(last_two)) == 1
        and len(last_two) == 2
    ):
        return middle
    # With intervals the windows go where the floor itself is crossed, the most
    # telling place; without, where the margin is, as seed 004 §9 has it.
    floor = max(c.limit if view.statistical else view.params.coarse_limit(c) for c in floors)
    rate_lo, rate_hi = points[lo].min_user_tok_s, points[hi].min_user_tok_s
    if not rate_lo > floor > rate_hi > 0 or rate_hi < rate_lo * (lo / hi) ** CLIFF_POWER:
        # Past a cliff the rate says nothing about where it began.
        return middle
    share = (1 / floor - 1 / rate_lo) / (1 / rate_hi - 1 / rate_lo)
    return min(hi - 1, max(lo + 1, math.floor(lo + share * (hi - lo))))


def beyond(view: View, lo: int) -> int:
    """Where to look for the ceiling above ``lo`` once the failure that ended the
    doubling is overturned: twice ``lo`` (seed 004 §9.2), or with intervals a tenth
    past where the slowest user's local trend crosses the floor."""
    floors = [c for c in view.objective.constraints if c.is_floor]
    fit = local_fit(view.history, "min_user_tok_s", lo) if view.statistical and floors else None
    if fit is None or fit.slope >= 0 or not math.isfinite(fit.slope_se):
        return 2 * lo
    limit = max(c.limit for c in floors)
    crossing = lo * math.exp((math.log(limit) - fit.log_value) / fit.slope)
    return max(lo + 1, min(2 * lo, math.ceil(1.1 * crossing)))


def _inside_coarse_bracket(view: View, users: int) -> bool:
    coarse = [obs for obs in view.history if obs.phase == "coarse"]
    passing = [obs.users for obs in coarse if view.passes(obs, coarse=True)]
    failing = [obs.users for obs in coarse if not view.passes(obs, coarse=True)]
    low = max(passing, default=0)
    high = min((n for n in failing if n > low), default=view.params.max_users + 1)
    return low < users < high
