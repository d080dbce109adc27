"""Where the aggregate peaks: the provisional best and the next probe towards it
(seed 004 §9 step 6)."""

from __future__ import annotations

from collections.abc import Sequence

from runner.search.evidence import clearly_below, draw
from runner.search.params import SearchParams
from runner.search.view import Point, View

# Probes in a row that draw with the peak end the walk towards it.
FLAT_PROBES = 2


def peak_probe(
    points: dict[int, Point],
    peak: int,
    params: SearchParams,
    statistical: bool = False,
    probed: Sequence[int] = (),
) -> int | None:
    """A user count between the peak and a measured neighbour too far away for the
    neighbourhood scan to reach; halving the wider gap closes in on a single peak.

    With intervals, the peak's upper neighbour is the nearest count clearly below it
    (counts above that draw with it are part of the peak), and the vertex of the parabola
    through them is tried first (successive parabolic interpolation), which usually
    lands within a user or two of the peak in one window where halving takes three.
    """
    if not statistical:
        left = max((users for users in points if users < peak), default=0)
        right = min((users for users in points if users > peak), default=peak)
        reach = params.neighbourhood + 1
        if peak - left <= reach and right - peak <= reach:
            return None
        return (left + peak) // 2 if peak - left >= right - peak else (peak + right) // 2
    top = points[peak].aggregate
    tolerance = params.negligible_gain_pct

    def lower(users: int) -> bool:
        return clearly_below(points[users].aggregate, top, tolerance)

    left = max((n for n in points if n < peak), default=0)
    right = min((n for n in points if n > peak), default=None)
    # Above the peak, counts that draw with it are part of it (a draw goes to the
    # larger count), so the gap that matters ends at the first clearly lower one.
    lower_right = min((n for n in points if n > peak and lower(n)), default=None)
    inner_right = max(n for n in points if peak <= n < (lower_right or peak + 1))
    last = [n for n in probed[-FLAT_PROBES:] if n != peak]
    if len(last) == FLAT_PROBES and all(
        (lower_right is None or n < lower_right) and not lower(n) for n in last
    ):
        # The last probes inside the bracket drew with the peak: round it the curve is
        # flat within what the windows can tell, and a probe more would chase their
        # noise. On the CPU engine, whose pace drifts between windows, a walk from 56
        # to 168 users spent nine windows on a plateau of 5,165-6,203 tok/s whose
        # answer, 345 users, lay past it.
        return None
    gaps = [(peak - left, left, peak)]
    if lower_right is not None:
        gaps.append((lower_right - inner_right, inner_right, lower_right))
    width, low, high = max(gaps)
    if width <= 1 or low == 0 and high == 1:
        return None
    if right is not None and left > 0:
        vertex = _vertex(*((n, points[n].aggregate_tok_s) for n in (left, peak, right)))
        if vertex is not None:
            probe = min(right - 1, max(left + 1, round(vertex)))
            if probe != peak and probe not in points:
                return probe
    probe = (low + high) // 2
    return probe if probe not in points and probe >= 1 else None


def _vertex(a: tuple[int, float], b: tuple[int, float], c: tuple[int, float]) -> float | None:
    """Where the parabola through three points peaks, if it opens downwards."""
    (x1, y1), (x2, y2), (x3, y3) = a, b, c
    denominator = (x1 - x2) * (x1 - x3) * (x2 - x3)
    if denominator == 0:
        return None
    curvature = (x3 * (y2 - y1) + x2 * (y1 - y3) + x1 * (y3 - y2)) / denominator
    if curvature >= 0:
        return None
    slope = (x3**2 * (y1 - y2) + x2**2 * (y3 - y1) + x1**2 * (y2 - y3)) / denominator
    return -slope / (2 * curvature)


def top_point(points: dict[int, Point]) -> Point:
    return max((p for p in points.values() if p.passed), key=lambda p: p.aggregate_tok_s)


def provisional_best(view: View) -> tuple[int, bool] | None:
    """The best user count so far, and whether it is the edge of what passes.

    The edge (the largest passing count, right under a failure or at ``max_users``;
    with intervals, the boundary's cautious end once it is measured) is preferred
    unless the highest aggregate beats everything within ``neighbourhood`` users of
    the edge beyond a draw: when throughput is still rising at the floor, as it
    usually is, an arg max below the edge is window noise, and following it sends the
    search on a walk. A peak clearly above the edge's neighbourhood is followed
    (preemption thrash). For an SLO tier the edge is the answer.
    """
    points, params = view.points, view.params
    passing = [point for point in points.values() if point.passed]
    bounded = any(users > max((p.users for p in passing), default=0) for users in points)
    if view.statistical:
        candidate = view.candidate()
        if candidate is not None and candidate in points:
            passing = [p for p in passing if p.users < candidate] + [points[candidate]]
            bounded = True
    if not passing:
        return None
    edge = max(passing, key=lambda point: point.users)
    if view.objective.goal == "users":
        return edge.users, True
    peak = max(passing, key=lambda point: (point.aggregate_tok_s, -point.users))
    bounded = bounded or edge.users >= params.max_users
    near_edge = max(
        (p for p in passing if p.users >= edge.users - params.neighbourhood),
        key=lambda point: point.aggregate_tok_s,
    )
    if view.statistical:
        # Intervals tell noise from a real peak: the edge wins unless the peak is
        # clearly above it.
        near_edge = edge
    if bounded and (
        near_edge.aggregate_tok_s >= peak.aggregate_tok_s
        or draw(near_edge.aggregate, peak.aggregate, params.negligible_gain_pct)
    ):
        return edge.users, True
    return peak.users, False
