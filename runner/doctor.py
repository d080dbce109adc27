"""``python -m runner.doctor [+hw=NAME] [--clean] [OVERRIDES]``: is this host ready for the run?

The same overrides as ``python -m runner`` select the run to check (the CPU default,
or a GPU profile with ``+hw=NAME``); one table shows each check with what it found
and, for each row that is off, the fix. It exits 1 when a check the run needs fails
(:mod:`runner.prepare.hostcheck` says which are needed), 2 on bad input, 0 otherwise.
``--clean`` removes engine containers whose runner process is gone.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console
from rich.table import Table

from runner.cli import check_command_line, config_dir, print_error, redact_logs, to_plain
from runner.config import RunConfig, build_config
from runner.errors import RunnerError
from runner.prepare.hostcheck import Check, run_checks

log = logging.getLogger("runner")

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def compose_run(overrides: list[str]) -> RunConfig:
    """The run these overrides describe, as ``python -m runner OVERRIDES`` would build it."""
    from hydra import compose, initialize_config_dir

    check_command_line(overrides)
    if not any(item.lstrip("+").startswith("results.dir=") for item in overrides):
        overrides = [*overrides, "results.dir=results"]  # Hydra's run folder is not made here
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return build_config(to_plain(compose("runner", overrides=overrides)))


def table(checks: list[Check]) -> Table:
    view = Table(title="runner doctor", show_lines=False)
    for column in ("check", "status", "found", "fix"):
        view.add_column(column, overflow="fold")
    for check in checks:
        view.add_row(
            check.name, f"[{_STYLE[check.status]}]{check.status}[/]", check.found, check.fix
        )
    return view


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.doctor",
        description="Check this host for the run the overrides describe (e.g. +hw=h200).",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="remove engine containers labelled by runner whose runner process is gone",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m runner")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")
    redact_logs()
    console = Console(highlight=False, soft_wrap=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        config = compose_run(args.overrides)
        checks = run_checks(config, clean=args.clean)
    except RunnerError as exc:
        print_error(err, exc)
        return exc.exit_code
    console.print(table(checks))
    failed = [check.name for check in checks if check.status == "fail"]
    if failed:
        console.print(f"[bold red]not ready:[/] {', '.join(failed)} (the fix is in each row)")
        return 1
    console.print(
        "[green]ready[/] for this run"
        + (
            "; the warnings above may still cost a run"
            if any(c.status == "warn" for c in checks)
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
