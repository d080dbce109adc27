"""The pipeline: config -> validate -> engine -> workload -> windows -> search ->
results/tracking -> report.

:func:`execute` sequences the stages for one run: it prepares the run (validation,
identity, results folder), then either prints the plan (a dry run) or checks the host
and the engine's flags and hands over to a run kind, the capacity search
(:mod:`runner.run.capacity`) or seed 000's fixed benchmark (:mod:`runner.run.benchmark`).
"""

from __future__ import annotations

import platform
from pathlib import Path

from rich.console import Console

from runner.config import RunConfig
from runner.engines.base import LaunchPlan
from runner.prepare import launch, preflight
from runner.prepare.modelref import fingerprint
from runner.run import benchmark
from runner.run.capacity import CapacitySearch, build_workload
from runner.run.context import (
    RunContext,
    build_plan,
    check_engine_flags,
    measurement_settings,
    model_location,
    prepare,
)
from runner.run.dryrun import dry_run
from runner.run.lock import RunLock
from runner.run.resume import check_resumable
from runner.run.summary import RunSummary


def execute(
    config: RunConfig, console: Console | None = None, job: int | None = None
) -> RunSummary:
    """Run one capacity search (or benchmark) end to end; returns its summary."""
    console = console or Console()
    context, warnings = prepare(config, job)
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    host_model_dir, engine_model_path = model_location(context)
    plan = build_plan(context, engine_model_path, host_model_dir)
    if config.dry_run:
        return dry_run(context, plan, console)
    with RunLock(context.results_dir, context.run_id, context.cache_dir):
        check_resumable(
            context.results_dir, context.run_id, context.config_id, measurement_settings(config)
        )
        if config.workload.kind == "sharegpt":
            if (row := benchmark.measured_before(context)) is not None:
                return benchmark.report_measured(context, row, console)
        if config.workload.kind != "sharegpt":
            search = CapacitySearch(context, plan, console)
            if search.answered:
                return search.run()
        before_launch(context, plan, host_model_dir)
        if config.workload.kind == "sharegpt":
            return benchmark.run_benchmark(context, plan, host_model_dir, console)
        prompts, workload_sha = build_workload(context, host_model_dir)
        context.manifest["workload"] = {"sha256": workload_sha, "seed": config.workload.seed}
        context.write_manifest()
        return search.run(prompts, host_model_dir)


def before_launch(context: RunContext, plan: LaunchPlan, host_model_dir: Path | None) -> None:
    """What is checked and recorded before any engine starts: the GPUs, the flags, the
    exact launch and the model files, all into the manifest."""
    config = context.config
    if config.hw is not None and config.backend.kind != "external":
        context.manifest["preflight"] = preflight.preflight(config.hw)
    context.results_dir.mkdir(parents=True, exist_ok=True)
    context.manifest["flags"] = check_engine_flags(context, plan)
    context.manifest["launch"] = {
        "argv": plan.argv,
        "env": sorted(plan.env),
        "secret_env": plan.secret_env,
        "docker_run": (
            launch.docker_run_line(plan, config.backend) if config.backend.kind == "docker" else None
        ),
    }
    context.manifest["host"] = {"platform": platform.platform(), "python": platform.python_version()}
    if host_model_dir is not None and host_model_dir.is_dir():
        context.manifest["model_files"] = fingerprint(host_model_dir)
