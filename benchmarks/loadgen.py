"""Is runner's load generator ever the bottleneck? The client alone, against nginx.

nginx (Debian's ``nginx-light``) serves a static SSE body shaped like vLLM's
``/v1/completions`` stream (one token ID per event, a usage event, ``[DONE]``), so
the server costs next to nothing and whatever limits the figures is the client.
Two servers run side by side (``benchmarks/loadgen/nginx.conf``):

paced    one event per write, ``--tok-s`` tokens/s per stream: a stream lasts
         ``--tokens / --tok-s`` seconds, so ``users`` streams stay concurrent and
         the client must take ``users * tok_s`` small reads per second;
burst    the same body unpaced: the ceiling, the most tokens/s the client parses.

Runner's :class:`~runner.measure.load.LoadGenerator` (with the client-health probe of each
window: loop lag p99, CPU, open connections) and vLLM's own ``vllm bench serve``
client (``benchmarks/loadgen/vllm_bench_serve.py``) are measured in turn against the
same servers in the same run, each in its own process, and compared:

    python benchmarks/loadgen.py                      # about 8 minutes on 2 cores
    python benchmarks/loadgen.py --users 64 1024 --no-vllm

Figures per client: tokens/s received, streams held (established connections, the
lowest reading for runner, the highest for vLLM's client, which only reports its
results at the end), loop-lag p99 (runner only: vLLM's client has no probe), the
process's CPU and its peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PREFIX_KEYS = ("@PREFIX@", "@PACED_PORT@", "@BURST_PORT@", "@EVENT_BYTES@", "@PACED_RATE@")
LOOP_LAG_TARGET_MS = 10.0
STREAMS_TARGET = 1024


# ---- the zero-cost server ---------------------------------------------------------


def sse_body(tokens: int) -> tuple[bytes, int]:
    """vLLM-shaped completion events, every token event the same length; and that length."""
    events = []
    for i in range(tokens):
        token_id = 1000 + (i * 37) % 3000  # four digits: equal event lengths
        finish = '"length"' if i == tokens - 1 else "null    "
        events.append(
            'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"tiny",'
            f'"choices":[{{"index":0,"text":"t{token_id}","logprobs":null,'
            f'"finish_reason":{finish},"stop_reason":null,"token_ids":[{token_id}]}}],'
            '"usage":null}\n\n'
        )
    assert len({len(event) for event in events}) == 1
    events.append(
        'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"tiny",'
        f'"choices":[],"usage":{{"prompt_tokens":32,"total_tokens":{32 + tokens},'
        f'"completion_tokens":{tokens}}}}}\n\n'
    )
    events.append("data: [DONE]\n\n")
    return "".join(events).encode(), len(events[0])


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Nginx:
    def __init__(self, tokens: int, tok_s: float) -> None:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            sys.exit("nginx is not installed: apt-get install -y nginx-light")
        self.prefix = Path(tempfile.mkdtemp(prefix="runner-loadgen-"))
        self.prefix.chmod(0o755)  # nginx's workers drop root and must read the body
        (self.prefix / "www").mkdir()
        (self.prefix / "tmp").mkdir()
        body, event_bytes = sse_body(tokens)
        (self.prefix / "www" / "stream.sse").write_bytes(body)
        self.paced_port, self.burst_port = free_port(), free_port()
        values = (
            self.prefix,
            self.paced_port,
            self.burst_port,
            event_bytes,
            round(event_bytes * tok_s),
        )
        conf = (HERE / "loadgen" / "nginx.conf").read_text()
        for key, value in zip(PREFIX_KEYS, values, strict=True):
            conf = conf.replace(key, str(value))
        (self.prefix / "nginx.conf").write_text(conf)
        self.process = subprocess.Popen(
            [nginx, "-p", str(self.prefix), "-c", str(self.prefix / "nginx.conf")],
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while not all(_listening(port) for port in (self.paced_port, self.burst_port)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"nginx did not start: {self.process.stderr.read().decode()}")
            time.sleep(0.05)

    def url(self, paced: bool) -> str:
        return f"http://127.0.0.1:{self.paced_port if paced else self.burst_port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        shutil.rmtree(self.prefix, ignore_errors=True)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ---- runner's client, in a process of its own --------------------------------------


async def runner_client(url: str, users: int, window_s: float, warmup_s: float) -> dict:
    from runner.measure.clienthealth import ClientHealthProbe
    from runner.measure.load import LoadGenerator
    from runner.workload.prompt import Prompt

    prompts = [
        Prompt(id=f"p{i}", bucket_total=160, prompt_tokens=32, max_tokens=128,
               token_ids=list(range(100 + i, 132 + i)), text="")
        for i in range(64)
    ]  # fmt: skip
    load = LoadGenerator(
        url, prompts, users, served_name="tiny", ignore_eos=True, temperature=0.0,
        request_timeout_s=600.0,
    )  # fmt: skip
    async with load:
        load.start()
        await asyncio.sleep(warmup_s)
        probe = ClientHealthProbe(url, users)
        await probe.start()
        t0 = time.monotonic()
        await asyncio.sleep(window_s)
        t1 = time.monotonic()
        health = await probe.stop()
        load.stop_dispatch()
        await load.drain(60)
    tokens = sum(record.tokens_between(t0, t1) for record in load.records)
    return {
        "tok_s": tokens / (t1 - t0),
        "streams": health.open_connections,
        "loop_lag_p99_ms": health.loop_lag_p99_ms,
        "cpu_pct": health.cpu_pct,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "errors": sum(1 for record in load.records if record.error is not None),
        "usage_mismatches": sum(
            1
            for record in load.records
            if record.error is None and record.usage_completion_tokens != record.tokens
        ),
    }


def measure_runner(url: str, users: int, window_s: float, warmup_s: float) -> dict:
    command = [sys.executable, __file__, "_runner", url, str(users), str(window_s), str(warmup_s)]
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=REPO, timeout=300, check=False
    )
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- vLLM's client ---------------------------------------------------------------


def measure_vllm(url: str, users: int, prompts: int, tokenizer: Path, workdir: Path) -> dict:
    result = workdir / f"vllm-{users}.json"
    command = [
        sys.executable, str(HERE / "loadgen" / "vllm_bench_serve.py"),
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "128",
        "--max-concurrency", str(users), "--num-prompts", str(prompts),
        "--num-warmups", "0", "--disable-tqdm", "--save-result",
        "--result-dir", str(workdir), "--result-filename", result.name,
    ]  # fmt: skip
    port = int(url.rsplit(":", 1)[1])
    process = psutil.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=workdir)
    peak_rss = streams = 0
    cpu = 0.0
    while process.poll() is None:
        try:
            with process.oneshot():
                peak_rss = max(peak_rss, process.memory_info().rss)
                times = process.cpu_times()
                cpu = times.user + times.system
            held = sum(
                1
                for conn in process.net_connections(kind="tcp")
                if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and conn.raddr.port == port
            )
            streams = max(streams, held)
        except psutil.Error:
            break
        time.sleep(0.5)
    output = process.stdout.read().decode(errors="replace")
    if process.returncode != 0 or not result.exists():
        return {"failed": output.strip().splitlines()[-3:]}
    figures = json.loads(result.read_text())
    return {
        "tok_s": figures["output_throughput"],
        "streams": streams,
        "loop_lag_p99_ms": None,
        "cpu_pct_of_run": cpu / figures["duration"] * 100.0,  # includes its start-up
        "rss_mib": peak_rss / 2**20,
        "errors": figures["num_prompts"] - figures["completed"],
    }


# ---- the run -----------------------------------------------------------------------


def row(label: str, users: int, mode: str, figures: dict) -> str:
    def fmt(key: str, spec: str) -> str:
        value = figures.get(key)
        return "n/a" if value is None else format(value, spec)

    if "failed" in figures:
        return f"| {label} | {mode} | {users} | failed: {figures['failed']} | | | | | |"
    cpu = figures.get("cpu_pct", figures.get("cpu_pct_of_run"))
    return (
        f"| {label} | {mode} | {users} | {fmt('tok_s', ',.0f')} | {fmt('streams', 'd')} | "
        f"{fmt('loop_lag_p99_ms', '.1f')} | {'n/a' if cpu is None else f'{cpu:.0f}'} | "
        f"{fmt('rss_mib', '.0f')} | {figures.get('errors')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, nargs="+", default=[64, 256, 1024, 2048])
    parser.add_argument("--ceiling-users", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per stream")
    parser.add_argument("--tok-s", type=float, default=20.0, help="paced tokens/s per stream")
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--no-vllm", action="store_true", help="measure runner's client only")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from runner.prepare.generated import ensure_tiny_model

    tokenizer = ensure_tiny_model(Path("~/.cache/runner"), 4096)
    server = Nginx(args.tokens, args.tok_s)
    workdir = Path(tempfile.mkdtemp(prefix="runner-loadgen-results-"))
    stream_s = args.tokens / args.tok_s
    print(f"{os.cpu_count()} cores; streams of {args.tokens} tokens at {args.tok_s:g} tok/s "
          f"({stream_s:g} s) paced, unpaced for the ceiling at {args.ceiling_users} users\n")  # fmt: skip
    print("| client | server | users | tokens/s | streams held | loop lag p99 ms | CPU % | "
          "peak RSS MiB | errors |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    results: dict[tuple[str, str, int], dict] = {}
    plan = [("paced", users) for users in args.users] + [("burst", args.ceiling_users)]
    try:
        for mode, users in plan:
            url = server.url(paced=mode == "paced")
            results["runner", mode, users] = figures = measure_runner(
                url, users, args.window_s, args.warmup_s
            )
            print(row("runner", users, mode, figures), flush=True)
            if args.no_vllm:
                continue
            # Enough requests to cover warm-up and window at this concurrency.
            rounds = (
                max(2, round((args.window_s + args.warmup_s) / stream_s)) if mode == "paced" else 40
            )
            results["vllm", mode, users] = figures = measure_vllm(
                url, users, users * rounds, tokenizer, workdir
            )
            print(row("vllm bench serve", users, mode, figures), flush=True)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    verdict(results, args)


def delivered(results: dict, users: int, nominal: float) -> float:
    """What the server really sent: its nominal pace, or less when it paced late.

    nginx's single worker falls behind its own limit_rate under many timers; when
    vLLM's client, on the same server in the same run, received less than nominal,
    that is the server's rate, and runner is held to it rather than to the nominal.
    """
    theirs = results.get(("vllm", "paced", users))
    if theirs and "failed" not in theirs and theirs.get("tok_s"):
        return min(nominal, theirs["tok_s"])
    return nominal


def verdict(results: dict, args: argparse.Namespace) -> None:
    expected = {users: users * args.tok_s for users in args.users}
    held = [
        users
        for users in args.users
        if (r := results.get(("runner", "paced", users)))
        and "failed" not in r
        and r["errors"] == 0
        and r["streams"] is not None
        and r["streams"] >= users
        and r["loop_lag_p99_ms"] <= LOOP_LAG_TARGET_MS
        and r["tok_s"] >= 0.97 * delivered(results, users, expected[users])
    ]
    most = max(held, default=None)
    print(f"runner holds {most} concurrent paced streams with loop lag p99 <= "
          f"{LOOP_LAG_TARGET_MS:g} ms (target {STREAMS_TARGET}): "
          f"{'met' if most and most >= STREAMS_TARGET else 'MISSED'}")  # fmt: skip
    for users in args.users:
        ours, theirs = (
            results.get(("runner", "paced", users)),
            results.get(("vllm", "paced", users)),
        )
        if ours and theirs and "failed" not in ours and "failed" not in theirs:
            print(f"paced {users} users: tokens/s runner/vLLM client "
                  f"{ours['tok_s'] / theirs['tok_s']:.2f}, peak RSS {ours['rss_mib'] / theirs['rss_mib']:.2f}")  # fmt: skip
    ours = results.get(("runner", "burst", args.ceiling_users))
    theirs = results.get(("vllm", "burst", args.ceiling_users))
    if ours and theirs and "failed" not in ours and "failed" not in theirs:
        ratio = ours["tok_s"] / theirs["tok_s"]
        print(f"ceiling (unpaced, {args.ceiling_users} users): runner/vLLM client {ratio:.2f} "
              f"(target >= 2): {'met' if ratio >= 2 else 'MISSED'}")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_runner":
        sys.path.insert(0, str(REPO))
        url, users, window_s, warmup_s = (
            sys.argv[2],
            int(sys.argv[3]),
            float(sys.argv[4]),
            float(sys.argv[5]),
        )
        from runner.measure.transport import run  # the event loop runner's windows run on

        print(json.dumps(run(runner_client(url, users, window_s, warmup_s))))
    else:
        main()
