"""The capacity search (seed 004 §9): windows chosen by the search policy until it stops."""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console

from runner.engines.base import LaunchPlan
from runner.errors import ConfigError, EngineError
from runner.run.context import RunContext, engine_api_key, prior_windows
from runner.run.session import (
    MAX_RELAUNCHES,
    gpu_telemetry,
    open_engine,
    open_tracker,
    startup_facts,
)
from runner.search.history import search_history
from runner.search.policy import Observation, SearchParams, decide, next_step
from runner.secret import redact
from runner.workload.prompt import Prompt


def build_workload(context: RunContext, host_model_dir: Path | None) -> tuple[list[Prompt], str]:
    from runner.workload.context_mix import build_prompts, load_tokenizer, write_workload

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
    from runner.measure.protocol import run_window
    from runner.output.console import print_window
    from runner.output.results import ResultsWriter
    from runner.smoke import run_smoke
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
            from runner.engines.startup import verify_precision

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
    from runner.output.report import plot_report, render_report
    from runner.output.results import read_results
    from runner.output.tracking import BEST_AGGREGATE_TOK_S, BEST_MIN_USER_TOK_S, BEST_USERS

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
        f"MLflow: {redact(context.config.tracking.uri) if context.config.tracking.enabled else 'disabled'}"
    )
