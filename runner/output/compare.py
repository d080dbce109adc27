"""Compare finished searches across config_ids, one table per precision family.

Seed 004 section 10: results of different families (BF16, FP8 weights, NVFP4 with FP8
KV, NVFP4 with NVFP4 KV, ...) never share a leaderboard, so every table holds one
family only.

    python -m runner.compare --tracking-uri sqlite:///mlruns/mlflow.db [--family F]
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from rich.console import Console
from rich.table import Table

from runner.errors import TrackingError
from runner.output.mlflowstore import check_reachable
from runner.output.tracking import (
    BEST_AGGREGATE_TOK_S,
    BEST_MIN_USER_TOK_S,
    BEST_USERS,
    KIND_TAG,
)
from runner.prepare.identity import DUMMY_WEIGHTS
from runner.secret import redact

UNKNOWN_FAMILY = "unknown"


def compare(tracking_uri: str, experiment: str, family: str | None) -> list[dict[str, Any]]:
    """One dict per search (parent run), best aggregate first within each family."""
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
        runs = client.search_runs([found.experiment_id], filter_string=query, max_results=50000)
    except MlflowException as exc:
        raise TrackingError(
            f"Could not read runs from MLflow at {redact(tracking_uri)}: "
            f"{str(exc).splitlines()[0]}. "
            "Check that the URI points at a reachable server or an existing sqlite file."
        ) from exc
    rows = [
        {
            "family": run.data.tags.get("family", UNKNOWN_FAMILY),
            "config_id": run.data.tags.get("config_id"),
            "run_id": run.data.tags.get("run_id"),
            "status": run.info.status,
            "best_users": _whole(run.data.metrics.get(BEST_USERS)),
            "best_aggregate_tok_s": run.data.metrics.get(BEST_AGGREGATE_TOK_S),
            "best_min_user_tok_s": run.data.metrics.get(BEST_MIN_USER_TOK_S),
            "mlflow_run_id": run.info.run_id,
        }
        for run in runs
    ]
    # Searches without a result (failed, still running) sort after every measured one.
    rows.sort(
        key=lambda row: (
            row["family"],
            row["best_aggregate_tok_s"] is None,
            -(row["best_aggregate_tok_s"] or 0.0),
        )
    )
    return rows


def render_compare(rows: Sequence[dict[str, Any]]) -> str:
    """Plain text: one table per family, never two families in one table."""
    if not rows:
        return "No searches found.\n"
    by_family: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_family[row["family"]].append(row)
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, color_system=None, force_terminal=False)
    for family in sorted(by_family):
        caption = None
        if family.startswith(DUMMY_WEIGHTS):
            caption = "random weights (--load-format dummy): compute of the architecture, not a checkpoint's"
        table = Table(title=f"family: {family}", title_justify="left", caption=caption)
        for column in (
            "config_id",
            "run_id",
            "status",
            "best N",
            "aggregate tok/s",
            "min user tok/s",
        ):
            table.add_column(
                column, justify="right" if " " in column or column == "best N" else "left"
            )
        for row in by_family[family]:
            table.add_row(
                str(row["config_id"]),
                str(row["run_id"]),
                str(row["status"]),
                _cell(row["best_users"], "{:d}"),
                _cell(row["best_aggregate_tok_s"], "{:.2f}"),
                _cell(row["best_min_user_tok_s"], "{:.2f}"),
            )
        console.print(table)
        console.print()
    return buffer.getvalue()




def _whole(value: float | None) -> int | None:
    return None if value is None else int(round(value))


def _cell(value: Any, form: str) -> str:
    return "n/a" if value is None else form.format(value)

