"""Seed 000's fixed-concurrency benchmark over a ShareGPT file: one row of figures.

Seed 000 runs ``--dataset ShareGPT_V3_unfiltered_cleaned_split.json --num-prompts 1000
--max-seconds 900 --concurrency 32 --max-tokens 256`` and reports aggregate prefill and
decode tok/s, median TTFT and TPOT, the error count and how many prompts completed
within the time cap. ``workload.kind=sharegpt`` runs the same benchmark instead of the
concurrency search; the engine, start-up facts, results folder, manifest and MLflow
parent run are the search's own (:mod:`runner.run`).

The load: ``workload.concurrency`` persistent users (:class:`runner.load.LoadGenerator`)
take the next prompt from one shared queue, each prompt once in the workload's order,
with zero think time, until every prompt is sent or ``workload.max_seconds`` have passed
since the start. At the cap no further prompt is sent and the requests in flight run to
completion (each is bounded by ``workload.request_timeout_s``), and they count: seed 000
hit its 900 s cap at 361/1000 prompts and reports a 938 s run with 0 errors, so its
in-flight prompts finished after the cap.

The figures (:func:`summarize_benchmark`), as seed 000's report uses them:

* ``duration_s``: from the start of the load to the end of the last request (938 s in
  seed 000: the cap plus the tail of the requests in flight);
* ``prefill_tok_s``: prompt tokens of the completed requests / ``duration_s``;
* ``decode_tok_s``: output tokens of the completed requests / ``duration_s``; both are
  whole-system aggregates over the run, not per-stream rates ("aggregate, conc 32" in
  seed 000). Its figures are consistent with exactly these definitions: 96.9 tok/s x
  938 s / 361 prompts is 252 output tokens per prompt (just under its 256 cap) and
  115.2 x 938 / 361 is 299 prompt tokens, a typical first ShareGPT turn;
* ``ttft_median_ms``: median over completed requests of first-token arrival minus
  dispatch, queueing included (seed 000's 78.7 s with 32 long prompts admitted at once);
* ``tpot_median_ms``: median over completed requests of their time per output token,
  first chunk to last chunk over the tokens that arrived after the first chunk
  (:func:`runner.streams.stream_timing`). When the server delivers a queued stream's
  tokens in one burst just before it ends, first and last arrive together and TPOT
  reads about 0 ms: seed 000's "TPOT 0.0 ms" artefact is reproduced, not hidden, and
  ``bursty`` says so (:func:`runner.streams.summarize_streams`); ``decode_tok_s`` is
  then the honest decode figure.

Failed requests are counted in ``errors`` and left out of the figures; a figure that
cannot be measured is None, never 0.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from runner.secret import redact
from runner.workload.prompt import Prompt

if TYPE_CHECKING:
    from runner.run.context import RunContext

log = logging.getLogger("runner")



















# --- I/O: the workload, the load and the run -------------------------------------------


def served_context(config: RunConfig) -> int:
    return config.engine.max_model_len or config.model.max_context


def build_benchmark_workload(
    config: RunConfig, host_model_dir: Path | None, results_dir: Path
) -> tuple[list[Prompt], str]:
    """The ShareGPT prompts, frozen to ``workload.jsonl``; returns them and its SHA-256."""
    from runner.workload.context_mix import load_tokenizer, write_workload
    from runner.workload.sharegpt import build_sharegpt_prompts, load_sharegpt

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


def report_measured(context: RunContext, row: BenchmarkRow, console: Console) -> dict[str, Any]:
    """What a rerun of a finished benchmark prints and returns, starting nothing."""
    console.print(
        f"run {context.run_id} was already measured; its row in "
        f"{context.results_dir / BENCHMARK_NAME} (use a new run_id to measure again):",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(benchmark_line(row), markup=False, highlight=False)
    return {
        "run_id": context.run_id,
        "config_id": context.config_id,
        "family": context.family,
        "results_dir": str(context.results_dir),
        **row.as_dict(),
    }




def execute_fixed(
    context: RunContext, plan: LaunchPlan, host_model_dir: Path | None, console: Console
) -> dict[str, Any]:
    """Seed 000's benchmark end to end, for a prepared :class:`runner.run.RunContext`."""
    from runner import run
    from runner.engines.startup import verify_precision

    config = context.config
    prompts, sha = build_benchmark_workload(config, host_model_dir, context.results_dir)
    context.manifest["workload"] = {
        "sha256": sha,
        "seed": config.workload.seed,
        "dataset": str(Path(config.workload.dataset_path or "").expanduser().resolve()),
        "prompts": len(prompts),
    }
    context.write_manifest()
    api_key = run.engine_api_key(config)
    row: BenchmarkRow | None = None
    status = "FAILED"
    with ExitStack() as stack:
        tracker = stack.enter_context(run.open_tracker(context, **{"runner.mode": "benchmark"}))
        try:
            engine = stack.enter_context(run.open_engine(context, plan))
            facts = run.startup_facts(engine)
            facts["precision_notes"] = verify_precision(config, facts)
            context.manifest["startup"] = facts
            context.write_manifest()
            tracker.log_startup_facts(facts)
            measurement = measure_benchmark(engine, config, prompts, api_key)
            row = summarize_benchmark(
                measurement, run_id=context.run_id, config_id=context.config_id
            )
            append_row(context.results_dir / BENCHMARK_NAME, row)
            console.print(benchmark_line(row), markup=False, highlight=False)
            tracker.log_metrics(row_metrics(row), step=row.concurrency)
            fault = engine.fault()
            if fault is not None:
                raise EngineError(
                    f"The engine stopped serving during the benchmark ({fault.reason}); the "
                    f"row in {BENCHMARK_NAME} counts the failed requests. Last log lines:\n"
                    f"{engine.log_tail()}"
                )
            status = "FINISHED"
        finally:
            summary = {
                "run_id": context.run_id,
                "config_id": context.config_id,
                "family": context.family,
                "results_dir": str(context.results_dir),
                **(row.as_dict() if row is not None else {}),
            }
            context.manifest["summary"] = summary
            context.write_manifest()
            for name in ("manifest.json", "workload.jsonl", BENCHMARK_NAME, "engine.log"):
                if (context.results_dir / name).exists():
                    tracker.log_artifact(context.results_dir / name)
            tracker.finish(status)
    console.print(
        f"config_id={context.config_id} run_id={context.run_id} family={context.family}\n"
        f"results: {context.results_dir / BENCHMARK_NAME}  MLflow: "
        f"{redact(config.tracking.uri) if config.tracking.enabled else 'disabled'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return summary
