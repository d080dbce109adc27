"""What the search has seen: observations built from the windows' rows and details."""

from __future__ import annotations

from runner.measure.result import WindowDetail, WindowResult, WindowRow
from runner.search.policy import Observation

ENGINE_FAULT = "engine fault: "


OOM_WORDS = ("lack of memory", "OOM", "out of memory")


def engine_fault_of(detail: WindowDetail) -> str | None:
    """The engine fault that invalidated a window, if one did."""
    for reason in detail.invalid_reasons:
        if reason.startswith(ENGINE_FAULT):
            return reason[len(ENGINE_FAULT) :]
    return None


def observation(row: WindowRow, detail: WindowDetail) -> Observation:
    """The window as the search sees it. The latency figures feed SLO tiers; rows
    written before they were recorded read None, which meets no tier's limit."""
    fault = engine_fault_of(detail) or ""
    streams = detail.extra
    return Observation(
        users=row.users,
        aggregate_tok_s=row.aggregate_output_tok_s,
        min_user_tok_s=row.min_user_tok_s,
        valid=row.valid,
        phase=detail.phase,
        oom=any(word in fault for word in OOM_WORDS),
        ttft_p99_ms=row.ttft_p99_ms,
        itl_p99_ms=streams.get("itl_p99_ms"),
        tpot_p99_ms=streams.get("tpot_p99_ms"),
        request_latency_p99_ms=row.request_latency_p99_ms,
    )


def search_history(results: list[WindowResult], relaunch: bool) -> list[Observation]:
    """What the search has seen. With ``backend.on_engine_fault=relaunch`` a window the
    engine died in is redone on a fresh engine, so it does not count as a failure;
    it stays in results.jsonl as an invalid row with its reason."""
    history = []
    for result in results:
        seen = observation(result.row, result.detail)
        if relaunch and engine_fault_of(result.detail) and not seen.oom:
            continue  # redone on the relaunched engine; an OOM still stops the doubling
        history.append(seen)
    return history
