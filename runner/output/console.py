"""The one console line per window (seed 004 section 8), its verdict coloured."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from runner.measure.gates import requests_sent
from runner.measure.result import WindowDetail, WindowRow


def passes(row: WindowRow, floor: float | None) -> bool:
    """Valid, and every user at or above the floor (when one is given)."""
    return row.valid and (floor is None or row.min_user_tok_s >= floor)


def console_line(
    row: WindowRow, detail: WindowDetail | None = None, floor: float | None = None
) -> str:
    """The seed 004 section 8 console line, e.g. ``users=28 window=300s ... PASS``."""
    parts = [
        f"users={row.users}",
        f"window={row.window_s:g}s",
        f"aggregate_output_tok_s={_figure(row.aggregate_output_tok_s, 2)}",
        f"min_user_tok_s={_figure(row.min_user_tok_s, 2)}",
        f"ttft_p99_ms={_figure(row.ttft_p99_ms, 1)}",
        f"request_latency_p99_ms={_figure(row.request_latency_p99_ms, 1)}",
    ]
    if detail is not None and detail.frontend_bound and row.server_in_flight_mean is not None:
        # A true measurement of the server, bounded in front of the engine (seed 004 §10:
        # low utilisation with waiting requests, check for a CPU frontend bottleneck).
        load = detail.offered_load
        sent = requests_sent(load, row.users) if load is not None else row.users
        share = 100.0 * row.server_in_flight_mean / sent
        parts.append(f"FRONTEND-BOUND(engine held {share:.0f}% of the requests sent)")
    if detail is not None and detail.prefix_cache != "off":
        # Never silent: a warm cache makes prefill cheaper than the workload claims.
        parts.append(f"prefix_cache={detail.prefix_cache}:{_figure(row.prefix_cache_hit_pct, 0)}%")
    if detail is not None and detail.streams is not None and detail.streams.bursty:
        # Streams arrived in bursts: per-token latencies of this window mislead (seed 000).
        # Before the verdict, which stays last for the colouring in print_window; with
        # the source when it is known: the server merged the tokens, or the client.
        source = detail.streams.burst_source
        parts.append(f"BURSTY({source})" if source else "BURSTY")
    if passes(row, floor):
        return " ".join([*parts, "PASS"])
    if not row.valid:
        # What N really was, beside the reasons: the users' least in-flight share and
        # what the server held running or waiting.
        parts.append(f"in_flight={_figure(row.in_flight_pct, 1)}%")
        parts.append(f"server_running+waiting={_figure(row.server_in_flight_mean, 1)}/{row.users}")
        reasons = "; ".join(detail.invalid_reasons) if detail and detail.invalid_reasons else ""
        verdict = f"FAIL (invalid: {reasons})" if reasons else "FAIL (invalid)"
    else:
        verdict = f"FAIL (min_user_tok_s {row.min_user_tok_s:.2f} < {floor:g})"
    return " ".join([*parts, verdict])


def print_window(
    console: Console,
    row: WindowRow,
    detail: WindowDetail | None = None,
    floor: float | None = None,
) -> None:
    """Print the console line, the verdict coloured so a FAIL stands out in a scroll."""
    line = console_line(row, detail, floor)
    style = "green" if passes(row, floor) else "red"
    verdict_at = line.rfind(" PASS") if line.endswith("PASS") else line.find(" FAIL")
    text = Text(line[:verdict_at])
    text.append(line[verdict_at:], style=style)
    console.print(text, highlight=False)


def _figure(value: float | None, decimals: int) -> str:
    return "n/a" if value is None else f"{value:.{decimals}f}"
