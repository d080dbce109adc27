"""``python -m runner.reference``: vLLM's own benchmark client against the same engine,
logged to MLflow beside runner's windows, so the agreement can be seen on any box.

    python -m runner.reference --url http://127.0.0.1:8000 --model tiny \\
        --tokenizer ~/.cache/runner/models/tiny-llama-... --users 1 8 32 \\
        --input-len 512 --output-len 64 --run-id cpu-tiny-20261203-101500

For each N it prints vLLM's client rate, the rate the engine's own counter saw during
that run, and the client's CPU (see :mod:`runner.measure.reference`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rich.console import Console

from runner.config import Tracking
from runner.errors import RunnerError
from runner.measure.reference import run_reference
from runner.output.reference import log_reference

log = logging.getLogger("runner")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.reference",
        description="vllm bench serve at fixed concurrencies, beside runner's windows in MLflow.",
    )
    parser.add_argument("--url", required=True, help="the engine's base URL")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--tokenizer", required=True, help="the model's tokenizer (a local folder)")
    parser.add_argument("--users", type=int, nargs="+", required=True, help="max concurrency N")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=None, help="default: 50 x N")
    parser.add_argument("--run-id", default=None, help="the search to log the runs beside")
    parser.add_argument("--tracking-uri", default=Tracking().uri)
    parser.add_argument("--experiment", default=Tracking().experiment)
    args = parser.parse_args(argv)
    console = Console(highlight=False, soft_wrap=True)
    tracking = Tracking(uri=args.tracking_uri, experiment=args.experiment)
    try:
        for users in args.users:
            reference = run_reference(
                args.url.rstrip("/"), args.model, args.tokenizer, users,
                input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts,
            )  # fmt: skip
            mlflow_id = log_reference(tracking, reference, args.run_id)
            server = reference.server_output_tok_s
            console.print(
                f"vllm bench serve N={users}: {reference.output_tok_s:,.1f} output tok/s "
                f"(engine counter: {f'{server:,.1f}' if server else 'n/a'} tok/s), "
                f"{reference.completed}/{reference.num_prompts} prompts in "
                f"{reference.duration_s:.1f} s, client CPU {reference.client_cpu_pct:.0f}% "
                f"[MLflow run {mlflow_id}]"
            )
    except RunnerError as exc:
        Console(stderr=True).print(f"runner.reference: {exc}", markup=False, highlight=False)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
