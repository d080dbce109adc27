"""vLLM's own benchmark client at a fixed concurrency, as a reference for runner's windows.

``vllm bench serve --max-concurrency N`` with random prompts of fixed lengths runs in
a process of its own against the same engine; the engine's generation counter is read
before and after, so the rate the server produced during the run sits beside the rate
the benchmark client reports, and the client's own CPU time is kept too: a client
that cannot keep up shows as a client rate under the server's.

``num_prompts`` defaults to 50 x N, so that the ramp-up (the first requests of each
slot) and the drain (the last, while other slots are idle) are about 2% of the run.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from runner.errors import MeasurementError
from runner.measure.metrics import parse_metrics

log = logging.getLogger("runner")

PROMPTS_PER_SLOT = 50
_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


@dataclass(frozen=True)
class ReferenceRun:
    """One ``vllm bench serve`` run and what the server counted meanwhile."""

    users: int
    input_len: int
    output_len: int
    num_prompts: int
    completed: int
    duration_s: float
    output_tok_s: float  # as the benchmark client reports it
    server_output_tok_s: float | None  # the engine's counter over the same run
    client_cpu_pct: float  # the benchmark process's CPU time over its wall time
    ttft_median_ms: float | None
    tpot_median_ms: float | None

    @property
    def client_over_server(self) -> float | None:
        if not self.server_output_tok_s:
            return None
        return self.output_tok_s / self.server_output_tok_s


def run_reference(
    base_url: str,
    model: str,
    tokenizer: str,
    users: int,
    *,
    input_len: int,
    output_len: int,
    num_prompts: int | None = None,
    python: str | None = None,
    seed: int = 0,
) -> ReferenceRun:
    """Run the benchmark client and return its figures; MeasurementError if it fails."""
    prompts = num_prompts or PROMPTS_PER_SLOT * users
    with tempfile.TemporaryDirectory(prefix="runner-reference-") as folder:
        command = [
            python or sys.executable, "-c", _BENCH,
            "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--ignore-eos", "--num-prompts", str(prompts),
            "--max-concurrency", str(users), "--request-rate", "inf", "--seed", str(seed),
            "--num-warmups", "0", "--disable-tqdm", "--save-result", "--result-dir", folder,
            "--result-filename", "result.json",
        ]  # fmt: skip
        before = _generated(base_url)
        started = time.monotonic()
        with (Path(folder) / "bench.log").open("w") as sink:
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - started
        after = _generated(base_url)
        process.returncode = os.waitstatus_to_exitcode(status)
        result_path = Path(folder) / "result.json"
        if process.returncode != 0 or not result_path.exists():
            tail = (Path(folder) / "bench.log").read_text(errors="replace")[-2000:]
            raise MeasurementError(
                f"vllm bench serve at --max-concurrency {users} against {base_url} failed "
                f"(exit {process.returncode}). Its last output:\n{tail}"
            )
        result = json.loads(result_path.read_text())
    duration = float(result["duration"])
    return ReferenceRun(
        users=users,
        input_len=input_len,
        output_len=output_len,
        num_prompts=prompts,
        completed=int(result["completed"]),
        duration_s=duration,
        output_tok_s=float(result["output_throughput"]),
        # The counter moved during the whole process; the benchmark's own duration
        # excludes its start-up, when the engine generated nothing.
        server_output_tok_s=(after - before) / duration if before is not None and after is not None else None,
        client_cpu_pct=100.0 * (usage.ru_utime + usage.ru_stime) / wall,
        ttft_median_ms=result.get("median_ttft_ms"),
        tpot_median_ms=result.get("median_tpot_ms"),
    )


def _generated(base_url: str) -> float | None:
    try:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
    except httpx.HTTPError as exc:
        raise MeasurementError(f"The engine's /metrics at {base_url} cannot be read ({exc}).") from exc
    return parse_metrics(text).generation_tokens_total
