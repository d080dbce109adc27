"""The engine session: engine, start-up facts, precision proof, manifest and tracker."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ContextManager

from runner.config import RunConfig
from runner.engines.base import LaunchPlan, RunningEngine
from runner.run.context import RunContext, engine_api_key, tracking_tags

log = logging.getLogger("runner")


def open_tracker(context: RunContext, **extra_tags: str) -> Any:
    """The MLflow parent run of this search (or benchmark), tagged with its identity."""
    from runner.output.tracking import Tracker, config_params

    return Tracker(
        context.config.tracking,
        run_id=context.run_id,
        config_id=context.config_id,
        tags={**tracking_tags(context), **extra_tags},
        params=config_params(context.config),
    )


def open_engine(context: RunContext, plan: LaunchPlan) -> ContextManager[RunningEngine]:
    config = context.config
    if config.backend.kind == "external":
        from runner.engines.external import ExternalEngine

        assert config.backend.url is not None
        return ExternalEngine(config.backend.url, api_key=engine_api_key(config))
    if config.backend.kind == "docker":
        from runner.engines.docker import DockerEngine

        return DockerEngine(
            config,
            plan,
            run_id=context.run_id,
            config_id=context.config_id,
            log_dir=context.results_dir,
        )
    from runner.engines.process import ProcessEngine

    return ProcessEngine(
        plan,
        log_dir=context.results_dir,
        startup_timeout_s=config.backend.startup_timeout_s,
        python=config.backend.python,
    )


def startup_facts(engine: RunningEngine) -> dict[str, Any]:
    """Start-up facts from the engine log and /metrics (seed 000 reports these)."""
    import httpx

    from runner.engines.startup import facts_from_cache_config, parse_startup_log
    from runner.measure.metrics import parse_metrics

    facts: dict[str, Any] = {}
    if engine.log_path is not None and Path(engine.log_path).exists():
        facts.update(parse_startup_log(Path(engine.log_path).read_text(errors="replace")))
    try:
        text = httpx.get(f"{engine.base_url}/metrics", timeout=10.0).text
        facts.update(facts_from_cache_config(parse_metrics(text).cache_config))
    except httpx.HTTPError as exc:
        log.warning("could not read /metrics for start-up facts: %s", exc)
    for name in ("image_id", "repo_digests"):
        # The image the Docker engine really ran, read back from it (issue: pinned, proven).
        if getattr(engine, name, None):
            facts[name] = getattr(engine, name)
    ready_s = getattr(engine, "ready_s", None)
    if ready_s is not None:
        facts["ready_s"] = round(ready_s, 1)
    return facts


MAX_RELAUNCHES = 2


def gpu_telemetry(config: RunConfig) -> Any:
    if config.hw is None:
        return None
    from runner.prepare import preflight as gpu

    return gpu.GpuSampler() if gpu.nvml_available() else None
