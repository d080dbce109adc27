"""``python -m runner.compare``: the finished searches from MLflow, one table per family.

``--baseline RUN_ID`` shows, for every other search of the baseline's family, each
figure's change against it and whether the change exceeds the windows' noise;
``--pareto PLOT.png`` draws per-user speed against output tok/s per GPU, one point
per config_id and answer, with each family's Pareto front.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from runner.config import Tracking
from runner.errors import ConfigError, RunnerError
from runner.output.baseline import find_baseline, render_baseline
from runner.output.compare import SearchRun, compare, render_compare
from runner.output.pareto import pareto_points, plot_pareto, render_front


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.compare",
        description="Best valid concurrency of finished searches, one table per family.",
    )
    parser.add_argument("--tracking-uri", default=Tracking().uri)
    parser.add_argument("--experiment", default=Tracking().experiment)
    parser.add_argument("--family", default=None, help="show only this precision family")
    parser.add_argument(
        "--baseline",
        metavar="RUN_ID",
        default=None,
        help="compare every other search of its family against this one (run_id or MLflow run id)",
    )
    parser.add_argument(
        "--pareto",
        metavar="PLOT.png",
        type=Path,
        default=None,
        help="draw per-user tok/s against tok/s per GPU with the Pareto fronts to this file",
    )
    args = parser.parse_args(argv)
    try:
        runs = compare(args.tracking_uri, args.experiment, args.family)
        if args.baseline is not None:
            sys.stdout.write(baseline_view(runs, args.baseline, args.family))
        if args.pareto is not None:
            sys.stdout.write(pareto_view(runs, args.pareto))
    except RunnerError as error:
        Console(stderr=True).print(f"error: {error}", markup=False, highlight=False)
        return error.exit_code
    if args.baseline is None and args.pareto is None:
        sys.stdout.write(render_compare(runs))
    return 0


def baseline_view(runs: Sequence[SearchRun], wanted: str, family: str | None) -> str:
    """The searches of the baseline's family against it; other families are left out."""
    if not runs and family is not None:
        raise ConfigError(
            f"No search of family {family!r} is in MLflow, so there is no baseline "
            f"{wanted!r} among them; drop --family or check its spelling."
        )
    baseline = find_baseline(runs, wanted)
    others = [run for run in runs if run.family == baseline.family and run is not baseline]
    text = render_baseline(baseline, others)
    left_out = sum(run.family != baseline.family for run in runs)
    if left_out:
        text += (
            f"{left_out} search(es) of other families left out: results of two families "
            "are never compared (seed 004 §10).\n"
        )
    return text


def pareto_view(runs: Sequence[SearchRun], path: Path) -> str:
    points, lacking = pareto_points(runs)
    if not points:
        raise ConfigError(
            f"None of the {len(runs)} search(es) logged output tok/s per GPU, so there is "
            "nothing to plot: a search has it when it ran with a GPU profile (+hw=...); "
            "CPU runs have no GPU count."
        )
    plot_pareto(points, path)
    text = render_front(points) + f"Pareto plot: {path}\n"
    if lacking:
        text += f"{lacking} answer(s) without tok/s per GPU or a slowest-user figure left out.\n"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
