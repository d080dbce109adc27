"""The capacity search (seed 004 §9): windows chosen by the search policy until it stops.

A thin sequencer over the shared stages: the frozen workload, an engine session, the
smoke checks, then one window per step of :func:`runner.search.policy.next_step`, each
appended to the results files, printed and logged as it finishes. A resumed run replays
the windows its run_id already measured and carries on from the step they lead to.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from runner.engines.base import LaunchPlan
from runner.errors import ConfigError, EngineError, MeasurementError
from runner.measure.protocol import run_window
from runner.measure.reference import run_reference
from runner.output.answer_text import boundary_text, cost_parts, tier_line
from runner.output.answers import capacity_answer
from runner.output.capacity import CAPACITY_NAME, capacity_metrics, capacity_record, capacity_tags
from runner.output.console import print_window
from runner.output.reference import log_reference
from runner.output.report import plot_report, render_report
from runner.output.results import ResultsWriter, read_results
from runner.output.tracking import Tracker
from runner.prepare import identity
from runner.run.context import RunContext, engine_api_key, write_atomically
from runner.run.resume import prior_windows, read_manifest
from runner.run.session import MAX_RELAUNCHES, EngineSession
from runner.run.summary import RunSummary
from runner.search.history import search_history
from runner.search.policy import Observation, SearchParams, decide, next_step
from runner.secret import redact
from runner.smoke import run_smoke
from runner.workload.chat_sessions import build_sessions, write_sessions
from runner.workload.context_mix import build_prompts, load_tokenizer, write_workload
from runner.workload.prompt import Prompt

ARTIFACTS = (
    "manifest.json", "workload.jsonl", "results.jsonl", "results.csv",
    "windows_detail.jsonl", "engine.log", "report.md", CAPACITY_NAME,
)  # fmt: skip


def build_workload(
    context: RunContext, host_model_dir: Path | None
) -> tuple[Sequence[Prompt], str]:
    """The workload at exact token counts, frozen to ``workload.jsonl``, and its SHA-256:
    seed 004's prompts, or the chat sessions' conversations."""
    config = context.config
    if host_model_dir is None:
        raise ConfigError(
            f"runner needs the tokenizer of {config.model.repo} on this host to build prompts to "
            "exact token counts, but the model is not local: set backend.hf_cache to the Hugging "
            "Face cache that holds it and model.revision to the snapshot's commit."
        )
    tokenizer = load_tokenizer(host_model_dir)
    path = context.results_dir / "workload.jsonl"
    if config.workload.kind == "chat_sessions":
        sessions = build_sessions(tokenizer, config.workload, config.served_len)
        return sessions, write_sessions(sessions, config.workload, path)
    prompts = build_prompts(tokenizer, config.workload)
    return prompts, write_workload(prompts, path, config.workload.seed)


class CapacitySearch:
    """One search over a prepared run; :meth:`run` returns its summary."""

    def __init__(self, context: RunContext, plan: LaunchPlan, console: Console) -> None:
        config = context.config
        self.context = context
        self.plan = plan
        self.prompts: Sequence[Prompt] = []
        self.tokenizer_dir: Path | None = None
        self.console = console
        self.params = SearchParams.from_config(config.search, config.slo)
        self.relaunch = config.backend.on_engine_fault == "relaunch"
        self.done = prior_windows(context.results_dir, context.run_id)
        self.history: list[Observation] = search_history(self.done, self.relaunch)
        self.started = time.monotonic()
        self.engine_seconds = 0.0

    @property
    def answered(self) -> bool:
        """Whether the windows this run_id already measured give the search its answer."""
        return bool(self.done) and next_step(self.history, self.params) is None

    def run(
        self, prompts: Sequence[Prompt] | None = None, tokenizer_dir: Path | None = None
    ) -> RunSummary:
        """Measure ``prompts`` (the frozen workload) until the search stops; a search that
        has its answer measures nothing and only logs to MLflow what it lacks."""
        context = self.context
        self.prompts = prompts or []
        self.tokenizer_dir = tokenizer_dir
        if self.answered:
            self.console.print(
                f"run {context.run_id} already has its answer ({len(self.done)} windows in "
                f"{context.results_dir}); nothing is measured again"
            )
            # The first run's facts (engine start-up, smoke checks, GPUs) stay in the record.
            context.manifest = {**read_manifest(context.results_dir), **context.manifest}
        with EngineSession(
            context, self.plan, finish=self._finish, engine=not self.answered
        ) as session:
            # A run killed between writing a row and logging it left MLflow one short;
            # windows MLflow already holds are skipped, so nothing is logged twice.
            for index, result in enumerate(self.done):
                session.tracker.log_window(result, index=index)
            if not self.answered:
                self._measure(session)
        summary = self.summary()
        print_summary(self.console, context, summary)
        return summary

    def _measure(self, session: EngineSession) -> None:
        config, context = self.context.config, self.context
        writer = ResultsWriter(context.results_dir)
        api_key = engine_api_key(config)
        windows_logged = len(self.done)
        engine_started = time.monotonic()
        smoke = run_smoke(session.engine, config, self.prompts, api_key, raise_on_failure=False)
        context.manifest["smoke"] = smoke.as_dict()
        context.write_manifest()
        session.tracker.log_metrics(smoke.metrics())
        smoke.raise_for_failure()  # one paragraph naming every failed check
        telemetry = session.telemetry()
        if self.done:
            self.console.print(
                f"resuming run {context.run_id}: {len(self.done)} window(s) already measured"
            )
        while (step := next_step(self.history, self.params)) is not None:
            # An engine that died while idle (between windows, during the smoke checks)
            # is relaunched before the window, as one that dies in a window is after it.
            self._after_fault(session, f"before the window at {step.users} users")
            try:
                result = run_window(
                    session.engine,
                    config,
                    self.prompts,
                    step.users,
                    config_id=context.config_id,
                    run_id=context.run_id,
                    phase=step.phase,
                    window_s=config.search.screening_window_s if step.screening else None,
                    screening=step.screening,
                    telemetry=telemetry,
                    api_key=api_key,
                )
            except (EngineError, MeasurementError):
                # The engine died after the check above, before the window had a result:
                # nothing was measured, so the same step runs again on a fresh engine.
                if session.engine.fault() is None:
                    raise
                self._after_fault(session, f"before the window at {step.users} users")
                continue
            writer.append(result)
            print_window(self.console, result.row, result.detail, config.slo.min_user_tok_s)
            session.tracker.log_window(result, index=windows_logged)
            windows_logged += 1
            self.history.extend(search_history([result], self.relaunch))
            self._after_fault(
                session, f"during the window at {step.users} users; that window is recorded as invalid"
            )
        self._reference(session)
        self.engine_seconds = time.monotonic() - engine_started

    def _reference(self, session: EngineSession) -> None:
        """vLLM's own benchmark client at the answer, on this engine before it stops."""
        config, context = self.context.config, self.context
        best = decide(self.history, self.params).best_users
        if not config.reference.enabled or best is None:
            return
        prompt_tokens = [prompt.prompt_tokens for prompt in self.prompts]
        reference = run_reference(
            session.engine.base_url,
            config.model.served_name,
            str(self.tokenizer_dir),
            best,
            input_len=config.reference.input_len or round(statistics.mean(prompt_tokens)),
            output_len=config.reference.output_len or config.workload.max_tokens or 1,
            num_prompts=config.reference.prompts_per_user * best,
            python=config.backend.python,
        )
        context.manifest["reference"] = asdict(reference)
        context.write_manifest()
        log_reference(config.tracking, reference, context.run_id)
        server = reference.server_output_tok_s
        self.console.print(
            f"vllm bench serve at N={best}: {reference.output_tok_s:,.1f} output tok/s "
            f"(engine counter {f'{server:,.1f}' if server else 'n/a'} tok/s, client CPU "
            f"{reference.client_cpu_pct:.0f}%)",
            highlight=False,
        )

    def _after_fault(self, session: EngineSession, when: str) -> None:
        """Relaunch a stopped engine (``backend.on_engine_fault=relaunch``) or stop the run."""
        fault = session.engine.fault()
        if fault is None:
            return
        if not self.relaunch or session.relaunches >= MAX_RELAUNCHES:
            raise EngineError(
                f"The engine stopped serving {when} "
                f"({fault.reason}). Last log lines:\n{session.engine.log_tail()}"
            )
        self.console.print(
            f"engine fault ({fault.reason}): relaunching "
            f"({session.relaunches + 1}/{MAX_RELAUNCHES})"
        )
        session.relaunch()

    def summary(self) -> RunSummary:
        decision = decide(self.history, self.params)
        context = self.context
        return RunSummary(
            kind="search",
            run_id=context.run_id,
            config_id=context.config_id,
            family=context.family,
            results_dir=str(context.results_dir),
            best_users=decision.best_users,
            median_aggregate_tok_s=decision.median_aggregate_tok_s,
            min_user_tok_s=decision.min_user_tok_s,
            mean_user_tok_s=decision.mean_user_tok_s,
            decision=decision.reason,
            windows=len(self.history),
            engine_minutes=round(self.engine_seconds / 60.0, 2),
            wall_minutes=round((time.monotonic() - self.started) / 60.0, 2),
            floor_tok_s=context.config.slo.min_user_tok_s,
            finished_utc=datetime.now(UTC).isoformat(timespec="seconds"),
            capacity=capacity_answer(decision, self.history, self.params, context.config.hw),
        )

    def _finish(self, tracker: Tracker) -> None:
        """After the engine stopped: manifest summary, capacity.json, report, plots,
        MLflow figures."""
        context = self.context
        summary = self.summary()
        assert summary.capacity is not None
        context.manifest["summary"] = summary.as_dict()
        context.write_manifest()
        record = capacity_record(
            summary.capacity,
            context.config,
            run_id=context.run_id,
            config_id=context.config_id,
            family=context.family,
        )
        write_atomically(context.results_dir / CAPACITY_NAME, json.dumps(record, indent=2) + "\n")
        results = [r for r in read_results(context.results_dir) if r.row.run_id == context.run_id]
        rows, details = [r.row for r in results], [r.detail for r in results]
        # The typed answers, not their dict copy, so the report reads them as such.
        report_summary = {**report_facts(context), **summary.as_dict(), "capacity": summary.capacity}
        (context.results_dir / "report.md").write_text(render_report(report_summary, rows, details))
        plots = plot_report(rows, details, context.config.slo.min_user_tok_s, context.results_dir)
        metrics = {
            **capacity_metrics(summary.capacity),
            "windows": summary.windows,
            "engine_minutes": summary.engine_minutes,
        }
        tracker.log_metrics({k: v for k, v in metrics.items() if v is not None})
        tracker.log_tags(capacity_tags(summary.capacity))
        for name in ARTIFACTS:
            if (context.results_dir / name).exists():
                tracker.log_artifact(context.results_dir / name)
        for plot in plots:
            tracker.log_artifact(plot, "plots")


def report_facts(context: RunContext) -> dict[str, Any]:
    """The seed 004 §11 facts the report prints, from the manifest."""
    config = context.config
    startup = context.manifest.get("startup", {})
    preflight = context.manifest.get("preflight") or {}
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
        "context_distribution": config.workload.distribution,
        "workload_hash": context.manifest.get("workload", {}).get("sha256"),
        "caveats": identity.caveats(config),
    }


def print_summary(console: Console, context: RunContext, summary: RunSummary) -> None:
    """The best-N line (or why there is none), the boundary's range and the curve's
    flags, then one line per SLO tier."""
    best = summary.best_users
    if best is None:
        console.print(
            f"[bold red]No valid concurrency[/] met {summary.floor_tok_s} tok/s per user "
            f"({summary.decision}). Results: {summary.results_dir}"
        )
    else:
        assert summary.median_aggregate_tok_s is not None and summary.min_user_tok_s is not None
        cost = summary.capacity.default if summary.capacity is not None else None
        console.print(
            f"[bold green]best N={best}[/] aggregate_output_tok_s={summary.median_aggregate_tok_s:.1f} "
            f"slowest_user_tok_s={summary.min_user_tok_s:.2f} "
            f"(floor {summary.floor_tok_s}) "
            + "".join(f"{part} " for part in (cost_parts(cost) if cost is not None else []))
            + f"config_id={context.config_id} run_id={context.run_id} "
            f"windows={summary.windows} engine_minutes={summary.engine_minutes}\n"
            f"results: {summary.results_dir}/results.jsonl  report: {summary.results_dir}/report.md  "
            f"MLflow: {redact(context.config.tracking.uri) if context.config.tracking.enabled else 'disabled'}"
        )
    if summary.users_range is not None:
        console.print(boundary_text(summary.capacity), highlight=False)
    for flag in summary.curve_flags:
        console.print(f"[yellow]flag:[/] {flag}", highlight=False)
    for tier in summary.tiers:
        console.print(tier_line(tier), highlight=False, markup=False)
