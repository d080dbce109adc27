"""Which window to measure next, phase by phase (seed 004 §9 steps 1-7).

coarse   shared by every objective: ``start_users`` (7: every bucket represented),
         doubling while some objective still passes the largest count measured,
         stopping at its first failure, an OOM, ``max_users``, or for the default
         floor two windows in a row with negligible aggregate gain, beyond their
         intervals where they have them (a tier wants the most users, however flat
         the aggregate); halving while some objective has no
         passing count (if 1 user fails it has no answer). Only coarse windows may
         be short screening windows.
refine   per objective, in order: the boundary between its last pass and first fail,
         found by interpolation on the per-user rate with bisection as a safeguard
         (for the default floor, skipped when the last pass is already clearly below
         the best aggregate: with one peak nothing past it can win); a search for an
         aggregate peak that lies between measured points (with intervals: a lone
         window next to the edge that puts a count ahead of it is repeated first,
         and two probes in a row that draw with the peak end the search); then the
         counts round the peak and the boundary that have no full-length window yet.
confirm  the provisional best until it has ``confirm_repeats`` full-length windows,
         earlier ones included, and the neighbours that could still take its place.

Windows with intervals change two things (:mod:`runner.search.view`): the boundary
is the largest count the evidence says meets the constraints, measured where that
evidence is thinnest, and a neighbour is repeated only while its interval overlaps
the best's (a draw, which the larger count wins). Windows without intervals are
searched exactly as before: the neighbourhood scan and the best and both
neighbours three times each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from runner.search.boundary import beyond, boundary_step, split
from runner.search.evidence import clearly_below
from runner.search.params import SearchParams
from runner.search.peak import peak_probe, provisional_best, top_point
from runner.search.types import Objective, Observation, Step
from runner.search.view import Point, View

# Full windows at a provisional peak next to the edge before the search walks towards it.
PEAK_REPEATS = 2


def coarse_step(history: Sequence[Observation], params: SearchParams) -> Step | None:
    """The next doubling or halving window, or None when every objective has its
    bracket (or cannot get one)."""
    coarse = [obs for obs in history if obs.phase == "coarse"]
    if not coarse:
        return Step(min(params.start_users, params.max_users), "coarse", params.screening)
    for objective in params.objectives:
        users = _coarse_users(coarse, View(history, params, objective))
        if users is not None:
            return Step(users, "coarse", params.screening)
    return None


def _coarse_users(coarse: Sequence[Observation], view: View) -> int | None:
    passing = {obs.users for obs in coarse if view.passes(obs, coarse=True)}
    failing = {obs.users for obs in coarse} - passing
    if not passing:
        lowest = min(failing)
        return None if lowest <= 1 else max(1, lowest // 2)
    top = max(passing)
    if any(users > top for users in failing) or top >= view.params.max_users:
        return None
    if view.objective.goal == "throughput" and _saturated(coarse, view.params):
        # A flat aggregate ends the default floor's doubling (seed 004 §9.4); a tier
        # asks for the most users, which a flat aggregate says nothing about.
        return None
    return min(2 * top, view.params.max_users)


def _saturated(coarse: Sequence[Observation], params: SearchParams) -> bool:
    """Two doubling windows in a row that improved on the best earlier aggregate by
    less than ``negligible_gain_pct`` (seed 004 §9.4).

    A window with an interval shows a negligible gain only when its whole interval
    does: a 6 s screening window that reads 10% low by noise alone (4,290 tok/s, 95%
    up to 5,026, after 4,785) says nothing about whether the curve still rises. A
    window without one is read by its figure."""
    start = coarse[0].users
    chain = sorted((obs for obs in coarse if obs.users >= start), key=lambda obs: obs.users)
    if len(chain) < 3:
        return False

    def negligible(index: int) -> bool:
        best = max(obs.aggregate_tok_s for obs in chain[:index])
        interval = chain[index].aggregate_ci
        reach = chain[index].aggregate_tok_s if interval is None else interval.high
        return best > 0 and (reach - best) / best * 100 < params.negligible_gain_pct

    return negligible(len(chain) - 1) and negligible(len(chain) - 2)


def objective_step(
    history: Sequence[Observation], params: SearchParams, objective: Objective
) -> Step | None:
    view = View(history, params, objective)
    return _refine_step(view) or _confirm_step(view)


def _refine_step(view: View) -> Step | None:
    points, params = view.points, view.params
    lo = max((users for users, point in points.items() if point.passed), default=0)
    hi = min((users for users in points if users > lo), default=None)
    if lo == 0:
        # Full windows overturned every coarse pass: keep halving, down to 1 user.
        if hi is not None and hi > 1:
            return Step(hi // 2, "refine", screening=False)
        return None
    coarse = [obs for obs in view.history if obs.phase == "coarse"]
    if hi is None and lo < params.max_users and not view.all_pass(coarse, coarse=True):
        # The failure that ended the doubling was a screening window that full
        # windows have since overturned: the ceiling is still to be found. With
        # intervals, just past where the rate's trend crosses the floor.
        return Step(min(beyond(view, lo), params.max_users), "refine", screening=False)
    boundary_matters = hi is not None and (
        view.objective.goal == "users"
        or not clearly_below(
            points[lo].aggregate, top_point(points).aggregate, params.negligible_gain_pct
        )
    )
    if boundary_matters and hi is not None and hi - lo > view.noise_users(lo, hi):
        return Step(split(view, lo, hi), "refine", screening=False)
    if (
        view.statistical
        and boundary_matters
        and hi is not None
        and not points[hi].full
        and view.candidate() == hi - 1
        and not any(
            c.clearly_missed(obs)
            for obs in view.history
            if obs.users == hi
            for c in view.objective.constraints
        )
    ):
        # Only a screening window says hi fails; it may have missed by noise alone.
        return Step(hi, "refine", screening=False)
    if view.statistical and boundary_matters:
        step = boundary_step(view)
        if step is not None:
            return step
    if view.objective.goal == "users":
        return None if view.statistical else _scan(view, lo, lo, True, boundary_matters)
    peak, at_edge = provisional_best(view) or (lo, True)
    if peak not in points:
        return None
    if not points[peak].full and (not view.statistical or points[peak].aggregate.interval is None):
        # A screening window is too noisy to steer the peak search on its own, unless
        # its interval says how noisy.
        return Step(peak, "refine", screening=False)
    if (
        not at_edge
        and view.statistical
        and lo - peak <= params.neighbourhood
        and 0 < len(view.full_windows.get(peak, [])) < PEAK_REPEATS
    ):
        # One full window is all that puts a count next to the edge clearly ahead of
        # it, by more than a smooth curve moves in a user or two. On an engine whose
        # pace moves between windows (12% at 255 users against 256 on the CPU engine,
        # two windows minutes apart) that is the moment, not the count; a second window
        # there shows the drift before a walk towards the peak spends windows on it.
        return Step(peak, "confirm", screening=False)
    if not at_edge:
        probed = [obs.users for obs in view.history if obs.phase == "refine" and view.is_full(obs)]
        probe = peak_probe(points, peak, params, view.statistical, probed)
        if probe is not None:
            return Step(probe, "refine", screening=False)
    if not points[peak].full:
        return Step(peak, "refine", screening=False)
    return _scan(view, peak, lo, at_edge, boundary_matters)


def _scan(view: View, peak: int, lo: int, at_edge: bool, boundary_matters: bool) -> Step | None:
    """Every count within ``neighbourhood`` of the peak and the boundary that has no
    full window yet (seed 004 §9.6).

    With intervals, the boundary's neighbourhood is left to the boundary search, the
    peak's shrinks to its two neighbours (the pooled windows speak for the counts
    between), and below the edge a screening window per count looks for a count
    that beats it (a jagged aggregate: users join one bucket at a time), measured at
    full length only when it seems to.
    """
    radius = 1 if view.statistical else view.params.neighbourhood
    if at_edge and view.statistical:
        return _scan_below_edge(view, peak)
    if at_edge:
        # Throughput still rises into the floor: below the edge is lower, and the
        # confirmation measures the edge's lower neighbour anyway.
        around = set(range(peak + 1, peak + radius + 1))
    else:
        around = set(range(peak - radius, peak + radius + 1))
        if boundary_matters and not view.statistical:
            around |= set(range(lo - radius, lo + radius + 1))
    unmeasured = [
        users
        for users in around
        if 1 <= users <= view.ceiling and not (users in view.points and view.points[users].full)
    ]
    if unmeasured:
        return Step(min(unmeasured, key=lambda users: (abs(users - peak), users)), "refine", False)
    return None


def _scan_below_edge(view: View, edge: int) -> Step | None:
    if view.rising_into(edge):
        return None
    points = view.points
    top = points[edge].aggregate
    # A count a tenth or more below the edge serves that many fewer users; it would
    # take a falling aggregate, which the peak search follows, to beat the edge.
    lowest = max(edge - view.params.neighbourhood, math.ceil(0.9 * edge), 1)
    for users in range(edge - 1, lowest - 1, -1):
        point = points.get(users)
        if point is None:
            return Step(users, "refine", screening=view.params.screening)
        if not point.full:
            if top.interval is not None and point.aggregate_tok_s > top.interval.high:
                return Step(users, "refine", screening=False)
        elif point.aggregate.estimate > top.estimate * (
            1 + view.params.negligible_gain_pct / 100
        ) and not view.confirmed(users):
            # Ahead of the edge by more than a negligible gain, but within a draw:
            # more windows tell which.
            return Step(users, "confirm", screening=False)
    return None


def _confirm_step(view: View) -> Step | None:
    """The provisional best until it has ``confirm_repeats`` full windows, then each
    neighbour that could still take its place (seed 004 §9.7)."""
    params = view.params
    if params.confirm_repeats == 0:
        return None
    provisional = provisional_best(view)
    if provisional is None:
        return None
    best, at_edge = provisional
    points = view.points
    if view.statistical:
        # With intervals a lower neighbour cannot win (a draw goes to the larger
        # count), and above the boundary's cautious end nothing is eligible.
        trio: tuple[int, ...] = (best,) if at_edge else (best, best + 1)
    else:
        trio = (best, best - 1, best + 1)
    for users in trio:
        upper = min(params.max_users, view.ceiling)
        if not 1 <= users <= (params.max_users if users == best else upper):
            continue
        point = points.get(users)
        if (
            users != best
            and point is not None
            and (point.ruled_out or _clearly_below(view, point, points[best]))
        ):
            continue
        if not view.confirmed(users):
            return Step(users, "confirm", screening=False)
    return None


def _clearly_below(view: View, point: Point, best: Point) -> bool:
    """A neighbour whose full window trails the best beyond a draw cannot take its
    place; repeating it would only spend engine time."""
    return point.full and clearly_below(
        point.aggregate, best.aggregate, view.params.negligible_gain_pct
    )
