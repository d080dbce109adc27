"""What the search has seen: observations built from the windows' rows and details."""

from __future__ import annotations

from collections.abc import Sequence

from runner.measure.result import WindowDetail, WindowResult, WindowRow
from runner.search.policy import Observation


def observation(row: WindowRow, detail: WindowDetail) -> Observation:
    """The window as the search sees it. The latency figures feed SLO tiers; rows
    written before they were recorded read None, which meets no tier's limit."""
    fault = detail.engine_fault
    streams = detail.streams
    return Observation(
        users=row.users,
        aggregate_tok_s=row.aggregate_output_tok_s,
        min_user_tok_s=row.min_user_tok_s,
        valid=row.valid,
        phase=detail.phase,
        oom=fault is not None and fault.oom_killed,
        ttft_p99_ms=row.ttft_p99_ms,
        itl_p99_ms=streams.itl_p99_ms if streams is not None else None,
        tpot_p99_ms=streams.tpot_p99_ms if streams is not None else None,
        request_latency_p99_ms=row.request_latency_p99_ms,
        aggregate_ci=detail.aggregate_ci,
        min_user_ci=detail.min_user_ci,
        screening=detail.screening,
    )


def search_history(results: Sequence[WindowResult], relaunch: bool) -> list[Observation]:
    """What the search has seen. With ``backend.on_engine_fault=relaunch`` a window the
    engine died in is redone on a fresh engine, so it does not count as a failure;
    it stays in results.jsonl as an invalid row with its reason. An OOM kill still
    counts: it stops the doubling, since more users would be killed again."""
    history = []
    for result in results:
        seen = observation(result.row, result.detail)
        if relaunch and result.detail.engine_fault is not None and not seen.oom:
            continue
        history.append(seen)
    return history
