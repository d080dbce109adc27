"""Seed 000's fixed-concurrency benchmark as a run kind: one measurement, one row.

The same engine session as the capacity search (:class:`runner.run.session.EngineSession`);
instead of a search it measures ``workload.concurrency`` users draining a ShareGPT
prompt queue once (:mod:`runner.measure.benchmark` holds the load and the figures).
A rerun with the run_id of a finished benchmark reports its row and measures nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console

from runner.config import RunConfig
from runner.engines.base import LaunchPlan
from runner.errors import ConfigError, EngineError
from runner.measure.benchmark import BenchmarkRow, measure_benchmark, summarize_benchmark
from runner.output.benchmark import (
    BENCHMARK_NAME,
    append_row,
    benchmark_line,
    read_benchmark_rows,
    row_metrics,
)
from runner.output.tracking import Tracker
from runner.run.context import RunContext, engine_api_key
from runner.run.session import EngineSession
from runner.run.summary import RunSummary
from runner.secret import redact
from runner.workload.context_mix import load_tokenizer, write_workload
from runner.workload.prompt import Prompt
from runner.workload.sharegpt import build_sharegpt_prompts, load_sharegpt

log = logging.getLogger("runner")

ARTIFACTS = ("manifest.json", "workload.jsonl", BENCHMARK_NAME, "engine.log")


def served_context(config: RunConfig) -> int:
    return config.engine.max_model_len or config.model.max_context


def build_benchmark_workload(
    config: RunConfig, host_model_dir: Path | None, results_dir: Path
) -> tuple[list[Prompt], str]:
    """The ShareGPT prompts, frozen to ``workload.jsonl``; returns them and its SHA-256."""
    workload = config.workload
    if host_model_dir is None:
        raise ConfigError(
            f"runner needs the tokenizer of {config.model.repo} on this host to turn the "
            "ShareGPT conversations into the token IDs it sends, but the model is not "
            "local: set backend.hf_cache to the Hugging Face cache that holds it and "
            "model.revision to the snapshot's commit."
        )
    assert workload.dataset_path is not None and workload.max_tokens is not None  # validated
    prompts = build_sharegpt_prompts(
        load_tokenizer(host_model_dir),
        load_sharegpt(Path(workload.dataset_path).expanduser()),
        max_tokens=workload.max_tokens,
        max_context=served_context(config),
        num_prompts=workload.num_prompts,
        seed=workload.seed,
    )
    sha = write_workload(prompts, results_dir / "workload.jsonl", workload.seed)
    return prompts, sha


def measured_before(context: RunContext) -> BenchmarkRow | None:
    """The row this run_id already wrote, if any: a benchmark is one measurement, so a
    rerun with the same run_id reports it instead of measuring again."""
    rows = [row for row in read_benchmark_rows(context.results_dir) if row.run_id == context.run_id]
    return rows[-1] if rows else None


def summary_of(context: RunContext, row: BenchmarkRow | None) -> RunSummary:
    return RunSummary(
        kind="benchmark",
        run_id=context.run_id,
        config_id=context.config_id,
        family=context.family,
        results_dir=str(context.results_dir),
        benchmark=row,
    )


def report_measured(context: RunContext, row: BenchmarkRow, console: Console) -> RunSummary:
    """What a rerun of a finished benchmark prints and returns, starting nothing."""
    console.print(
        f"run {context.run_id} was already measured; its row in "
        f"{context.results_dir / BENCHMARK_NAME} (use a new run_id to measure again):",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(benchmark_line(row), markup=False, highlight=False)
    return summary_of(context, row)


def run_benchmark(
    context: RunContext, plan: LaunchPlan, host_model_dir: Path | None, console: Console
) -> RunSummary:
    """Seed 000's benchmark end to end, for a prepared run."""
    config = context.config
    prompts, sha = build_benchmark_workload(config, host_model_dir, context.results_dir)
    context.manifest["workload"] = {
        "sha256": sha,
        "seed": config.workload.seed,
        "dataset": str(Path(config.workload.dataset_path or "").expanduser().resolve()),
        "prompts": len(prompts),
    }
    context.write_manifest()
    row: BenchmarkRow | None = None

    def finish(tracker: Tracker) -> None:
        context.manifest["summary"] = summary_of(context, row).as_dict()
        context.write_manifest()
        for name in ARTIFACTS:
            if (context.results_dir / name).exists():
                tracker.log_artifact(context.results_dir / name)

    with EngineSession(context, plan, finish=finish, tags={"runner.mode": "benchmark"}) as session:
        measurement = measure_benchmark(session.engine, config, prompts, engine_api_key(config))
        row = summarize_benchmark(measurement, run_id=context.run_id, config_id=context.config_id)
        append_row(context.results_dir / BENCHMARK_NAME, row)
        console.print(benchmark_line(row), markup=False, highlight=False)
        session.tracker.log_metrics(row_metrics(row), step=row.concurrency)
        fault = session.engine.fault()
        if fault is not None:
            raise EngineError(
                f"The engine stopped serving during the benchmark ({fault.reason}); the "
                f"row in {BENCHMARK_NAME} counts the failed requests. Last log lines:\n"
                f"{session.engine.log_tail()}"
            )
    console.print(
        f"config_id={context.config_id} run_id={context.run_id} family={context.family}\n"
        f"results: {context.results_dir / BENCHMARK_NAME}  MLflow: "
        f"{redact(config.tracking.uri) if config.tracking.enabled else 'disabled'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return summary_of(context, row)
