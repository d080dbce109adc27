"""The fixed benchmark's row: ``benchmark.jsonl``, its console line and MLflow figures."""

from __future__ import annotations

import json
import os
from pathlib import Path

from runner.errors import ResultsError
from runner.measure.benchmark import BenchmarkRow
from runner.output.results import read_jsonl

BENCHMARK_NAME = "benchmark.jsonl"


def _figure(value: float | None, decimals: int, unit: str) -> str:
    return "n/a" if value is None else f"{value:.{decimals}f} {unit}"


def benchmark_line(row: BenchmarkRow) -> str:
    """Seed 000's figures in one line, e.g. ``... 361/1000 prompts in 938 s (time cap
    900 s reached), 0 errors: prefill 115.2 tok/s, decode 96.9 tok/s, ...``."""
    cap = ""
    if row.capped and row.max_seconds is not None:
        cap = f" (time cap {row.max_seconds:g} s reached)"
    duration = _figure(row.duration_s, 0, "s")
    return (
        f"{row.workload} concurrency={row.concurrency}: {row.prompts_completed}/{row.num_prompts} "
        f"prompts completed in {duration}{cap}, {row.errors} errors: "
        f"prefill {_figure(row.prefill_tok_s, 1, 'tok/s')}, "
        f"decode {_figure(row.decode_tok_s, 1, 'tok/s')} (aggregate), "
        f"median TTFT {_figure(row.ttft_median_ms, 1, 'ms')}, "
        f"median TPOT {_figure(row.tpot_median_ms, 1, 'ms')}"
        + (
            f" (bursty streams, merged by the {row.burst_source or 'server or client'}: "
            "TPOT times bursts, not decode)"
            if row.bursty
            else ""
        )
    )


def row_metrics(row: BenchmarkRow) -> dict[str, float]:
    """The row's figures for MLflow; unavailable ones are left out, not zeroed."""
    names = (
        "prompts_sent", "prompts_completed", "errors", "capped", "duration_s",
        "prompt_tokens", "output_tokens", "prefill_tok_s", "decode_tok_s",
        "ttft_median_ms", "tpot_median_ms", "bursty", "burst_share",
        "server_prompt_tokens", "server_output_tokens",
    )  # fmt: skip
    values = {name: getattr(row, name) for name in names}
    return {name: float(value) for name, value in values.items() if value is not None}


def read_benchmark_rows(folder: Path) -> list[BenchmarkRow]:
    """The rows in ``folder``'s ``benchmark.jsonl``; a figure added since reads as None."""

    names = BenchmarkRow.field_names()
    return [
        BenchmarkRow(**{name: record.get(name) for name in names})
        for record in read_jsonl(Path(folder) / BENCHMARK_NAME)
    ]


def append_row(path: Path, row: BenchmarkRow) -> None:
    """Append the row to ``benchmark.jsonl`` and sync it to disk."""
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row.as_dict()) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise ResultsError(
            f"The benchmark row could not be written to {path} ({exc}); the measurement "
            "is lost for this folder. Free disk space or fix permissions and run again."
        ) from exc
