"""The pipeline: validate -> engine -> workload -> windows -> search -> results/tracking -> report.

Each stage is a call with a typed value; this module only sequences them and owns
the I/O that glues them (results folder, manifest, engine lifetime).
"""

from __future__ import annotations

import logging
import platform
from typing import TYPE_CHECKING, Any

from rich.console import Console

from runner.config import RunConfig
from runner.prepare import launch
from runner.run.capacity import build_workload, measure
from runner.run.context import (
    build_plan,
    check_engine_flags,
    check_resumable,
    model_location,
    prepare,
)
from runner.run.dryrun import dry_run

if TYPE_CHECKING:
    pass

log = logging.getLogger("runner")











































def execute(config: RunConfig, console: Console | None = None) -> dict[str, Any]:
    """Run one capacity search end to end; returns the summary."""
    console = console or Console()
    context, warnings = prepare(config)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    host_model_dir, engine_model_path = model_location(context)
    plan = build_plan(context, engine_model_path, host_model_dir)
    if config.dry_run:
        return dry_run(context, plan, console)
    check_resumable(context)
    if config.workload.kind == "sharegpt":
        from runner.run import benchmark as fixedrun

        if (row := fixedrun.measured_before(context)) is not None:
            return fixedrun.report_measured(context, row, console)

    if config.hw is not None and config.backend.kind != "external":
        from runner.prepare import preflight as gpu

        context.manifest["preflight"] = gpu.preflight(config.hw)
    context.results_dir.mkdir(parents=True, exist_ok=True)
    context.manifest["flags"] = check_engine_flags(context, plan)
    context.manifest["launch"] = {
        "argv": plan.argv,
        "env": sorted(plan.env),
        "secret_env": plan.secret_env,
        "docker_run": launch.docker_run_line(plan, config.backend) if config.backend.kind == "docker" else None,
    }
    context.manifest["host"] = {"platform": platform.platform(), "python": platform.python_version()}
    if host_model_dir is not None and host_model_dir.is_dir():
        from runner.prepare.modelref import fingerprint

        context.manifest["model_files"] = fingerprint(host_model_dir)
    if config.workload.kind == "sharegpt":
        from runner.run import (
            benchmark as fixedrun,  # seed 000's fixed-concurrency benchmark, no search
        )

        return fixedrun.execute_fixed(context, plan, host_model_dir, console)
    prompts, workload_sha = build_workload(context, host_model_dir)
    context.manifest["workload"] = {"sha256": workload_sha, "seed": config.workload.seed}
    context.write_manifest()
    return measure(context, plan, prompts, console)


















