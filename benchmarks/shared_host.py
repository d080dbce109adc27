"""Does runner measure N users when the engine runs in another session on the same box?

Linux shares CPU time out by session group (autogroup). A user who starts vLLM in one
terminal and runner in another gives the engine a group of its own; when the engine
keeps the cores busy, runner's event loop waits its turn behind it. This benchmark
starts the tiny CPU engine both ways and measures, in one run:

own session, normal     runner with ``backend.client_priority=normal``: what runner did
                        before it raised its weight
own session, raised     the default: runner's session group at autogroup nice -10
runner's session        the engine a child of the same session as runner (what
                        ``backend=process`` does)

each with ``python -m runner backend=external search=fixed 'search.users=[N]'
search.window_s=40 'workload.buckets=[{total_tokens:576}]' workload.max_tokens=64``,
and beside each engine ``vllm bench serve`` at ``--max-concurrency N`` (random 512 in,
64 out, 50 x N prompts) through :func:`runner.measure.reference.run_reference`. It
prints one Markdown row per run: runner's aggregate, whether the window was valid and
why not, the users' in-flight share, the server's running+waiting mean, the client's
loop lag, the bench client's rate and the ratio of the two.

    python benchmarks/shared_host.py             # about 10 minutes on 2 cores
    python benchmarks/shared_host.py --users 8 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from runner.engines.base import process_fault
from runner.engines.process import SERVER_MODULE
from runner.engines.process import wait_ready as ready_after
from runner.measure.reference import run_reference
from runner.prepare.generated import ensure_tiny_model

CONTEXT = 2048
INPUT_LEN, OUTPUT_LEN = 512, 64


def start_engine(model: Path, port: int, own_session: bool, log: Path) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", SERVER_MODULE, "--model", str(model),
        "--served-model-name", "tiny", "--load-format", "dummy",
        "--kv-cache-memory-bytes", str(2 << 30), "--max-model-len", str(CONTEXT),
        "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log.open("wb") as sink:
        # own_session: as `setsid python -m vllm...` in another terminal would be.
        return subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=own_session)  # fmt: skip


def wait_ready(url: str, engine: subprocess.Popen, log: Path) -> None:
    """runner's own readiness poll, failing at once if the engine exits first."""
    ready_after(
        url, 600,
        lambda: None if engine.poll() is None else process_fault(engine.returncode),
        lambda: "".join(log.read_text(errors="replace").splitlines(True)[-40:]),
    )  # fmt: skip


def stop(engine: subprocess.Popen, own_session: bool) -> None:
    if own_session:
        os.killpg(engine.pid, 15)
    else:
        engine.terminate()
    engine.wait(timeout=120)


def runner_window(url: str, users: int, priority: str, folder: Path) -> dict:
    command = [
        sys.executable, "-m", "runner", "backend=external", f"backend.url={url}",
        f"backend.client_priority={priority}", "search=fixed", f"search.users=[{users}]",
        "search.window_s=40", f"workload.buckets=[{{total_tokens:{INPUT_LEN + OUTPUT_LEN}}}]",
        f"workload.max_tokens={OUTPUT_LEN}", f"results.dir={folder}",
        f"tracking.uri=sqlite:///{folder}/mlflow.db", "smoke.enabled=false",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    row = json.loads((folder / "results.jsonl").read_text().splitlines()[-1])
    detail = json.loads((folder / "windows_detail.jsonl").read_text().splitlines()[-1])["detail"]
    manifest = json.loads((folder / "manifest.json").read_text())
    return {"row": row, "detail": detail, "priority": manifest.get("client_priority")}


def report(label: str, users: int, measured: dict, bench) -> str:
    row, detail = measured["row"], measured["detail"]
    client = detail.get("client") or {}
    streams = detail.get("streams") or {}
    reasons = "; ".join(detail.get("invalid_reasons") or []) or "-"
    ratio = row["aggregate_output_tok_s"] / bench.output_tok_s
    return (
        f"| {label} | {users} | {row['aggregate_output_tok_s']:,.0f} | "
        f"{'valid' if row['valid'] else 'invalid'} | {row['in_flight_pct']:.1f}% | "
        f"{row['server_in_flight_mean']:.1f} | {client.get('loop_lag_p99_ms', 0):.0f} / "
        f"{client.get('loop_lag_max_ms', 0):.0f} ms | {client.get('cpu_pct', 0):.0f}% | "
        f"{100 * (streams.get('burst_share') or 0):.0f}% | {bench.output_tok_s:,.0f} | "
        f"{bench.server_output_tok_s or 0:,.0f} | {ratio:.2f} | {reasons[:160]} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[8])
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args()
    model = ensure_tiny_model(Path.home() / ".cache" / "runner", CONTEXT)
    url = f"http://127.0.0.1:{args.port}"
    print(
        "| engine, runner's priority | N | runner tok/s | row | in flight | server "
        "running+waiting | loop lag p99 / max | client CPU | bursty | bench tok/s | "
        "engine tok/s in bench | runner / bench | reasons |"
    )
    print("|" + " --- |" * 13)
    cases = [("own session", True, "normal"), ("own session", True, "raised"),
             ("runner's session", False, "raised")]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="runner-shared-host-") as scratch:
        for index, (where, own, priority) in enumerate(cases):
            if index == 0 or cases[index - 1][1] != own:
                log = Path(scratch) / f"engine-{index}.log"
                engine = start_engine(model, args.port, own, log)
                wait_ready(url, engine, log)
            for users in args.users:
                folder = Path(scratch) / f"run-{index}-{users}"
                measured = runner_window(url, users, priority, folder)
                bench = run_reference(url, "tiny", str(model), users,
                                      input_len=INPUT_LEN, output_len=OUTPUT_LEN)  # fmt: skip
                print(report(f"{where}, {priority}", users, measured, bench), flush=True)
            if index == len(cases) - 1 or cases[index + 1][1] != own:
                stop(engine, own)


if __name__ == "__main__":
    main()
