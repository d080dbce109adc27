"""The rules that decide whether a window measured what its row claims (pure).

A window whose client fell behind measured the client, not the engine; its row is
kept with ``valid=false`` and the reasons.
"""

from __future__ import annotations

from runner.measure.records import ClientHealth

# A single-threaded asyncio client saturates at one core (100%); above this share it
# is the bottleneck rather than a victim of other processes.
CLIENT_BUSY_CPU_PCT = 80.0


def judge(health: ClientHealth, max_loop_lag_ms: float) -> ClientHealth:
    """``health`` with ``kept_up`` and the reasons it did not, if any."""
    reasons = []
    lagging = health.loop_lag_p99_ms is not None and health.loop_lag_p99_ms > max_loop_lag_ms
    # Loop lag alone does not say the client is the bottleneck: beside a CPU engine on
    # the same cores, the engine's own load wakes an idle client late. The client
    # could not keep up when it lags *and* is itself busy (near a full core).
    busy = health.cpu_pct is None or health.cpu_pct >= CLIENT_BUSY_CPU_PCT
    if lagging and busy:
        reasons.append(
            f"the client could not keep up: event-loop lag p99 {health.loop_lag_p99_ms:.1f} ms "
            f"> {max_loop_lag_ms:g} ms with the client at {health.cpu_pct or 0:.0f}% CPU, so "
            "chunk timestamps and dispatches ran late"
        )
    if health.open_connections is not None and health.open_connections < health.users:
        reasons.append(
            f"the client could not keep up: {health.open_connections} open connection(s) "
            f"to the engine for {health.users} users"
        )
    return ClientHealth(
        loop_lag_p99_ms=health.loop_lag_p99_ms,
        loop_lag_max_ms=health.loop_lag_max_ms,
        cpu_pct=health.cpu_pct,
        open_connections=health.open_connections,
        users=health.users,
        kept_up=not reasons,
        reasons=tuple(reasons),
    )
