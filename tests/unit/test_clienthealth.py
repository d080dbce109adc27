"""The verdict on the client's own health over a window, from plain figures."""

from __future__ import annotations

from runner.measure.clienthealth import engine_addresses
from runner.measure.gates import judge
from runner.measure.records import ClientHealth


def health(lag_ms: float | None = 2.0, connections: int | None = 33, users: int = 32, cpu_pct: float = 95.0):
    return ClientHealth(
        loop_lag_p99_ms=lag_ms,
        loop_lag_max_ms=lag_ms,
        cpu_pct=cpu_pct,
        open_connections=connections,
        users=users,
    )


def test_a_client_with_a_quiet_loop_and_every_connection_kept_up() -> None:
    verdict = judge(health(), max_loop_lag_ms=50.0)
    assert verdict.kept_up and verdict.reasons == ()


def test_loop_lag_above_the_limit_means_the_client_fell_behind() -> None:
    verdict = judge(health(lag_ms=50.1), max_loop_lag_ms=50.0)
    assert not verdict.kept_up
    assert "event-loop lag p99 50.1 ms > 50 ms" in verdict.reasons[0]
    assert judge(health(lag_ms=50.0), max_loop_lag_ms=50.0).kept_up


def test_lag_invalidates_whatever_the_clients_own_cpu() -> None:
    """An idle client held off the CPU by an engine in another session stamps as late as
    a busy one: the window measured the scheduler, not the engine (seen: p99 703 ms at 5%
    client CPU, and the server running 3.7 requests for 8 users)."""
    idle = judge(health(lag_ms=120.0, cpu_pct=5.0), max_loop_lag_ms=50.0)
    assert not idle.kept_up and "5% CPU" in idle.reasons[0]
    assert not judge(health(lag_ms=120.0, cpu_pct=85.0), max_loop_lag_ms=50.0).kept_up


def test_fewer_connections_than_users_means_users_were_not_streaming() -> None:
    verdict = judge(health(connections=31), max_loop_lag_ms=50.0)
    assert not verdict.kept_up
    assert "31 open connection(s) to the engine for 32 users" in verdict.reasons[0]
    both = judge(health(lag_ms=80.0, connections=0), max_loop_lag_ms=50.0)
    assert len(both.reasons) == 2


def test_unavailable_figures_do_not_condemn_the_window() -> None:
    assert judge(health(lag_ms=None, connections=None), max_loop_lag_ms=50.0).kept_up


def test_the_engine_address_comes_from_the_base_url() -> None:
    assert engine_addresses("http://127.0.0.1:8301") == ({"127.0.0.1"}, 8301)
    assert engine_addresses("https://127.0.0.1")[1] == 443
    addresses, port = engine_addresses("http://localhost:9000/v1")
    assert port == 9000 and "127.0.0.1" in addresses
