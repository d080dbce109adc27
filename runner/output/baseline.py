"""Searches against a baseline: per figure, the change and whether it exceeds the noise.

Pure: :class:`~runner.output.compare.SearchRun` values in, :class:`Change` values and
text out. "The noise" is what the windows themselves say: each search logs the 95%
interval of its answer's aggregate and slowest user (and of the cost figures drawn
from the aggregate). Two searches differ beyond noise when the difference of their
figures lies outside the 95% interval of that difference, whose half-width is the
root of the sum of the squared half-widths of the two intervals (independent
measurements). A user count's noise is the boundary's range of N: two counts are
within noise when their ranges (each widened to hold its answer) overlap. A figure
logged without an interval (TTFT p99, or any figure of a search run before intervals
were measured) is reported as such, never guessed.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.console import Console
from rich.table import Table

from runner.errors import ConfigError
from runner.output.compare import SearchRun
from runner.search.params import DEFAULT

Verdict = Literal["better", "worse", "within noise", "noise unknown", "unchanged", "n/a"]


@dataclass(frozen=True)
class Figure:
    """A figure compared against the baseline and which way is better."""

    name: str  # as in capacity.json and MLflow: users, aggregate_tok_s, ...
    label: str
    higher_is_better: bool
    decimals: int


FIGURES = (
    Figure("users", "users", True, 0),
    Figure("aggregate_tok_s", "aggregate tok/s", True, 2),
    Figure("min_user_tok_s", "slowest user tok/s", True, 2),
    Figure("ttft_p99_ms", "TTFT p99 ms", False, 1),
    Figure("tok_s_per_gpu", "tok/s per GPU", True, 2),
    Figure("usd_per_mtok", "$/Mtok", False, 4),
)


@dataclass(frozen=True)
class Change:
    """One figure of one answer (``tier``: ``"default"`` for the floor's) in a search
    against the baseline's. ``noise`` is the half-width of the difference's 95%
    interval (None for a user count, whose noise is ranges overlapping, and where an
    interval is missing); ``why`` names the ranges or what is missing ("" when the
    intervals alone decide)."""

    tier: str
    figure: Figure
    baseline: float | None
    value: float | None
    noise: float | None
    verdict: Verdict
    why: str

    @property
    def difference(self) -> float | None:
        if self.baseline is None or self.value is None:
            return None
        return self.value - self.baseline

    @property
    def percent(self) -> float | None:
        difference = self.difference
        if difference is None or not self.baseline:
            return None
        return 100.0 * difference / abs(self.baseline)


def find_baseline(runs: Sequence[SearchRun], wanted: str) -> SearchRun:
    """The search whose runner ``run_id`` (or MLflow run id) is ``wanted``; a paragraph
    when there is none or more than one."""
    found = [run for run in runs if wanted in (run.run_id, run.mlflow_run_id)]
    if not found:
        raise ConfigError(
            f"No search with run_id {wanted!r} is in this MLflow experiment. "
            "`python -m runner.compare` lists the searches it holds; pass one of their "
            "run_ids (or an MLflow run id) to --baseline."
        )
    if len(found) > 1:
        ids = ", ".join(f"{run.mlflow_run_id} (config_id {run.config_id})" for run in found)
        raise ConfigError(
            f"{len(found)} searches carry run_id {wanted!r}: {ids}. Pass the MLflow run id "
            "of the one to compare against to --baseline."
        )
    return found[0]


def changes(baseline: SearchRun, other: SearchRun) -> list[Change]:
    """Every figure of the default floor's answer, then of each tier both searches
    answered, against the baseline."""
    tiers = [DEFAULT, *(tier for tier in baseline.tiers if tier in other.tiers)]
    return [change(baseline, other, tier, figure) for tier in tiers for figure in FIGURES]


def change(baseline: SearchRun, other: SearchRun, tier: str, figure: Figure) -> Change:
    before, after = baseline.figure(tier, figure.name), other.figure(tier, figure.name)

    def made(verdict: Verdict, why: str, noise: float | None = None) -> Change:
        return Change(tier, figure, before, after, noise, verdict, why)

    if before is None or after is None:
        missing = "the baseline" if before is None else "this search"
        return made("n/a", f"{missing} logged no {figure.label}")
    if figure.name == "users":
        return _users_change(baseline, other, tier, figure, before, after)
    ours, theirs = baseline.interval(tier, figure.name), other.interval(tier, figure.name)
    if ours is None or theirs is None:
        why = _no_interval(ours is None, theirs is None)
        return made("unchanged" if before == after else "noise unknown", why)
    noise = math.hypot((ours[1] - ours[0]) / 2, (theirs[1] - theirs[0]) / 2)
    if abs(after - before) <= noise:
        return made("within noise", "", noise)
    return made(_direction(figure, after - before), "", noise)


def _users_change(
    baseline: SearchRun, other: SearchRun, tier: str, figure: Figure, before: float, after: float
) -> Change:
    ranges = baseline.interval(tier, "users"), other.interval(tier, "users")
    if ranges[0] is None or ranges[1] is None:
        verdict: Verdict = "unchanged" if before == after else "noise unknown"
        why = _no_interval(ranges[0] is None, ranges[1] is None, "range of N")
        return Change(tier, figure, before, after, None, verdict, why)
    (low_a, high_a), (low_b, high_b) = (
        (min(low, value), max(high, value))
        for (low, high), value in zip(ranges, (before, after), strict=True)
    )
    span = f"ranges of N {low_a:.0f}-{high_a:.0f} and {low_b:.0f}-{high_b:.0f}"
    verdict = (
        "within noise"
        if low_a <= high_b and low_b <= high_a
        else _direction(figure, after - before)
    )
    return Change(tier, figure, before, after, None, verdict, span)


def _no_interval(baseline_lacks: bool, other_lacks: bool, what: str = "95% interval") -> str:
    if baseline_lacks and other_lacks:
        return f"neither search logged a {what}"
    return f"{'the baseline' if baseline_lacks else 'this search'} logged no {what}"


def _direction(figure: Figure, difference: float) -> Verdict:
    return "better" if (difference > 0) == figure.higher_is_better else "worse"


def render_baseline(baseline: SearchRun, others: Sequence[SearchRun]) -> str:
    """One table per search: each figure, its change against the baseline and the verdict."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, color_system=None, force_terminal=False)
    console.print(
        f"baseline: {baseline.label}, family {baseline.family}, status {baseline.status}",
        highlight=False,
    )
    console.print()
    if not others:
        console.print("No other search of this family to compare.", highlight=False)
    for other in others:
        table = Table(title=f"{other.label} against the baseline", title_justify="left")
        for column in ("tier", "figure", "baseline", "this search", "change", "change %",
                       "noise (95%, ±)", "verdict"):  # fmt: skip
            table.add_column(
                column, justify="left" if column in ("tier", "figure", "verdict") else "right"
            )
        for item in changes(baseline, other):
            places = item.figure.decimals
            table.add_row(
                item.tier,
                item.figure.label,
                _number(item.baseline, places),
                _number(item.value, places),
                _number(item.difference, places, sign=True),
                _number(item.percent, 1, sign=True),
                _number(item.noise, places),
                _verdict_text(item),
            )
        console.print(table)
        console.print()
    return buffer.getvalue()


def _verdict_text(item: Change) -> str:
    verdict = (
        f"{item.verdict}, beyond noise" if item.verdict in ("better", "worse") else item.verdict
    )
    return f"{verdict} ({item.why})" if item.why else verdict


def _number(value: float | None, decimals: int, sign: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:{'+' if sign else ''}.{decimals}f}"
