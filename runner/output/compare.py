"""Compare finished searches across config_ids, one table per precision family.

Seed 004 section 10: results of different families (BF16, FP8 weights, NVFP4 with FP8
KV, NVFP4 with NVFP4 KV, ...) never share a leaderboard, so every table holds one
family only. Each search is a :class:`SearchRun`: its names and the figures its parent
run holds in MLflow (the default floor's ``best_*``, every tier's ``tier.<name>.*``,
their 95% intervals and cost, named by :func:`runner.output.capacity.metric_name`).

    python -m runner.compare --tracking-uri sqlite:///mlruns/mlflow.db [--family F]
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from rich.console import Console
from rich.table import Table

from runner.errors import TrackingError
from runner.output.capacity import metric_name
from runner.output.mlflowstore import check_reachable
from runner.output.tracking import KIND_TAG
from runner.prepare.identity import DUMMY_WEIGHTS
from runner.search.params import DEFAULT
from runner.secret import redact

UNKNOWN_FAMILY = "unknown"
TIER_TAG_PREFIX = "tier."
LIMITS_TAG_SUFFIX = ".limits"


@dataclass(frozen=True)
class SearchRun:
    """One search (an MLflow parent run): its names and the figures it logged.
    A figure it never logged (a failed search, a CPU run's cost) reads None."""

    family: str
    config_id: str | None
    run_id: str | None
    status: str
    mlflow_run_id: str
    started_ms: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)

    def figure(self, tier: str, name: str) -> float | None:
        """``name`` (e.g. ``aggregate_tok_s``) of ``tier``'s answer (``"default"``: the floor's)."""
        return self.metrics.get(metric_name(tier, name))

    def interval(self, tier: str, name: str) -> tuple[float, float] | None:
        """The logged ``[low, high]`` of a figure (the range of N for ``users``), or None."""
        low = self.figure(tier, f"{name}_low")
        high = self.figure(tier, f"{name}_high")
        return None if low is None or high is None else (low, high)

    @property
    def tiers(self) -> tuple[str, ...]:
        """The SLO tiers this search answered, by name; the default floor is not one."""
        return tuple(
            sorted(
                key.removeprefix(TIER_TAG_PREFIX).removesuffix(LIMITS_TAG_SUFFIX)
                for key in self.tags
                if key.startswith(TIER_TAG_PREFIX) and key.endswith(LIMITS_TAG_SUFFIX)
            )
        )

    @property
    def best_users(self) -> int | None:
        return _whole(self.figure(DEFAULT, "users"))

    @property
    def best_aggregate_tok_s(self) -> float | None:
        return self.figure(DEFAULT, "aggregate_tok_s")

    @property
    def label(self) -> str:
        return f"{self.run_id} ({self.config_id})"


def compare(tracking_uri: str, experiment: str, family: str | None) -> list[SearchRun]:
    """Every search (parent run), best aggregate first within each family."""
    if tracking_uri.startswith("sqlite:///"):
        database = Path(tracking_uri.removeprefix("sqlite:///"))
        if not database.exists():
            raise TrackingError(
                f"There is no MLflow database at {database} (from {tracking_uri}). "
                "Run a search first, or pass the --tracking-uri that the run used."
            )
    elif tracking_uri.startswith(("http://", "https://")):
        check_reachable(tracking_uri)
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(experiment)
        if found is None:
            raise TrackingError(
                f"MLflow at {redact(tracking_uri)} has no experiment named {experiment!r}. "
                "Pass the --experiment that the runs were logged to (tracking.experiment)."
            )
        query = f"tags.`{KIND_TAG}` = 'search'"
        if family is not None:
            if "'" in family:
                raise TrackingError(
                    f"The family {family!r} contains a quote; MLflow filters cannot hold it."
                )
            query += f" and tags.family = '{family}'"
        found_runs = client.search_runs(
            [found.experiment_id], filter_string=query, max_results=50000
        )
    except MlflowException as exc:
        raise TrackingError(
            f"Could not read runs from MLflow at {redact(tracking_uri)}: "
            f"{str(exc).splitlines()[0]}. "
            "Check that the URI points at a reachable server or an existing sqlite file."
        ) from exc
    runs = [
        SearchRun(
            family=run.data.tags.get("family", UNKNOWN_FAMILY),
            config_id=run.data.tags.get("config_id"),
            run_id=run.data.tags.get("run_id"),
            status=run.info.status,
            mlflow_run_id=run.info.run_id,
            started_ms=run.info.start_time or 0,
            metrics=dict(run.data.metrics),
            tags=dict(run.data.tags),
        )
        for run in found_runs
    ]
    # Searches without a result (failed, still running) sort after every measured one.
    runs.sort(
        key=lambda run: (
            run.family,
            run.best_aggregate_tok_s is None,
            -(run.best_aggregate_tok_s or 0.0),
        )
    )
    return runs


def by_family(runs: Sequence[SearchRun]) -> dict[str, list[SearchRun]]:
    grouped: dict[str, list[SearchRun]] = defaultdict(list)
    for run in runs:
        grouped[run.family].append(run)
    return dict(sorted(grouped.items()))


def render_compare(runs: Sequence[SearchRun]) -> str:
    """Plain text: one table per family, never two families in one table. Cost columns
    read n/a for a search without a GPU profile or a price; a tiers column lists each
    tier's max users where any search in the family answered tiers."""
    if not runs:
        return "No searches found.\n"
    buffer = io.StringIO()
    console = Console(file=buffer, width=160, color_system=None, force_terminal=False)
    for family, members in by_family(runs).items():
        table = Table(
            title=f"family: {family}", title_justify="left", caption=family_caption(family)
        )
        tiered = any(run.tiers for run in members)
        columns = ["config_id", "run_id", "status", "best N", "aggregate tok/s",
                   "min user tok/s", "tok/s/GPU", "$/Mtok"]  # fmt: skip
        for column in columns + (["tiers (max users)"] if tiered else []):
            table.add_column(column, justify="left" if column in columns[:3] else "right")
        for run in members:
            cells = [
                str(run.config_id),
                str(run.run_id),
                str(run.status),
                _cell(run.best_users, "{:d}"),
                _cell(run.best_aggregate_tok_s, "{:.2f}"),
                _cell(run.figure(DEFAULT, "min_user_tok_s"), "{:.2f}"),
                _cell(run.figure(DEFAULT, "tok_s_per_gpu"), "{:.2f}"),
                _cell(run.figure(DEFAULT, "usd_per_mtok"), "{:.4f}"),
            ]
            if tiered:
                cells.append(
                    " ".join(
                        f"{tier}={_cell(_whole(run.figure(tier, 'users')), '{:d}')}"
                        for tier in run.tiers
                    )
                )
            table.add_row(*cells)
        console.print(table)
        console.print()
    return buffer.getvalue()


def family_caption(family: str) -> str | None:
    if family.startswith(DUMMY_WEIGHTS):
        return (
            "random weights (--load-format dummy): compute of the architecture, not a checkpoint's"
        )
    return None


def _whole(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _cell(value: object, form: str) -> str:
    return "n/a" if value is None else form.format(value)
