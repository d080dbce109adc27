"""The cost-speed trade-off across searches: per-user speed against throughput per GPU.

One point per config_id and answer (the default floor's and each SLO tier's), read
from the searches in MLflow: x is the answer's output tok/s per GPU, y its slowest
user's tok/s. Where a config_id was searched more than once, its latest search with
the figures gives the point. A point is on the Pareto front when no other point of
its family is at least as good on both axes and better on one; families never share
a front (seed 004 §10). Searches without a GPU count (CPU runs) have no tok/s per
GPU and give no point.

:func:`pareto_points` and :func:`pareto_front` are pure; :func:`plot_pareto` draws.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

from runner.output.compare import SearchRun
from runner.search.params import DEFAULT


@dataclass(frozen=True)
class ParetoPoint:
    family: str
    config_id: str
    tier: str
    run_id: str
    tok_s_per_gpu: float
    user_tok_s: float

    @property
    def label(self) -> str:
        return f"{self.config_id}/{self.tier}"

    def dominates(self, other: ParetoPoint) -> bool:
        at_least = self.tok_s_per_gpu >= other.tok_s_per_gpu and self.user_tok_s >= other.user_tok_s
        better = self.tok_s_per_gpu > other.tok_s_per_gpu or self.user_tok_s > other.user_tok_s
        return at_least and better


def pareto_points(runs: Sequence[SearchRun]) -> tuple[list[ParetoPoint], int]:
    """The points of every answer with both figures, and how many answers lacked them."""
    points: dict[tuple[str, str, str], ParetoPoint] = {}
    lacking = 0
    for run in sorted(runs, key=lambda run: run.started_ms, reverse=True):
        for tier in (DEFAULT, *run.tiers):
            key = (run.family, str(run.config_id), tier)
            if key in points:
                continue  # a later search of this setup already gave the point
            x, y = run.figure(tier, "tok_s_per_gpu"), run.figure(tier, "min_user_tok_s")
            if x is None or y is None:
                lacking += 1
                continue
            points[key] = ParetoPoint(run.family, str(run.config_id), tier, str(run.run_id), x, y)
    return sorted(points.values(), key=lambda p: (p.family, p.tok_s_per_gpu)), lacking


def pareto_front(points: Sequence[ParetoPoint]) -> list[ParetoPoint]:
    """The points no other point of their family dominates, by tok/s per GPU."""
    front = [
        point
        for point in points
        if not any(other.family == point.family and other.dominates(point) for other in points)
    ]
    return sorted(front, key=lambda p: (p.family, p.tok_s_per_gpu))


def plot_pareto(points: Sequence[ParetoPoint], path: Path) -> Path:
    """Every point, labelled config_id/tier, and each family's front as a line."""
    figure = Figure(figsize=(8, 5.5))
    axes = figure.add_subplot()
    front = set(pareto_front(points))
    families = sorted({point.family for point in points})
    colours = [f"C{index % 10}" for index in range(len(families))]
    for family, colour in zip(families, colours, strict=True):
        members = [point for point in points if point.family == family]
        axes.scatter(
            [p.tok_s_per_gpu for p in members],
            [p.user_tok_s for p in members],
            color=colour,
            alpha=0.7,
            label=family,
        )
        edge = sorted((p for p in members if p in front), key=lambda p: p.tok_s_per_gpu)
        axes.plot(
            [p.tok_s_per_gpu for p in edge],
            [p.user_tok_s for p in edge],
            "-",
            color=colour,
            linewidth=1.5,
            # The edge of what the front's points dominate: a line between two of them
            # would claim setups no search measured.
            drawstyle="steps-pre",
        )
        for point in members:
            axes.annotate(
                point.label,
                (point.tok_s_per_gpu, point.user_tok_s),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize="x-small",
            )
    axes.set(
        xlabel="output tok/s per GPU",
        ylabel="slowest user output tok/s",
        title="Per-user speed against throughput per GPU (lines: Pareto fronts)",
    )
    axes.grid(alpha=0.3)
    if families:
        axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return path


def render_front(points: Sequence[ParetoPoint]) -> str:
    """One table per family: every point, the front marked."""
    front = set(pareto_front(points))
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, color_system=None, force_terminal=False)
    by_family_points: dict[str, list[ParetoPoint]] = {}
    for point in points:
        by_family_points.setdefault(point.family, []).append(point)
    for family, members in sorted(by_family_points.items()):
        table = Table(title=f"family: {family}", title_justify="left")
        for column in ("config_id/tier", "run_id", "tok/s per GPU", "slowest user tok/s", "front"):
            table.add_column(column, justify="right" if "tok/s" in column else "left")
        for point in members:
            table.add_row(
                point.label,
                point.run_id,
                f"{point.tok_s_per_gpu:.2f}",
                f"{point.user_tok_s:.2f}",
                "yes" if point in front else "",
            )
        console.print(table)
        console.print()
    return buffer.getvalue()
