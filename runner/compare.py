"""``python -m runner.compare``: the finished searches from MLflow, one table per family."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from runner.config import Tracking
from runner.errors import RunnerError
from runner.output.compare import compare, render_compare


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.compare",
        description="Best valid concurrency of finished searches, one table per family.",
    )
    parser.add_argument("--tracking-uri", default=Tracking().uri)
    parser.add_argument("--experiment", default=Tracking().experiment)
    parser.add_argument("--family", default=None, help="show only this precision family")
    args = parser.parse_args(argv)
    try:
        rows = compare(args.tracking_uri, args.experiment, args.family)
    except RunnerError as error:
        Console(stderr=True).print(f"error: {error}", markup=False, highlight=False)
        return error.exit_code
    sys.stdout.write(render_compare(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
