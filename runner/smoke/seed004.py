"""Seed 004 section 5's smoke checks: the endpoints answer, a chat completes, the
largest bucket fits, streamed token IDs match the usage count, and repeated requests
neither grow the engine's memory nor preempt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil
from docker.errors import DockerException

from runner.engines.base import RunningEngine
from runner.smoke.probe import (
    CHAT_MAX_TOKENS,
    REASONING_MAX_TOKENS,
    CheckFailed,
    CheckFunction,
    CheckResult,
    Probe,
    chat_message,
    reasoning_text,
    refused,
    wait_engine_idle,
)

# vLLM reports KV usage as a fraction; after the last request it drops to 0, and anything
# above one block's share on a large cache means blocks were not returned.
KV_IDLE_MAX = 0.01
# Engine memory may grow this much over the repeated requests before it counts as a
# leak: the larger of an absolute floor and a share of the engine's resident size.
# After a warm-up request the tiny model's process tree on the CPU moves by well under
# 1 MiB over 8 forced requests; allocator arenas and lazily built kernels for a shape
# not seen before can still add tens of MiB once. A leak that matters over a search of
# tens of thousands of requests must grow by several MiB per request, which 8 repeats
# show above this line. Smaller leaks need a longer soak than a smoke check can afford.
MEMORY_GROWTH_FLOOR_MIB = 64.0
MEMORY_GROWTH_SHARE = 0.01
MIB = 1024.0 * 1024.0


@dataclass
class StreamTally:
    """What one streamed completion said about itself (seed 004 §5 item 4)."""

    token_ids: int = 0
    prompt_token_ids: list[int] | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None


def tally_stream(lines: Iterable[str]) -> StreamTally:
    """Count the token IDs of a server-sent-event stream and keep its usage record.

    Raises ValueError when a ``data:`` line is not JSON.
    """
    tally = StreamTally()
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            tally.done = True
            continue
        event = json.loads(payload)
        if "error" in event:
            tally.error = str(event["error"])[:300]
        for choice in event.get("choices") or []:
            tally.token_ids += len(choice.get("token_ids") or [])
            if tally.prompt_token_ids is None and choice.get("prompt_token_ids") is not None:
                tally.prompt_token_ids = choice["prompt_token_ids"]
            tally.finish_reason = choice.get("finish_reason") or tally.finish_reason
        usage = event.get("usage")
        if usage:
            tally.usage_prompt_tokens = usage.get("prompt_tokens")
            tally.usage_completion_tokens = usage.get("completion_tokens")
    return tally



def memory_tolerance_mib(resident_mib: float) -> float:
    """How much the engine may grow over the repeated requests before it counts as a leak."""
    return max(MEMORY_GROWTH_FLOOR_MIB, MEMORY_GROWTH_SHARE * resident_mib)


def engine_memory_bytes(engine: RunningEngine) -> tuple[int | None, str]:
    """The engine's host memory in bytes and how it was read; ``None`` when not visible.

    GPU memory is not read: vLLM reserves it whole at start, so a leak shows on the host.
    """
    pid = getattr(engine, "pid", None)
    if pid is not None:
        return _process_tree_rss(pid), "resident memory (RSS) of the engine's process tree"
    container = getattr(engine, "container", None)
    if container is not None:
        return _container_memory(container), "container memory usage less inactive page cache"
    return None, f"the memory of a {type(engine).__name__} is not visible to runner"


def _process_tree_rss(pid: int) -> int | None:
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:  # a worker that exited between listing and reading
            continue
        except psutil.Error:
            return None
    return total


def _container_memory(container: Any) -> int | None:
    """What ``docker stats`` shows: usage less inactive file cache (cgroup v1 or v2 key)."""

    try:
        memory = container.stats(stream=False).get("memory_stats") or {}
    except DockerException:
        return None
    usage = memory.get("usage")
    if usage is None:
        return None
    stats = memory.get("stats") or {}
    return int(usage - stats.get("total_inactive_file", stats.get("inactive_file", 0)))


def check_health(probe: Probe, api_key: str | None) -> CheckResult:
    status = probe.get("/health").status_code
    if status != 200:
        raise CheckFailed(f"/health answered HTTP {status}")
    return "/health answered 200", {"status": 200}


def check_models(probe: Probe, api_key: str | None) -> CheckResult:
    response = probe.get("/v1/models")
    if response.status_code != 200:
        hint = (
            " (the engine wants an API key: set engine.api_key_env and export it)"
            if response.status_code == 401
            else ""
        )
        raise CheckFailed(f"/v1/models answered HTTP {response.status_code}{hint}")
    entries = {entry["id"]: entry for entry in response.json()["data"]}
    served = probe.config.model.served_name
    figures: dict[str, Any] = {"models": sorted(entries)}
    if served not in entries:
        raise CheckFailed(
            f"the engine serves {sorted(entries)}, not model.served_name={served!r}, so every "
            "request would be refused: make model.served_name the engine's --served-model-name",
            figures,
        )
    reported = entries[served].get("max_model_len")
    probe.served_max_model_len = reported
    figures["max_model_len"] = reported
    expected = probe.config.engine.max_model_len
    if expected is not None and reported is not None and reported != expected:
        raise CheckFailed(
            f"the engine reports max_model_len {reported}, but engine.max_model_len is {expected}",
            figures,
        )
    return f"serves {served!r} with max_model_len {reported}", figures


def check_metrics(probe: Probe, api_key: str | None) -> CheckResult:
    metrics = probe.metrics()
    read = {
        "vllm:generation_tokens_total": metrics.generation_tokens_total,
        "vllm:num_requests_running": metrics.requests_running,
        "vllm:num_requests_waiting": metrics.requests_waiting,
        "vllm:kv_cache_usage_perc": metrics.kv_cache_usage,
    }
    figures = {**read, "kv_cache_size_tokens": metrics.kv_cache_size_tokens}
    missing = [name for name, value in read.items() if value is None]
    if missing:
        raise CheckFailed(
            f"/metrics lacks {', '.join(missing)}, which every window reads (seed 004 §7)", figures
        )
    return f"/metrics parsed; {len(read)} families the windows read are present", figures


def check_chat(probe: Probe, api_key: str | None) -> CheckResult:
    max_tokens = REASONING_MAX_TOKENS if probe.config.model.reasoning_parser else CHAT_MAX_TOKENS
    answer = probe.chat(
        [{"role": "user", "content": "Say hello in one short sentence."}], max_tokens
    )
    message, finish_reason = chat_message(answer)
    text = message.get("content") or reasoning_text(message)
    completion_tokens = answer["usage"]["completion_tokens"]
    figures = {
        "completion_tokens": completion_tokens,
        "finish_reason": finish_reason,
        "chars": len(text or ""),
    }
    if not text:
        raise CheckFailed("the chat completion returned no text", figures)
    if finish_reason not in ("stop", "length") or completion_tokens > max_tokens:
        raise CheckFailed(
            f"the chat completion ended with finish_reason {finish_reason!r} after "
            f"{completion_tokens} tokens (max_tokens {max_tokens})",
            figures,
        )
    return f"{completion_tokens} tokens of text, finish_reason {finish_reason}", figures


def check_max_total(probe: Probe, api_key: str | None) -> CheckResult:
    prompt = probe.largest()
    largest = probe.config.largest_total
    total = prompt.prompt_tokens + prompt.max_tokens
    figures: dict[str, Any] = {
        "bucket_total": total,
        "max_tokens": prompt.max_tokens,
        "max_model_len": probe.served_max_model_len,
    }
    if total != largest:
        raise CheckFailed(
            f"the workload's largest prompt totals {total} tokens, "
            f"not the largest bucket's {largest}",
            figures,
        )
    try:
        answer = probe.post("/v1/completions", probe.completion_body(prompt, stream=False))
    except CheckFailed as exc:
        if exc.status != 400:
            raise
        raise CheckFailed(
            f"{exc.detail} (a request of {total} tokens must fit the engine's max-model-len, "
            f"{probe.served_max_model_len}: raise engine.max_model_len to at least {largest})",
            figures,
            exc.status,
        ) from exc
    usage, choice = answer["usage"], answer["choices"][0]
    server_ids = choice.get("prompt_token_ids")
    figures.update(
        prompt_tokens=usage["prompt_tokens"],
        completion_tokens=usage["completion_tokens"],
        prompt_ids_verified=server_ids == prompt.token_ids,
    )
    problems = []
    if usage["prompt_tokens"] != prompt.prompt_tokens:
        problems.append(
            f"the server counted {usage['prompt_tokens']} prompt tokens, "
            f"the workload {prompt.prompt_tokens}"
        )
    if server_ids is None:
        problems.append("the server did not return the prompt token IDs (return_token_ids)")
    elif server_ids != prompt.token_ids:
        problems.append(
            "the server-reported prompt token IDs differ from the workload's (seed 004 §6)"
        )
    if usage["completion_tokens"] != prompt.max_tokens:
        problems.append(
            f"it produced {usage['completion_tokens']} of the {prompt.max_tokens} forced output "
            "tokens: vLLM shortens a request to fit its max-model-len "
            f"({probe.served_max_model_len}); "
            f"raise engine.max_model_len to at least {largest}"
        )
    if problems:
        raise CheckFailed("the largest-bucket request: " + "; ".join(problems), figures)
    seen = f"{prompt.prompt_tokens} prompt + {prompt.max_tokens} output = {total} tokens"
    return f"{seen}, prompt IDs verified", figures


def check_stream(probe: Probe, api_key: str | None) -> CheckResult:
    prompt = probe.smallest()
    body = probe.completion_body(prompt, stream=True)
    with probe.client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise refused("/v1/completions", response)
        tally = tally_stream(response.iter_lines())
    figures = {
        "streamed_token_ids": tally.token_ids,
        "usage_completion_tokens": tally.usage_completion_tokens,
        "usage_prompt_tokens": tally.usage_prompt_tokens,
        "max_tokens": prompt.max_tokens,
    }
    problems = []
    if tally.error or not tally.done:
        problems.append(tally.error or "the stream ended without [DONE]")
    if tally.usage_completion_tokens is None:
        problems.append("no usage record (stream_options.include_usage)")
    elif tally.token_ids != tally.usage_completion_tokens:
        problems.append(
            f"{tally.token_ids} streamed token IDs against {tally.usage_completion_tokens} in usage"
        )
    if tally.usage_completion_tokens not in (None, prompt.max_tokens):
        problems.append(
            f"usage reports {tally.usage_completion_tokens} output tokens, "
            f"{prompt.max_tokens} were forced"
        )
    if tally.prompt_token_ids is not None and tally.prompt_token_ids != prompt.token_ids:
        problems.append("the streamed prompt token IDs differ from the workload's")
    if tally.usage_prompt_tokens not in (None, prompt.prompt_tokens):
        problems.append(
            f"usage reports {tally.usage_prompt_tokens} prompt tokens, "
            f"the workload {prompt.prompt_tokens}"
        )
    if problems:
        raise CheckFailed("the streamed request: " + "; ".join(problems), figures)
    return f"{tally.token_ids} streamed token IDs equal usage.completion_tokens", figures


def check_memory(probe: Probe, api_key: str | None) -> CheckResult:
    repeats = probe.config.smoke.memory_repeats
    body = probe.completion_body(probe.smallest(), stream=False)
    probe.post("/v1/completions", body)  # first-time allocations are not growth
    before_metrics = wait_engine_idle(probe)
    before, source = engine_memory_bytes(probe.engine)
    for _ in range(repeats):
        probe.post("/v1/completions", body)
    after_metrics = wait_engine_idle(probe)
    after, _ = engine_memory_bytes(probe.engine)
    figures: dict[str, Any] = {"repeats": repeats, "memory_source": source}
    problems, notes = [], []
    if before_metrics.preemptions_total is None or after_metrics.preemptions_total is None:
        figures["preemptions"] = None
        notes.append("preemptions unavailable")
    else:
        figures["preemptions"] = after_metrics.preemptions_total - before_metrics.preemptions_total
        if figures["preemptions"] > 0:
            problems.append(f"{figures['preemptions']:.0f} preemption(s) at concurrency 1")
    figures["kv_cache_usage_after"] = after_metrics.kv_cache_usage
    if after_metrics.kv_cache_usage is not None and after_metrics.kv_cache_usage > KV_IDLE_MAX:
        problems.append(f"KV cache usage stays at {after_metrics.kv_cache_usage:.1%} when idle")
    if before is None or after is None:
        figures.update(memory_before_mib=None, memory_after_mib=None, memory_growth_mib=None)
        notes.append(f"memory growth unavailable ({source})")
    else:
        growth = (after - before) / MIB
        tolerance = memory_tolerance_mib(before / MIB)
        figures.update(
            memory_before_mib=round(before / MIB, 1),
            memory_after_mib=round(after / MIB, 1),
            memory_growth_mib=round(growth, 2),
            memory_tolerance_mib=round(tolerance, 1),
        )
        if growth > tolerance:
            problems.append(
                f"engine memory grew {growth:.0f} MiB over {repeats} requests "
                f"(tolerance {tolerance:.0f} MiB)"
            )
        else:
            notes.append(f"memory grew {growth:.2f} MiB (tolerance {tolerance:.0f} MiB)")
    if problems:
        raise CheckFailed(f"{repeats} requests at concurrency 1: " + "; ".join(problems), figures)
    return f"{repeats} requests at concurrency 1, no preemption; " + "; ".join(notes), figures


SEED004_CHECKS: list[tuple[str, CheckFunction]] = [
    ("health", check_health),
    ("models", check_models),
    ("metrics", check_metrics),
    ("chat", check_chat),
    ("max_total", check_max_total),
    ("stream_usage", check_stream),
    ("memory", check_memory),
]
