"""The pipeline: validate -> engine -> workload -> windows -> search -> results/tracking -> report.

Each stage is a call with a typed value; this module only sequences them and owns
the I/O that glues them (results folder, manifest, engine lifetime).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, ContextManager

from rich.console import Console

from runner import identity, launch, validate
from runner.config import RunConfig
from runner.engines.base import LaunchPlan, RunningEngine
from runner.errors import ConfigError, EngineError, PreflightError
from runner.records import Prompt, WindowDetail, WindowResult, WindowRow
from runner.search import Observation, SearchParams, decide, next_step

if TYPE_CHECKING:
    from runner.modelref import ResolvedModel

log = logging.getLogger("runner")

CONTAINER_HF_HOME = "/root/.cache/huggingface"
CONTAINER_TINY_MODEL = "/models/tiny"


@dataclass
class RunContext:
    """What one run knows about itself; written to manifest.json."""

    config: RunConfig
    config_id: str
    family: str
    run_id: str
    results_dir: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def cache_dir(self) -> Path:
        return Path(self.config.cache_dir).expanduser()

    def write_manifest(self) -> Path:
        path = self.results_dir / "manifest.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)
        return path


def prepare(config: RunConfig) -> tuple[RunContext, list[str]]:
    """Validate, pin the model revision and name the run; raises ConfigError early."""
    warnings = validate.validate(config)
    config, resolved = pin_model(config, warnings)
    config_id = identity.config_id(config)
    run_id = config.run_id or identity.new_run_id(config)
    results_dir = Path(config.results.dir).expanduser().resolve()
    if config.run_id is not None:
        results_dir = resume_folder(results_dir, run_id)
    context = RunContext(
        config=config,
        config_id=config_id,
        family=identity.family(config),
        run_id=run_id,
        results_dir=results_dir,
    )
    context.manifest.update(
        run_id=run_id,
        config_id=config_id,
        family=context.family,
        pinned=config.image.pinned and resolved.pinned,
        image=config.image.model_dump(),
        model=config.model.model_dump(),
        model_revision={"requested": resolved.requested, "commit": resolved.commit, "source": resolved.source},
        kv=config.kv.model_dump(),
        engine=config.engine.model_dump(),
        hardware=config.hw.model_dump() if config.hw else "cpu (no GPU profile)",
        warnings=warnings,
    )
    return context, warnings


def pin_model(config: RunConfig, warnings: list[str]) -> tuple[RunConfig, "ResolvedModel"]:
    """Resolve the model revision to a commit before anything is downloaded (seed 004 §4).

    The resolved commit replaces the requested branch in the config, so config_id
    names the exact checkpoint. A measured run with an unresolved revision is refused
    unless ``model.allow_unresolved_revision`` is set; such results are tagged unpinned.
    """
    from runner.modelref import ResolvedModel, resolve_revision
    from runner.tinymodel import definition_hash

    model = config.model
    if model.generated:
        return config, ResolvedModel(model.repo, None, None, f"generated locally (definition {definition_hash()})")
    hf_cache = Path(config.backend.hf_cache).expanduser() if config.backend.hf_cache else None
    resolved = resolve_revision(model, hf_cache, ask_hub=not config.dry_run)
    if resolved.commit is None:
        message = (
            f"The revision {model.revision or 'main'!r} of {model.repo} could not be resolved to a "
            f"commit ({resolved.source})."
        )
        if not (model.allow_unresolved_revision or config.dry_run):
            raise ConfigError(
                message + " A measured run must name the exact checkpoint (seed 004 §4): set "
                "model.revision to the commit (the snapshot folder name in your Hugging Face "
                "cache), make the Hub reachable, or set model.allow_unresolved_revision=true to "
                "run anyway with results tagged unpinned."
            )
        warnings.append(message + " Results are tagged unpinned.")
        return config, resolved
    pinned_model = model.model_copy(update={"revision": resolved.commit})
    return config.model_copy(update={"model": pinned_model}), resolved


def model_location(context: RunContext) -> tuple[Path | None, str]:
    """The model folder on this host (if local) and the path the engine is given."""
    config = context.config
    if config.model.generated:
        from runner.tinymodel import ensure_tiny_model

        folder = ensure_tiny_model(context.cache_dir, config.model.max_context)
        if config.backend.kind == "docker":
            return folder, CONTAINER_TINY_MODEL
        return folder, str(folder)
    if config.backend.kind == "docker":
        host_folder = None
        if config.backend.hf_cache and config.model.revision:
            host_folder = Path(config.backend.hf_cache).expanduser() / launch.container_model_path(
                config.model, hf_home=""
            ).lstrip("/")
        return host_folder, launch.container_model_path(config.model, hf_home=CONTAINER_HF_HOME)
    return None, config.model.repo


def build_plan(context: RunContext, engine_model_path: str, host_model_dir: Path | None) -> LaunchPlan:
    config = context.config
    host = "0.0.0.0" if config.backend.kind == "docker" else "127.0.0.1"
    plan = launch.build_launch_plan(config, model_path=engine_model_path, host=host)
    if config.model.generated and config.backend.kind == "docker" and host_model_dir is not None:
        plan = LaunchPlan(
            image=plan.image,
            argv=plan.argv,
            env=plan.env,
            secret_env=plan.secret_env,
            mounts=[*plan.mounts, (str(host_model_dir), CONTAINER_TINY_MODEL, "ro")],
            port=plan.port,
            gpus=plan.gpus,
            model_path=plan.model_path,
        )
    return plan


def check_flags(context: RunContext, plan: LaunchPlan) -> str:
    """Check every engine flag against the engine's own --help=all; say what was checked."""
    from runner import flags

    config = context.config
    flags_cache = context.cache_dir
    if config.backend.kind == "external":
        return "unchecked (backend=external: runner does not launch the engine)"
    if config.backend.kind == "process":
        supported = flags.local_supported_flags(config.backend.python or _python(), flags_cache)
        flags.check_flags(plan.argv, supported, "the local vLLM")
        return "checked against the local vLLM's --help=all"
    image = plan.image or config.image.reference
    if not flags.image_present(image):
        return f"unchecked: the image {image} is not present on this host"
    supported = flags.supported_flags(image, cache_dir=flags_cache)
    flags.check_flags(plan.argv, supported, image)
    return f"checked against {image} --help=all"


def _python() -> str:
    import sys

    return sys.executable


def engine_api_key(config: RunConfig) -> str | None:
    """The engine's API key, read from the variable the config names (never stored)."""
    return os.environ.get(config.engine.api_key_env) if config.engine.api_key_env else None


def open_tracker(context: RunContext, **extra_tags: str) -> Any:
    """The MLflow parent run of this search (or benchmark), tagged with its identity."""
    from runner.tracking import Tracker, config_params

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

    from runner.metrics import parse_metrics
    from runner.startup import facts_from_cache_config, parse_startup_log

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


ENGINE_FAULT = "engine fault: "
OOM_WORDS = ("lack of memory", "OOM", "out of memory")
MAX_RELAUNCHES = 2


def engine_fault_of(detail: WindowDetail) -> str | None:
    """The engine fault that invalidated a window, if one did."""
    for reason in detail.invalid_reasons:
        if reason.startswith(ENGINE_FAULT):
            return reason[len(ENGINE_FAULT):]
    return None


def observation(row: WindowRow, detail: WindowDetail) -> Observation:
    fault = engine_fault_of(detail) or ""
    return Observation(
        users=row.users,
        aggregate_tok_s=row.aggregate_output_tok_s,
        min_user_tok_s=row.min_user_tok_s,
        valid=row.valid,
        phase=detail.phase,
        oom=any(word in fault for word in OOM_WORDS),
    )


def search_history(results: list[WindowResult], relaunch: bool) -> list[Observation]:
    """What the search has seen. With ``backend.on_engine_fault=relaunch`` a window the
    engine died in is redone on a fresh engine, so it does not count as a failure;
    it stays in results.jsonl as an invalid row with its reason."""
    history = []
    for result in results:
        seen = observation(result.row, result.detail)
        if relaunch and engine_fault_of(result.detail) and not seen.oom:
            continue  # redone on the relaunched engine; an OOM still stops the doubling
        history.append(seen)
    return history


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
    from runner.fixedrun import read_benchmark_rows
    from runner.results import read_rows

    rows = [*read_rows(folder), *read_benchmark_rows(folder)]
    return {row.config_id for row in rows if row.run_id == run_id}


def holds_run(folder: Path, run_id: str) -> bool:
    return bool(run_config_ids(folder, run_id))


def check_resumable(context: RunContext) -> None:
    """A run_id resumes only the configuration it measured; raises ConfigError otherwise."""
    others = run_config_ids(context.results_dir, context.run_id) - {context.config_id}
    if others:
        raise ConfigError(
            f"run_id={context.run_id} already holds results of config_id "
            f"{', '.join(sorted(others))} in {context.results_dir}, but this configuration "
            f"is config_id {context.config_id}: resuming would mix two engine setups in one "
            "run. Give the new configuration a new run_id, or resume with the configuration "
            "that run measured (its manifest.json holds it)."
        )


def prior_windows(results_dir: Path, run_id: str) -> list[WindowResult]:
    """Windows this run already measured (a resumed run skips them)."""
    from runner.results import read_results

    return [result for result in read_results(results_dir) if result.row.run_id == run_id]


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
        from runner import fixedrun

        if (row := fixedrun.measured_before(context)) is not None:
            return fixedrun.report_measured(context, row, console)

    if config.hw is not None and config.backend.kind != "external":
        from runner import gpu

        context.manifest["preflight"] = gpu.preflight(config.hw)
    context.results_dir.mkdir(parents=True, exist_ok=True)
    context.manifest["flags"] = check_flags(context, plan)
    context.manifest["launch"] = {
        "argv": plan.argv,
        "env": sorted(plan.env),
        "secret_env": plan.secret_env,
        "docker_run": launch.docker_run_line(plan, config.backend) if config.backend.kind == "docker" else None,
    }
    context.manifest["host"] = {"platform": platform.platform(), "python": platform.python_version()}
    if host_model_dir is not None and host_model_dir.is_dir():
        from runner.modelref import fingerprint

        context.manifest["model_files"] = fingerprint(host_model_dir)
    if config.workload.kind == "sharegpt":
        from runner import fixedrun  # seed 000's fixed-concurrency benchmark, no search

        return fixedrun.execute_fixed(context, plan, host_model_dir, console)
    prompts, workload_sha = build_workload(context, host_model_dir)
    context.manifest["workload"] = {"sha256": workload_sha, "seed": config.workload.seed}
    context.write_manifest()
    return measure(context, plan, prompts, console)


def build_workload(context: RunContext, host_model_dir: Path | None) -> tuple[list[Prompt], str]:
    from runner.workload import build_prompts, load_tokenizer, write_workload

    config = context.config
    if host_model_dir is None:
        raise ConfigError(
            f"runner needs the tokenizer of {config.model.repo} on this host to build prompts to "
            "exact token counts, but the model is not local: set backend.hf_cache to the Hugging "
            "Face cache that holds it and model.revision to the snapshot's commit."
        )
    tokenizer = load_tokenizer(host_model_dir)
    prompts = build_prompts(tokenizer, config.workload)
    sha = write_workload(prompts, context.results_dir / "workload.jsonl", config.workload.seed)
    return prompts, sha


def measure(
    context: RunContext, plan: LaunchPlan, prompts: list[Prompt], console: Console
) -> dict[str, Any]:
    from runner.protocol import run_window
    from runner.smoke import run_smoke
    from runner.results import ResultsWriter, print_window
    config = context.config
    params = SearchParams.from_config(config.search, config.slo)
    done = prior_windows(context.results_dir, context.run_id)
    relaunch = config.backend.on_engine_fault == "relaunch"
    history = search_history(done, relaunch)
    writer = ResultsWriter(context.results_dir)
    api_key = engine_api_key(config)
    started = time.monotonic()
    engine_seconds = 0.0
    status = "FAILED"
    with ExitStack() as stack:
        tracker = stack.enter_context(open_tracker(context))
        for index, result in enumerate(done):
            # A run killed between writing a row and logging it left MLflow one short;
            # windows MLflow already holds are skipped, so nothing is logged twice.
            tracker.log_window(result, index=index)
        windows_logged = len(done)
        relaunches = 0
        engine_stack = stack.enter_context(ExitStack())
        try:
            engine = engine_stack.enter_context(open_engine(context, plan))
            engine_started = time.monotonic()
            facts = startup_facts(engine)
            from runner.startup import verify_precision

            facts["precision_notes"] = verify_precision(config, facts)
            context.manifest["startup"] = facts
            context.write_manifest()
            tracker.log_startup_facts(facts)
            smoke = run_smoke(engine, config, prompts, api_key, raise_on_failure=False)
            context.manifest["smoke"] = smoke.as_dict()
            context.write_manifest()
            tracker.log_metrics(smoke.metrics())
            smoke.raise_for_failure()  # one paragraph naming every failed check
            telemetry = gpu_telemetry(config)
            if done:
                console.print(f"resuming run {context.run_id}: {len(done)} window(s) already measured")
            while (step := next_step(history, params)) is not None:
                window_s = config.search.screening_window_s if step.screening else None
                result = run_window(
                    engine,
                    config,
                    prompts,
                    step.users,
                    config_id=context.config_id,
                    run_id=context.run_id,
                    phase=step.phase,
                    window_s=window_s,
                    telemetry=telemetry,
                    api_key=api_key,
                )
                writer.append(result)
                print_window(console, result.row, result.detail, config.slo.min_user_tok_s)
                tracker.log_window(result, index=windows_logged)
                windows_logged += 1
                history.extend(search_history([result], relaunch))
                fault = engine.fault()
                if fault is None:
                    continue
                if not relaunch or relaunches >= MAX_RELAUNCHES:
                    raise EngineError(
                        f"The engine stopped serving during the window at {step.users} users "
                        f"({fault.reason}); that window is recorded as invalid. Last log lines:\n"
                        f"{engine.log_tail()}"
                    )
                relaunches += 1
                console.print(f"engine fault ({fault.reason}): relaunching ({relaunches}/{MAX_RELAUNCHES})")
                engine_stack.close()
                engine = engine_stack.enter_context(open_engine(context, plan))
            engine_seconds = time.monotonic() - engine_started
            status = "FINISHED"
        finally:
            summary = summarize(context, params, history, started, engine_seconds)
            context.manifest["summary"] = summary
            if context.results_dir.exists():
                context.write_manifest()
                finish_artifacts(context, tracker, summary)
            tracker.finish(status)
    print_summary(console, context, summary)
    return summary


def tracking_tags(context: RunContext) -> dict[str, str]:
    from runner.tracking import config_tags

    config = context.config
    return {
        **config_tags(config),
        "config_id": context.config_id,
        "run_id": context.run_id,
        "model_repo": f"{config.model.repo}@{config.model.revision or 'unresolved'}",
        "kv_cache_dtype": config.kv.cache_dtype,
        "family": context.family,
        "backend": config.backend.kind,
    }


def report_facts(context: RunContext) -> dict[str, Any]:
    """The seed 004 §11 facts the report prints, from the manifest."""
    config = context.config
    startup = context.manifest.get("startup", {})
    preflight = context.manifest.get("preflight") or {}
    totals = "/".join(f"{b.total_tokens}" for b in config.workload.buckets)
    kv = startup.get("engine_cache_dtype") or config.kv.cache_dtype
    if startup.get("kv_cache_size_tokens"):
        kv = f"{kv} ({startup['kv_cache_size_tokens']:,.0f} tokens)"
    return {
        "model_repo": config.model.repo,
        "model_commit": config.model.revision or context.manifest.get("model_revision", {}).get("source"),
        "gpu": preflight.get("summary") or (config.hw.gpu_name if config.hw else "none (CPU)"),
        "host": context.manifest.get("host", {}).get("platform"),
        "vllm_version": startup.get("vllm_version") or config.image.vllm_version,
        "image": config.image.reference if config.backend.kind == "docker" else f"local process ({config.backend.kind})",
        "driver_version": preflight.get("driver_version"),
        "quantization": (
            "none (unquantized weights)"
            if startup.get("engine_quantization") in ("None", "none")
            else startup.get("engine_quantization")
        ),
        "kv_cache": kv,
        "context_distribution": f"equal {totals} total tokens, {config.workload.max_tokens} output",
        "workload_hash": context.manifest.get("workload", {}).get("sha256"),
    }


def gpu_telemetry(config: RunConfig) -> Any:
    if config.hw is None:
        return None
    from runner import gpu

    return gpu.GpuSampler() if gpu.nvml_available() else None


def summarize(
    context: RunContext,
    params: SearchParams,
    history: list[Observation],
    started: float,
    engine_seconds: float,
) -> dict[str, Any]:
    decision = decide(history, params)
    config = context.config
    return {
        "run_id": context.run_id,
        "config_id": context.config_id,
        "family": context.family,
        "best_users": decision.best_users,
        "median_aggregate_tok_s": decision.median_aggregate_tok_s,
        "min_user_tok_s": decision.min_user_tok_s,
        "mean_user_tok_s": decision.mean_user_tok_s,
        "decision": decision.reason,
        "windows": len(history),
        "engine_minutes": round(engine_seconds / 60.0, 2),
        "wall_minutes": round((time.monotonic() - started) / 60.0, 2),
        "floor_tok_s": config.slo.min_user_tok_s,
        "results_dir": str(context.results_dir),
        "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def finish_artifacts(context: RunContext, tracker: Any, summary: dict[str, Any]) -> None:
    from runner.report import plot_report, render_report
    from runner.results import read_results
    from runner.tracking import BEST_AGGREGATE_TOK_S, BEST_MIN_USER_TOK_S, BEST_USERS

    results = [r for r in read_results(context.results_dir) if r.row.run_id == context.run_id]
    report_summary = {**report_facts(context), **summary}
    report_path = context.results_dir / "report.md"
    report_path.write_text(
        render_report(report_summary, [r.row for r in results], [r.detail for r in results])
    )
    plots = plot_report(
        [r.row for r in results],
        [r.detail for r in results],
        context.config.slo.min_user_tok_s,
        context.results_dir,
    )
    metrics = {
        BEST_USERS: summary["best_users"],
        BEST_AGGREGATE_TOK_S: summary["median_aggregate_tok_s"],
        BEST_MIN_USER_TOK_S: summary["min_user_tok_s"],
        "windows": summary["windows"],
        "engine_minutes": summary["engine_minutes"],
    }
    tracker.log_metrics({k: v for k, v in metrics.items() if v is not None})
    for name in ("manifest.json", "workload.jsonl", "results.jsonl", "results.csv",
                 "windows_detail.jsonl", "engine.log", "report.md"):
        path = context.results_dir / name
        if path.exists():
            tracker.log_artifact(path)
    for plot in plots:
        tracker.log_artifact(plot, "plots")


def print_summary(console: Console, context: RunContext, summary: dict[str, Any]) -> None:
    best = summary["best_users"]
    if best is None:
        console.print(
            f"[bold red]No valid concurrency[/] met {summary['floor_tok_s']} tok/s per user "
            f"({summary['decision']}). Results: {summary['results_dir']}"
        )
        return
    console.print(
        f"[bold green]best N={best}[/] aggregate_output_tok_s={summary['median_aggregate_tok_s']:.1f} "
        f"slowest_user_tok_s={summary['min_user_tok_s']:.2f} "
        f"(floor {summary['floor_tok_s']}) config_id={context.config_id} run_id={context.run_id} "
        f"windows={summary['windows']} engine_minutes={summary['engine_minutes']}\n"
        f"results: {summary['results_dir']}/results.jsonl  report: {summary['results_dir']}/report.md  "
        f"MLflow: {context.config.tracking.uri if context.config.tracking.enabled else 'disabled'}"
    )


def dry_run(context: RunContext, plan: LaunchPlan, console: Console) -> dict[str, Any]:
    """Print the exact launch plan and exit: nothing is started."""
    config = context.config
    try:
        flags_state = check_flags(context, plan)
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
    else:
        pin = f"not used (backend={config.backend.kind})"
    console.print(
        f"\nconfig_id={context.config_id} family={context.family} image={pin} flags: {flags_state}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return {"config_id": context.config_id, "dry_run": True, "flags": flags_state}
