"""The final report of a search (seed 004 section 11) and its plots.

:func:`render_report` is pure: a summary dict, the rows and their details in, Markdown
out. :func:`plot_report` draws the curves a reader checks the headline against.

Keys of ``summary`` (every one optional; a missing or ``None`` value prints
"unavailable"):

=========================  ===========================================================
``run_id``, ``config_id``  identify the run
``family``                 the precision family (results of two families never mix)
``model_repo``             e.g. ``nvidia/Llama-3.1-8B-Instruct-NVFP4``
``model_commit``           the resolved revision the engine served
``gpu``                    GPU name, count and memory as measured
``host``                   host description (offer, machine name)
``vllm_version``           reported by the engine
``image``                  image reference, ideally ``repository@sha256:...``
``cuda_version``           CUDA runtime seen by the engine
``driver_version``         NVIDIA driver
``quantization``           the quantization backend the engine confirmed at startup
``kv_cache``               the KV cache dtype the engine confirmed, with its size
``context_distribution``   e.g. ``equal 1k/2k/4k/8k/16k/24k/30k``
``workload_hash``          SHA-256 of the frozen workload
``floor_tok_s``            the per-user floor the search held every user to
``best_users``             the chosen concurrency N (``None`` if none was valid)
``median_aggregate_tok_s`` median aggregate output tok/s of the windows at N
``min_user_tok_s``         slowest user over the windows at N
``mean_user_tok_s``        median mean user tok/s over the windows at N
``ttft_p99_ms``            worst TTFT p99 over the windows at N
``request_latency_p99_ms`` worst request latency p99 over the windows at N
``engine_minutes``         minutes the engine ran for this search
``caveats``                sentences a reader must know first (e.g. random weights)
``capacity``               the search's :class:`~runner.output.answers.Capacity`: the
                           default floor's range of N and flags, the cost figures
                           (with a GPU profile) and the SLO tiers' table
=========================  ===========================================================

The five figures at N are taken from the summary when given; otherwise they are
derived from the valid rows at ``best_users`` as described above.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from runner.measure.result import WindowDetail, WindowRow
from runner.output.answer_text import boundary_text, cost_facts, flags_text, tier_table
from runner.output.answers import Capacity

UNAVAILABLE = "unavailable"


def render_report(
    summary: dict[str, Any], rows: Sequence[WindowRow], details: Sequence[WindowDetail]
) -> str:
    """Markdown: the section 11 summary, then every window in the order it ran."""
    headline = _headline(summary, rows)
    capacity: Capacity | None = summary.get("capacity")
    facts = [
        ("Model", _model(summary)),
        ("GPU", _text(summary.get("gpu"))),
        ("Host", _text(summary.get("host"))),
        ("vLLM / image / CUDA / driver", _versions(summary)),
        ("Quantization backend confirmed", _text(summary.get("quantization"))),
        ("KV cache", _text(summary.get("kv_cache"))),
        ("Context distribution", _text(summary.get("context_distribution"))),
        ("Best valid concurrency", _number(summary.get("best_users"), "{:d}")),
        ("Range of N at the boundary", boundary_text(capacity)),
        ("Flags", flags_text(capacity)),
        (
            "Median aggregate output throughput",
            _number(headline["median_aggregate_tok_s"], "{:.2f} tok/s"),
        ),
        ("Minimum user throughput", _number(headline["min_user_tok_s"], "{:.2f} tok/s")),
        ("Mean user throughput", _number(headline["mean_user_tok_s"], "{:.2f} tok/s")),
        ("TTFT p99", _number(headline["ttft_p99_ms"], "{:.1f} ms")),
        ("Request latency p99", _number(headline["request_latency_p99_ms"], "{:.1f} ms")),
        *cost_facts(capacity),
        ("Workload hash", _text(summary.get("workload_hash"))),
        ("Per-user floor", _number(summary.get("floor_tok_s"), "{:g} tok/s")),
        ("Windows run", str(len(rows))),
        ("Engine-minutes", _number(summary.get("engine_minutes"), "{:.1f}")),
    ]
    title = f"# Capacity search {_text(summary.get('config_id'))}"
    lines = [
        title,
        "",
        f"Run `{_text(summary.get('run_id'))}`, family `{_text(summary.get('family'))}`.",
        "",
    ]
    lines += [f"- **{name}:** {value}" for name, value in facts]
    if summary.get("reference"):
        lines.append(_reference_line(summary["reference"]))
    if summary.get("caveats"):
        lines += ["", "## Caveats", "", *[f"- {caveat}" for caveat in summary["caveats"]]]
    if summary.get("best_users") is None:
        lines += ["", "No concurrency met the floor in every window: there is no valid optimum."]
    if capacity is not None and capacity.tiers:
        lines += ["", "## SLO tiers", "", *tier_table(capacity)]
    lines += _frontend_note(rows, details)
    lines += ["", "## Windows", "", *_window_table(rows, details)]
    return "\n".join(lines) + "\n"


def plot_report(
    rows: Sequence[WindowRow],
    details: Sequence[WindowDetail],
    floor: float | None,
    out_dir: Path,
) -> list[Path]:
    """Draw the throughput, per-user and per-bucket TTFT curves as PNGs in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        _plot_aggregate(rows, out_dir / "aggregate_tok_s_vs_users.png"),
        _plot_users(rows, floor, out_dir / "user_tok_s_vs_users.png"),
    ]
    ttft = _plot_bucket_ttft(rows, details, out_dir / "ttft_p99_by_bucket_vs_users.png")
    if ttft is not None:
        paths.append(ttft)
    return paths


def _headline(summary: dict[str, Any], rows: Sequence[WindowRow]) -> dict[str, float | None]:
    best = summary.get("best_users")
    at_best = [row for row in rows if row.valid and best is not None and row.users == best]

    def derived(key: str, pick: Callable[[list[float]], float], field: str) -> float | None:
        if summary.get(key) is not None:
            return float(summary[key])
        values = [getattr(row, field) for row in at_best if getattr(row, field) is not None]
        return pick(values) if values else None

    return {
        "median_aggregate_tok_s": derived(
            "median_aggregate_tok_s", statistics.median, "aggregate_output_tok_s"
        ),
        "min_user_tok_s": derived("min_user_tok_s", min, "min_user_tok_s"),
        "mean_user_tok_s": derived("mean_user_tok_s", statistics.median, "mean_user_tok_s"),
        "ttft_p99_ms": derived("ttft_p99_ms", max, "ttft_p99_ms"),
        "request_latency_p99_ms": derived("request_latency_p99_ms", max, "request_latency_p99_ms"),
    }


def _model(summary: dict[str, Any]) -> str:
    repo = summary.get("model_repo")
    if repo is None:
        return UNAVAILABLE
    return f"{repo}@{_text(summary.get('model_commit'))}"


def _versions(summary: dict[str, Any]) -> str:
    keys = ("vllm_version", "image", "cuda_version", "driver_version")
    return " / ".join(_text(summary.get(key)) for key in keys)


def _text(value: Any) -> str:
    return UNAVAILABLE if value is None or value == "" else str(value)


def _number(value: Any, form: str) -> str:
    return UNAVAILABLE if value is None else form.format(value)


def _cell(value: float | None, decimals: int) -> str:
    return "n/a" if value is None else f"{value:.{decimals}f}"


def _reference_line(reference: dict[str, Any]) -> str:
    """vLLM's own client at the answer's N on the same engine, beside runner's figure."""
    server = reference.get("server_output_tok_s")
    return (
        f"- **vllm bench serve at N={reference['users']} (same engine):** "
        f"{reference['output_tok_s']:.2f} output tok/s, engine counter "
        f"{_number(server, '{:.2f} tok/s')}, random {reference['input_len']} in / "
        f"{reference['output_len']} out, {reference['completed']}/{reference['num_prompts']} "
        f"prompts, client CPU {reference['client_cpu_pct']:.0f}%"
    )


def _frontend_note(rows: Sequence[WindowRow], details: Sequence[WindowDetail]) -> list[str]:
    """Where the engine's API frontend bound the load, say so and what to try."""
    bound = [
        (row.users, 100.0 * row.server_in_flight_mean / row.users)
        for row, detail in zip(rows, details, strict=False)
        if detail.frontend_bound and row.server_in_flight_mean is not None
    ]
    if not bound:
        return []
    shown = ", ".join(f"N={users} ({share:.0f}%)" for users, share in bound[:8])
    return [
        "",
        "## Frontend-bound windows",
        "",
        f"Every user kept a request in flight, yet the engine's scheduler held well under N "
        f"running or waiting in {len(bound)} window(s): {shown}. The other requests waited "
        "in vLLM's API server (parsing, tokenization, streaming), which then bounds the "
        "aggregate, not the GPU. Try more API server processes (vLLM's "
        "`--api-server-count`, e.g. `'engine.extra_args=[--api-server-count,4]'`) and "
        "compare the searches.",
    ]


def _window_table(rows: Sequence[WindowRow], details: Sequence[WindowDetail]) -> list[str]:
    if not rows:
        return ["No window was measured."]
    header = (
        "| # | phase | users | window s | aggregate tok/s | min user tok/s | p05 user tok/s "
        "| mean user tok/s | TTFT p99 ms | latency p99 ms | errors | streams | valid |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for index, row in enumerate(rows):
        detail = details[index] if index < len(details) else None
        verdict = "yes" if row.valid else "no"
        if not row.valid and detail is not None and detail.invalid_reasons:
            verdict = "no: " + "; ".join(detail.invalid_reasons).replace("|", "/")
        cells = [
            str(index),
            detail.phase if detail is not None else UNAVAILABLE,
            str(row.users),
            f"{row.window_s:g}",
            _cell(row.aggregate_output_tok_s, 2),
            _cell(row.min_user_tok_s, 2),
            _cell(row.p05_user_tok_s, 2),
            _cell(row.mean_user_tok_s, 2),
            _cell(row.ttft_p99_ms, 1),
            _cell(row.request_latency_p99_ms, 1),
            str(row.request_errors),
            _streams(detail),
            verdict,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _streams(detail: WindowDetail | None) -> str:
    """"bursty (server)" where tokens arrived in lumps, so the window's TPOT/ITL mislead
    (seed 000); "steady" where they did not."""
    if detail is None or detail.streams is None:
        return UNAVAILABLE
    if not detail.streams.bursty:
        return "steady"
    source = detail.streams.burst_source
    return f"bursty ({source})" if source else "bursty"


def _by_users(pairs: Sequence[tuple[int, float | None]]) -> tuple[list[int], list[float]]:
    """Median per concurrency, so repeated confirmation windows draw one point each."""
    grouped: dict[int, list[float]] = defaultdict(list)
    for users, value in pairs:
        if value is not None:
            grouped[users].append(value)
    ordered = sorted(grouped)
    return ordered, [statistics.median(grouped[users]) for users in ordered]


def _scatter_windows(axes: Any, rows: Sequence[WindowRow], field: str, colour: str) -> None:
    for valid, marker in ((True, "o"), (False, "x")):
        points = [
            (r.users, getattr(r, field))
            for r in rows
            if r.valid is valid and getattr(r, field) is not None
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            label = "window" if valid else "invalid window"
            axes.scatter(
                xs, ys, marker=marker, color=colour, alpha=0.6 if valid else 0.9, label=label
            )


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return path


def _plot_aggregate(rows: Sequence[WindowRow], path: Path) -> Path:
    figure = Figure(figsize=(7, 4.5))
    axes = figure.add_subplot()
    xs, ys = _by_users([(r.users, r.aggregate_output_tok_s) for r in rows if r.valid])
    axes.plot(xs, ys, "-", color="tab:blue", label="valid windows (median)")
    _scatter_windows(axes, rows, "aggregate_output_tok_s", "tab:blue")
    axes.set(
        xlabel="users (N)", ylabel="aggregate output tok/s", title="Aggregate output throughput"
    )
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    return _save(figure, path)


def _plot_users(rows: Sequence[WindowRow], floor: float | None, path: Path) -> Path:
    figure = Figure(figsize=(7, 4.5))
    axes = figure.add_subplot()
    series = (
        ("min_user_tok_s", "slowest user", "tab:red"),
        ("p05_user_tok_s", "p05 user", "tab:orange"),
        ("mean_user_tok_s", "mean user", "tab:green"),
    )
    for field, label, colour in series:
        xs, ys = _by_users([(r.users, getattr(r, field)) for r in rows])
        axes.plot(xs, ys, "-o", color=colour, label=label, markersize=4)
    if floor is not None:
        axes.axhline(floor, color="black", linestyle="--", label=f"floor {floor:g} tok/s")
    axes.set(xlabel="users (N)", ylabel="output tok/s per user", title="Per-user throughput")
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    return _save(figure, path)


def _plot_bucket_ttft(
    rows: Sequence[WindowRow], details: Sequence[WindowDetail], path: Path
) -> Path | None:
    per_bucket: dict[int, list[tuple[int, float | None]]] = defaultdict(list)
    for row, detail in zip(rows, details, strict=False):
        for bucket in detail.buckets:
            per_bucket[bucket.total_tokens].append((row.users, bucket.ttft_p99_ms))
    if not any(value is not None for pairs in per_bucket.values() for _, value in pairs):
        return None
    figure = Figure(figsize=(7, 4.5))
    axes = figure.add_subplot()
    for total in sorted(per_bucket):
        xs, ys = _by_users(per_bucket[total])
        if xs:
            axes.plot(xs, ys, "-o", markersize=4, label=f"{total:,} tokens")
    axes.set(xlabel="users (N)", ylabel="TTFT p99 ms", title="TTFT p99 per context bucket")
    axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    return _save(figure, path)
