"""The rules that decide whether a window measured what its row claims (pure).

A row that says N users must be a measurement of N users each keeping a request in
flight, stamped by a client that read every event when it arrived. Two ways it can
fail to be, whatever their cause (a busy client, an engine in another scheduling
session holding the client off the CPU, a slow network):

* offered load: a user that spent part of the window between requests (a completion
  read late, the next request dispatched late) sent the engine less than the row
  claims, and its rate is lower for a reason that is not the engine's. A chat user's
  think time (``RequestRecord.think_after_s``) is a pause the workload asks for, not
  idleness of the client: the share is taken over the part of the window a user was
  not deliberately pausing, so the gate still catches a late client at any think time;
* loop lag: a client event loop that woke up later than one token gap at the floor
  stamped chunks late and merged a floor-rate user's tokens into one read.

Such a window keeps its row, with ``valid=false`` and the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from runner.measure.records import ClientHealth, MetricsSample, RequestRecord
from runner.measure.stalls import describe


@dataclass(frozen=True)
class OfferedLoad:
    """How much of the window each user had a request in flight (dispatch to last byte)
    while not pausing on purpose, and what the server saw. ``None`` figures are
    unavailable, never zero."""

    user_in_flight_pct: list[float]
    min_in_flight_pct: float
    mean_in_flight_pct: float
    # Between a completion (and the think time after it) and the same user's next
    # dispatch, inside the window.
    dispatch_gap_p99_ms: float | None
    dispatch_gap_max_ms: float | None
    # The server's running + waiting requests, averaged over the 1 Hz samples.
    server_in_flight_mean: float | None
    # The mean share of the window users spent in think time (0 without it).
    thinking_pct: float = 0.0
    # The client's own requests in flight at the instants the server's were sampled,
    # averaged: what the server's figure should be if it held every request sent.
    client_in_flight_mean: float | None = None


def pauses(records: Sequence[RequestRecord], users: int) -> list[list[tuple[float, float]]]:
    """Each user's think-time pauses, ``(start, end)`` on the monotonic clock."""
    found: list[list[tuple[float, float]]] = [[] for _ in range(users)]
    for record in records:
        if record.think_after_s > 0 and record.finished_at is not None:
            found[record.user].append(
                (record.finished_at, record.finished_at + record.think_after_s)
            )
    return found


def overlap(intervals: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` the (disjoint) ``intervals`` cover."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def offered_load(
    records: Sequence[RequestRecord],
    users: int,
    t0: float,
    t1: float,
    samples: Sequence[MetricsSample] = (),
) -> OfferedLoad:
    """The :class:`OfferedLoad` of the window ``[t0, t1]``; a request still streaming at
    ``t1`` (``finished_at`` None or later) is in flight to the end. Each user's share is
    over the seconds of the window it was not in think time (a user that paused through
    all of it counts as in flight)."""
    span = t1 - t0
    busy = [0.0] * users
    by_user: list[list[RequestRecord]] = [[] for _ in range(users)]
    for record in records:
        by_user[record.user].append(record)
        end = record.finished_at if record.finished_at is not None else t1
        busy[record.user] += max(0.0, min(end, t1) - max(record.dispatched_at, t0))
    thinking = [overlap(own, t0, t1) for own in pauses(records, users)]
    gaps = [
        later.dispatched_at - earlier.finished_at - earlier.think_after_s
        for own in by_user
        for earlier, later in zip(own, own[1:])
        if earlier.finished_at is not None
        and earlier.error is None  # after an error a user backs off on purpose
        and t0 <= later.dispatched_at <= t1
    ]
    shares = [
        min(100.0, 100.0 * seconds / (span - paused)) if span - paused > 0 else 100.0
        for seconds, paused in zip(busy, thinking)
    ]
    read = [
        s
        for s in samples
        if s.metrics.requests_running is not None and s.metrics.requests_waiting is not None
    ]
    queued = [s.metrics.requests_running + s.metrics.requests_waiting for s in read]  # type: ignore[operator]
    sent = [in_flight_at(records, s.at) for s in read]
    gap_ms = np.asarray(gaps, dtype=float) * 1000.0
    return OfferedLoad(
        user_in_flight_pct=shares,
        min_in_flight_pct=min(shares),
        mean_in_flight_pct=float(np.mean(shares)),
        dispatch_gap_p99_ms=float(np.percentile(gap_ms, 99)) if gaps else None,
        dispatch_gap_max_ms=float(gap_ms.max()) if gaps else None,
        server_in_flight_mean=float(np.mean(queued)) if queued else None,
        thinking_pct=100.0 * sum(thinking) / (span * users),
        client_in_flight_mean=float(np.mean(sent)) if sent else None,
    )


def in_flight_at(records: Sequence[RequestRecord], at: float) -> int:
    """How many of the client's requests were dispatched and not yet finished at ``at``."""
    return sum(
        1
        for r in records
        if r.dispatched_at <= at and (r.finished_at is None or r.finished_at > at)
    )


def offered_load_reasons(load: OfferedLoad, users: int, min_in_flight_pct: float) -> list[str]:
    """Why the users did not keep the load the row claims; empty when they did."""
    if load.min_in_flight_pct >= min_in_flight_pct:
        return []
    idle = sum(1 for share in load.user_in_flight_pct if share < min_in_flight_pct)
    server = (
        f"; the server saw {load.server_in_flight_mean:.1f} running+waiting on average"
        if load.server_in_flight_mean is not None
        else ""
    )
    if load.thinking_pct:
        window, after = "of the window outside think time", "a completion and its think time"
    else:
        window, after = "of the window", "a completion"
    return [
        f"offered load below N={users}: {idle} user(s) had a request in flight less than "
        f"{min_in_flight_pct:g}% {window} (lowest {load.min_in_flight_pct:.1f}%, next "
        f"dispatch up to {load.dispatch_gap_max_ms or 0:.0f} ms after {after}){server}"
    ]


# Below this share of N in the engine's scheduler, with every user in flight, the
# requests are waiting in front of the engine: in its API server.
FRONTEND_BOUND_SHARE = 0.85


def frontend_bound(load: OfferedLoad, users: int, min_in_flight_pct: float) -> bool:
    """Whether the engine's API frontend, not its scheduler, held the load back.

    The client kept every user in flight (the offered-load gate passed) while the
    engine's scheduler held well under what the client had sent and not yet seen
    finish, counted at the instants the scheduler was sampled (so users in think time
    count for nothing, however the pauses fell on the samples): the difference sat in
    vLLM's API server (request parsing, tokenization, streaming). The window is a true
    measurement of the server, so it stays valid; the row and report say so, and
    what to try (more API server processes: vLLM's ``--api-server-count``).
    """
    return (
        load.server_in_flight_mean is not None
        and load.min_in_flight_pct >= min_in_flight_pct
        and load.server_in_flight_mean < FRONTEND_BOUND_SHARE * requests_sent(load, users)
    )


def requests_sent(load: OfferedLoad, users: int) -> float:
    """What the engine should hold on average: the client's own requests in flight at the
    instants it was sampled, or, without them (older details), N less the users in think
    time."""
    if load.client_in_flight_mean is not None:
        return load.client_in_flight_mean
    return users * (1.0 - load.thinking_pct / 100.0)


def judge(
    health: ClientHealth,
    max_loop_lag_ms: float,
    *,
    request_s: float | None = None,
    min_in_flight_pct: float | None = None,
) -> ClientHealth:
    """``health`` with ``kept_up`` and the reasons it did not, if any.

    A lagging loop invalidates the window whatever the client's own CPU: an idle
    client held off the CPU by the engine stamps as late as a busy one.

    A loop that reads each completion late also idles its user for that long, and the
    in-flight share cannot see it: the client's clock for a request stops at the late
    read. So with ``request_s`` (the median request's duration) and
    ``min_in_flight_pct``, the loop's mean lag may take no more of a request than the
    offered-load gate lets a user idle. At 150 ms requests that is 4.5 ms, well under
    a token gap at the floor: a client 25 ms late at one user made the engine see the
    request 85% of the time.
    """
    reasons = []
    said = [f"client at {health.cpu_pct:.0f}% CPU"] if health.cpu_pct is not None else []
    said += [stalled] if (stalled := describe(health.stalls)) else []
    why = f" ({'; '.join(said)})" if said else ""
    if health.loop_lag_p99_ms is not None and health.loop_lag_p99_ms > max_loop_lag_ms:
        reasons.append(
            f"the client could not keep up: event-loop lag p99 {health.loop_lag_p99_ms:.1f} ms "
            f"> {max_loop_lag_ms:g} ms{why}, so chunk timestamps "
            "and dispatches ran late"
        )
    idle_pct = lag_idle_pct(health, request_s)
    if (
        idle_pct is not None
        and min_in_flight_pct is not None
        and idle_pct > 100.0 - min_in_flight_pct
    ):
        reasons.append(
            f"offered load below N={health.users}: the client read each completion "
            f"{health.loop_lag_mean_ms:.1f} ms late on average{why}, {idle_pct:.1f}% of the "
            f"median request ({1000.0 * request_s:.0f} ms), so each user sat idle longer "
            f"than the {100.0 - min_in_flight_pct:g}% the in-flight gate allows"  # type: ignore[operator]
        )
    if health.open_connections is not None and health.open_connections < health.users:
        reasons.append(
            f"the client could not keep up: {health.open_connections} open connection(s) "
            f"to the engine for {health.users} users"
        )
    return replace(health, kept_up=not reasons, reasons=tuple(reasons))


def lag_idle_pct(health: ClientHealth, request_s: float | None) -> float | None:
    """The share of each request cycle a user sat idle because the loop read its
    completion late: the mean lag over the median request's duration."""
    if health.loop_lag_mean_ms is None or not request_s or request_s <= 0:
        return None
    return 100.0 * health.loop_lag_mean_ms / 1000.0 / request_s
