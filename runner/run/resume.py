"""Resuming a run by its run_id: where its rows are, and what it may resume."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from runner.errors import ConfigError, ResultsError
from runner.measure.result import WindowResult
from runner.output.benchmark import read_benchmark_rows
from runner.output.results import read_results

log = logging.getLogger("runner")


def resume_folder(results_dir: Path, run_id: str) -> Path:
    """Where a run resumed by its run_id keeps its rows.

    The default results.dir is a new timestamped folder per start, so the rows of the
    interrupted run are in a sibling folder: the newest sibling whose manifest names
    this run_id and that holds rows is used. A folder that already holds this run's
    rows (results.dir given explicitly) is kept as it is.
    """
    if holds_run(results_dir, run_id):
        return results_dir
    candidates = []
    for manifest in results_dir.parent.glob("*/manifest.json"):
        folder = manifest.parent
        if folder == results_dir:
            continue
        try:
            named = json.loads(manifest.read_text()).get("run_id")
        except (OSError, json.JSONDecodeError):
            continue
        if named == run_id and holds_run(folder, run_id):
            candidates.append(folder)
    if not candidates:
        return results_dir
    folder = max(candidates, key=lambda path: path.stat().st_mtime)
    log.info("run %s resumes in %s, where its windows are", run_id, folder)
    return folder


def run_config_ids(folder: Path, run_id: str) -> set[str]:
    """The config_ids of the rows ``run_id`` wrote in ``folder``: windows or a benchmark."""
    rows = [*(result.row for result in read_results(folder)), *read_benchmark_rows(folder)]
    return {row.config_id for row in rows if row.run_id == run_id}


def holds_run(folder: Path, run_id: str) -> bool:
    return bool(run_config_ids(folder, run_id))


def check_resumable(
    results_dir: Path, run_id: str, config_id: str, measurement: dict[str, Any]
) -> None:
    """A run_id resumes only what it measured: the same engine setup (``config_id``) and
    the same workload, search and SLO (``measurement``, as in the manifest); raises
    ConfigError naming what differs otherwise."""
    others = run_config_ids(results_dir, run_id) - {config_id}
    if others:
        raise ConfigError(
            f"run_id={run_id} already holds results of config_id "
            f"{', '.join(sorted(others))} in {results_dir}, but this configuration "
            f"is config_id {config_id}: resuming would mix two engine setups in one "
            "run. Give the new configuration a new run_id, or resume with the configuration "
            "that run measured (its manifest.json holds it)."
        )
    if not run_config_ids(results_dir, run_id):
        return
    before = read_manifest(results_dir).get("measurement")
    if before is None:
        return
    changed = [group for group in measurement if before.get(group) != measurement[group]]
    if changed:
        raise ConfigError(
            f"run_id={run_id} in {results_dir} was measured with another "
            f"{', '.join(changed)} than this command gives: its windows and the new ones "
            "would not be measurements of the same thing. Resume with the settings in its "
            "manifest.json (key 'measurement'), or give this run a new run_id."
        )


def read_manifest(folder: Path) -> dict[str, Any]:
    """``folder``'s manifest.json; {} where there is none yet."""
    try:
        data = json.loads((folder / "manifest.json").read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(
            f"{folder / 'manifest.json'} cannot be read ({exc}); restore it or start a "
            "new run_id."
        ) from exc
    return data if isinstance(data, dict) else {}


def prior_windows(results_dir: Path, run_id: str) -> list[WindowResult]:
    """Windows this run already measured (a resumed run skips them)."""
    return [result for result in read_results(results_dir) if result.row.run_id == run_id]
