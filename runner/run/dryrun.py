"""A dry run: validate, print the exact launch plan, start nothing."""

from __future__ import annotations

from rich.console import Console

from runner.engines.base import LaunchPlan
from runner.engines.docker import DockerUnreachable
from runner.errors import EngineError, PreflightError
from runner.prepare import launch
from runner.run.context import RunContext, check_engine_flags
from runner.run.summary import RunSummary


def dry_run(context: RunContext, plan: LaunchPlan, console: Console) -> RunSummary:
    """Print the exact launch plan and exit: nothing is started."""
    config = context.config
    digest_state = ""
    try:
        flags_state = check_engine_flags(context, plan)
    except DockerUnreachable as exc:
        # A plan is worth reading on a laptop without dockerd; the run itself checks both.
        flags_state = digest_state = (
            "unchecked: no Docker engine answers here, and only the image can say which "
            "flags it accepts and whether its digest is present; a run checks both before "
            f"anything starts ({exc.__cause__ or exc})"
        )
    except EngineError:
        raise
    except (OSError, PreflightError) as exc:
        flags_state = f"unchecked ({exc})"
    console.print(launch.render_plan(plan), markup=False, highlight=False, soft_wrap=True)
    if config.backend.kind == "docker":
        line = launch.docker_run_line(plan, config.backend)
        console.print("\nequivalent command:\n" + line, markup=False, highlight=False, soft_wrap=True)
    if config.backend.kind == "docker":
        pin = "pinned" if config.image.pinned else "UNPINNED (results would be tagged unpinned)"
        if digest_state:
            pin += " (digest unchecked: no Docker engine here)"
    else:
        pin = f"not used (backend={config.backend.kind})"
    console.print(
        f"\nconfig_id={context.config_id} family={context.family} image={pin} flags: {flags_state}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return RunSummary(
        kind="dry_run",
        run_id=context.run_id,
        config_id=context.config_id,
        family=context.family,
        results_dir=str(context.results_dir),
        flags=flags_state,
    )
