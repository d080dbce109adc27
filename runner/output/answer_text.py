"""A search's answers in words, as the report and the console show them: the default
floor's range of N and flags, the cost figures, and one line or row per SLO tier.

Pure: a :class:`~runner.output.answers.Capacity` in, text out. A figure not known
reads "unavailable"; a CPU run (no GPU count) shows no cost lines at all.
"""

from __future__ import annotations

from runner.measure.uncertainty import Interval
from runner.output.answers import Capacity, TierAnswer

UNAVAILABLE = "unavailable"


def boundary_text(capacity: Capacity | None) -> str:
    """The default floor's range of N, e.g. "the boundary is between 126 and 137 users"."""
    if capacity is None or capacity.users_range is None:
        return UNAVAILABLE
    low, high = capacity.users_range
    if high is None:
        return f"the boundary is at or above {low} users: no count measured misses the floor"
    if low == high:
        return f"the boundary is at {low} users"
    return f"the boundary is between {low} and {high} users"


def flags_text(capacity: Capacity | None) -> str:
    if capacity is None:
        return UNAVAILABLE
    return "; ".join(capacity.flags) if capacity.flags else "none"


def cost_facts(capacity: Capacity | None) -> list[tuple[str, str]]:
    """Output tok/s per GPU and $ per million output tokens at the best N, as report
    facts; none without a GPU profile."""
    if capacity is None or capacity.gpus is None:
        return []
    best = capacity.default
    gpus = f"{capacity.gpus} GPU{'s' if capacity.gpus > 1 else ''}"
    return [
        (
            "Output throughput per GPU",
            f"{figure_text(best.tok_s_per_gpu, best.tok_s_per_gpu_ci, 2)} tok/s ({gpus})",
        ),
        (
            "Cost per million output tokens",
            f"{figure_text(best.usd_per_mtok, best.usd_per_mtok_ci, 4, '$')} {_price(capacity)}",
        ),
    ]


def tier_table(capacity: Capacity) -> list[str]:
    """The report's SLO tier table, one row per tier (Markdown lines)."""
    cost = capacity.gpus is not None
    header = (
        "| tier | limits | max users | aggregate tok/s | slowest user tok/s | binding "
        "| range of N | windows |" + (" tok/s per GPU | $/Mtok |" if cost else "")
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for tier in capacity.tiers:
        cells = [
            tier.name,
            tier.limit_labels,
            UNAVAILABLE if tier.users is None else str(tier.users),
            figure_text(tier.aggregate_tok_s, tier.aggregate_ci, 2),
            figure_text(tier.min_user_tok_s, tier.min_user_ci, 2),
            tier.binding or UNAVAILABLE,
            range_text(tier.users_range),
            str(tier.windows),
        ]
        if cost:
            cells += [
                figure_text(tier.tok_s_per_gpu, tier.tok_s_per_gpu_ci, 2),
                figure_text(tier.usd_per_mtok, tier.usd_per_mtok_ci, 4, "$"),
            ]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return lines


def tier_line(tier: TierAnswer) -> str:
    """The console's line for one tier, printed after the best-N line."""
    if tier.users is None:
        return f"tier {tier.name} ({tier.limit_labels}): no user count qualifies ({tier.reason})"
    assert tier.aggregate_tok_s is not None and tier.min_user_tok_s is not None
    parts = [
        f"tier {tier.name}: N={tier.users}",
        f"aggregate_output_tok_s={tier.aggregate_tok_s:.1f}",
        f"slowest_user_tok_s={tier.min_user_tok_s:.2f}",
        f"range={range_text(tier.users_range)}",
    ]
    parts += cost_parts(tier)
    parts.append(f"bound by {tier.binding or UNAVAILABLE}")
    return " ".join(parts)


def cost_parts(answer: TierAnswer) -> list[str]:
    """``tok_s_per_gpu=... usd_per_mtok=...`` for a console line; none without a GPU."""
    parts = []
    if answer.tok_s_per_gpu is not None:
        parts.append(f"tok_s_per_gpu={answer.tok_s_per_gpu:.1f}")
    if answer.usd_per_mtok is not None:
        parts.append(f"usd_per_mtok={answer.usd_per_mtok:.4f}")
    return parts


def range_text(users_range: tuple[int, int | None] | None) -> str:
    if users_range is None:
        return UNAVAILABLE
    low, high = users_range
    if high is None:
        return f"{low} or more"
    return str(low) if low == high else f"{low}-{high}"


def figure_text(
    value: float | None, interval: Interval | None, decimals: int, unit: str = ""
) -> str:
    """``value`` with its 95% interval, e.g. ``512.30 (95%: 498.00-526.10)``."""
    if value is None:
        return UNAVAILABLE
    text = f"{unit}{value:.{decimals}f}"
    if interval is not None:
        text += f" (95%: {unit}{interval.low:.{decimals}f}-{unit}{interval.high:.{decimals}f})"
    return text


def _price(capacity: Capacity) -> str:
    if capacity.usd_per_hour is None:
        return "(hw.usd_per_hour not set)"
    return f"at ${capacity.usd_per_hour:g}/h"
