"""Smoke checks against the started engine, before any measured window.

Seed 004 section 5 asks for unscored checks before benchmarking:

1. ``/health``, ``/v1/models`` and ``/metrics`` respond;
2. a short chat completion produces output;
3. a request with prompt + output equal to the largest bucket total succeeds;
4. streamed token IDs and usage counts agree;
5. repeated requests at concurrency one neither grow the engine's memory nor
   trigger preemptions.

Seed 003's checks form an optional second suite (``smoke.seed003``): a reasoning
field when a reasoning parser is configured, a tool call when tools are given and a
tool-call parser is configured, a multi-turn history answered, and the API key
enforced (401 without a key and with a wrong one, 200 with the right one).

"Coherent output" cannot be judged by a program, and a model with random weights
(the generated tiny model) never produces any: the chat check asks only for non-empty
text and a normal finish reason. Every request states ``max_tokens``: vLLM's hidden
default of 16 once made a whole result set invalid (seed 004 §12).

Every check runs even after another fails, so the report names all problems at
once; only a failed /health or /v1/models leaves the rest unrun, since every request
depends on them. A failed check stops the run before the search with
:class:`SmokeError`. Engine memory is the host memory of the engine's process tree
(process backend) or container (docker backend); where runner cannot see it
(backend=external) the growth figure is ``None`` and the check says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import psutil

from runner.config import RunConfig
from runner.engines.base import RunningEngine
from runner.errors import SmokeError
from runner.load import auth_headers
from runner.metrics import EngineMetrics, parse_metrics
from runner.records import Prompt

log = logging.getLogger("runner")

SEED004 = "seed004"
SEED003 = "seed003"
CHAT_MAX_TOKENS = 32
# A reasoning model may spend hundreds of tokens thinking before it answers or calls a tool.
REASONING_MAX_TOKENS = 1024
IDLE_TIMEOUT_S = 30.0
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
WRONG_KEY = "runner-smoke-deliberately-wrong-key"
MIB = 1024.0 * 1024.0


class CheckFailed(Exception):
    """Raised inside a check: ``detail`` says what was wrong, ``figures`` what was seen."""

    def __init__(
        self, detail: str, figures: dict[str, Any] | None = None, status: int | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.figures = figures or {}
        self.status = status  # the HTTP status, when the server refused a request


class Skipped(Exception):
    """Raised inside a check that does not apply to this configuration."""


CheckResult = tuple[str, dict[str, Any]]  # (what was seen, figures)
CheckFunction = Callable[["_Probe", str | None], CheckResult]


@dataclass(frozen=True)
class SmokeCheck:
    """One check's outcome; ``figures`` holds what was measured (for the manifest).

    ``skipped`` with ``passed``: the check does not apply to this configuration.
    ``skipped`` without ``passed``: it was not run because the engine failed a check
    every request depends on (/health or /v1/models).
    """

    name: str
    suite: str
    passed: bool
    detail: str
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False


@dataclass(frozen=True)
class SmokeReport:
    """Every check that ran, in order; empty when ``smoke.enabled`` is false."""

    checks: list[SmokeCheck]
    enabled: bool = True

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def failed(self) -> list[SmokeCheck]:
        """The checks that ran and failed (not those left unrun behind them)."""
        return [check for check in self.checks if not check.passed and not check.skipped]

    def check(self, name: str) -> SmokeCheck:
        return next(check for check in self.checks if check.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "passed": self.passed,
            "checks": [asdict(check) for check in self.checks],
        }

    def metrics(self) -> dict[str, float]:
        """Numbers for the tracker: pass/fail, failures and seconds spent."""
        return {
            "smoke_passed": 1.0 if self.passed else 0.0,
            "smoke_failed_checks": float(len(self.failed)),
            "smoke_seconds": round(sum(check.seconds for check in self.checks), 3),
        }

    def raise_for_failure(self) -> None:
        """Raise :class:`SmokeError` naming every failed check; do nothing when all passed."""
        if self.passed:
            return
        failed = self.failed
        reasons = "; ".join(f"{check.name}: {check.detail}" for check in failed)
        unrun = [check.name for check in self.checks if check.skipped and not check.passed]
        if unrun:
            reasons += f" ({', '.join(unrun)} not run behind that)"
        raise SmokeError(
            f"The engine failed {len(failed)} of {len(self.checks)} smoke check(s) run before "
            f"any measured window (seed 004 §5), so the search did not start: {reasons}. "
            "Fix the engine or the configuration and run again; smoke.enabled=false skips "
            "these checks, but then nothing vouches for the windows that follow."
        )


class _Probe:
    """The requests the checks send, and what earlier checks learned about the engine."""

    def __init__(
        self,
        engine: RunningEngine,
        config: RunConfig,
        prompts: Sequence[Prompt],
        client: httpx.Client,
    ) -> None:
        self.engine = engine
        self.config = config
        self.prompts = list(prompts)
        self.client = client
        self.served_max_model_len: int | None = None

    def get(self, path: str) -> httpx.Response:
        return self.client.get(path)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(path, json=body)
        if response.status_code != 200:
            raise refused(path, response)
        return response.json()

    def chat(self, messages: list[dict[str, str]], max_tokens: int, **extra: Any) -> dict[str, Any]:
        body = {
            "model": self.config.model.served_name,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": self.config.workload.temperature,
            **extra,
        }
        return self.post("/v1/chat/completions", body)

    def completion_body(self, prompt: Prompt, *, stream: bool) -> dict[str, Any]:
        """The body :mod:`runner.load` sends: token IDs, forced output length.

        The length is forced whatever ``workload.ignore_eos`` says: these checks are
        about the longest request the workload can make.
        """
        body: dict[str, Any] = {
            "model": self.config.model.served_name,
            "prompt": prompt.token_ids,
            "max_tokens": prompt.max_tokens,
            "min_tokens": prompt.max_tokens,
            "ignore_eos": True,
            "temperature": self.config.workload.temperature,
            "return_token_ids": True,
        }
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        return body

    def metrics(self) -> EngineMetrics:
        response = self.get("/metrics")
        if response.status_code != 200:
            raise CheckFailed(f"/metrics answered HTTP {response.status_code}")
        try:
            return parse_metrics(response.text)
        except ValueError as exc:
            raise CheckFailed(f"/metrics is not valid Prometheus text ({exc})") from exc

    def smallest(self) -> Prompt:
        return min(self._workload(), key=lambda prompt: prompt.bucket_total)

    def largest(self) -> Prompt:
        return max(self._workload(), key=lambda prompt: prompt.bucket_total)

    def _workload(self) -> list[Prompt]:
        if not self.prompts:
            raise CheckFailed("the workload has no prompts to send")
        return self.prompts


def run_smoke(
    engine: RunningEngine,
    config: RunConfig,
    prompts: Sequence[Prompt],
    api_key: str | None,
    *,
    raise_on_failure: bool = True,
) -> SmokeReport:
    """Run seed 004's smoke checks (and seed 003's when ``smoke.seed003``) against ``engine``.

    Raises :class:`SmokeError` naming every failed check unless ``raise_on_failure`` is
    false; then the caller records the report and calls :meth:`SmokeReport.raise_for_failure`.
    """
    if not config.smoke.enabled:
        log.warning("smoke checks disabled (smoke.enabled=false)")
        return SmokeReport(checks=[], enabled=False)
    suites = [(SEED004, SEED004_CHECKS)]
    if config.smoke.seed003:
        suites.append((SEED003, SEED003_CHECKS))
    timeout = httpx.Timeout(config.workload.request_timeout_s, connect=30.0)
    checks: list[SmokeCheck] = []
    with httpx.Client(
        base_url=engine.base_url, headers=auth_headers(api_key), timeout=timeout
    ) as client:
        probe = _Probe(engine, config, prompts, client)
        for suite, suite_checks in suites:
            for name, run_check in suite_checks:
                blocker = next((c.name for c in checks if c.name in GATES and not c.passed), None)
                if blocker is not None:
                    detail = f"not run: the {blocker} check failed first"
                    checks.append(SmokeCheck(name, suite, False, detail, 0.0, skipped=True))
                    continue
                checks.append(_timed(name, suite, run_check, probe, api_key))
    report = SmokeReport(checks=checks)
    for check in checks:
        log.info(
            "smoke %s: %s (%.1f s) %s",
            check.name,
            "skipped" if check.skipped else "passed" if check.passed else "FAILED",
            check.seconds,
            check.detail,
        )
    if raise_on_failure:
        report.raise_for_failure()
    return report


def _timed(
    name: str, suite: str, run_check: CheckFunction, probe: _Probe, api_key: str | None
) -> SmokeCheck:
    started = time.monotonic()
    passed, skipped, figures = True, False, {}
    try:
        detail, figures = run_check(probe, api_key)
    except Skipped as exc:
        detail, skipped = f"skipped: {exc}", True
    except CheckFailed as exc:
        passed, detail, figures = False, exc.detail, exc.figures
    except httpx.HTTPError as exc:
        passed, detail = False, f"the request failed ({type(exc).__name__}: {exc})"
    except (ValueError, KeyError, IndexError, TypeError) as exc:  # not the JSON vLLM documents
        passed, detail = False, f"the answer could not be read ({type(exc).__name__}: {exc})"
    return SmokeCheck(
        name=name,
        suite=suite,
        passed=passed,
        detail=detail,
        seconds=round(time.monotonic() - started, 3),
        figures=figures,
        skipped=skipped,
    )


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
    from docker.errors import DockerException

    try:
        memory = container.stats(stream=False).get("memory_stats") or {}
    except DockerException:
        return None
    usage = memory.get("usage")
    if usage is None:
        return None
    stats = memory.get("stats") or {}
    return int(usage - stats.get("total_inactive_file", stats.get("inactive_file", 0)))


def refused(path: str, response: httpx.Response) -> CheckFailed:
    """A non-200 answer as a check failure, with the server's own error message."""
    response.read()
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    return CheckFailed(
        f"{path} answered HTTP {response.status_code}: {message}", status=response.status_code
    )


def _message(answer: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    choice = answer["choices"][0]
    return choice["message"], choice.get("finish_reason")


def _reasoning(message: dict[str, Any]) -> str:
    # vLLM 0.32 names it "reasoning"; earlier releases used "reasoning_content".
    return message.get("reasoning") or message.get("reasoning_content") or ""


def _wait_idle(probe: _Probe) -> EngineMetrics:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        metrics = probe.metrics()
        if metrics.idle or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if not metrics.idle:
        raise CheckFailed(
            f"the engine still reports {metrics.requests_running} running and "
            f"{metrics.requests_waiting} waiting requests {IDLE_TIMEOUT_S:.0f} s after the "
            "last answer"
        )
    return metrics


def check_health(probe: _Probe, api_key: str | None) -> CheckResult:
    status = probe.get("/health").status_code
    if status != 200:
        raise CheckFailed(f"/health answered HTTP {status}")
    return "/health answered 200", {"status": 200}


def check_models(probe: _Probe, api_key: str | None) -> CheckResult:
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


def check_metrics(probe: _Probe, api_key: str | None) -> CheckResult:
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


def check_chat(probe: _Probe, api_key: str | None) -> CheckResult:
    max_tokens = REASONING_MAX_TOKENS if probe.config.model.reasoning_parser else CHAT_MAX_TOKENS
    answer = probe.chat(
        [{"role": "user", "content": "Say hello in one short sentence."}], max_tokens
    )
    message, finish_reason = _message(answer)
    text = message.get("content") or _reasoning(message)
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


def check_max_total(probe: _Probe, api_key: str | None) -> CheckResult:
    prompt = probe.largest()
    largest = probe.config.workload.largest_total
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


def check_stream(probe: _Probe, api_key: str | None) -> CheckResult:
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


def check_memory(probe: _Probe, api_key: str | None) -> CheckResult:
    repeats = probe.config.smoke.memory_repeats
    body = probe.completion_body(probe.smallest(), stream=False)
    probe.post("/v1/completions", body)  # first-time allocations are not growth
    before_metrics = _wait_idle(probe)
    before, source = engine_memory_bytes(probe.engine)
    for _ in range(repeats):
        probe.post("/v1/completions", body)
    after_metrics = _wait_idle(probe)
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


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def check_reasoning(probe: _Probe, api_key: str | None) -> CheckResult:
    parser = probe.config.model.reasoning_parser
    if not parser:
        raise Skipped("model.reasoning_parser is not set")
    question = (
        "A bat and ball cost $1.10 total. The bat costs $1.00 more than the ball. "
        "How much is the ball?"
    )
    answer = probe.chat(
        [{"role": "user", "content": question}],
        REASONING_MAX_TOKENS,
        chat_template_kwargs={"enable_thinking": True},
    )
    message, finish_reason = _message(answer)
    reasoning = _reasoning(message)
    figures = {
        "reasoning_chars": len(reasoning),
        "content_chars": len(message.get("content") or ""),
        "finish_reason": finish_reason,
    }
    if not reasoning:
        raise CheckFailed(
            f"the answer has no reasoning field although model.reasoning_parser is {parser}",
            figures,
        )
    return f"reasoning field of {len(reasoning)} characters", figures


def check_tool_call(probe: _Probe, api_key: str | None) -> CheckResult:
    parser = probe.config.model.tool_call_parser
    if not parser:
        raise Skipped("model.tool_call_parser is not set")
    answer = probe.chat(
        [{"role": "user", "content": "What is the weather in Tokyo?"}],
        REASONING_MAX_TOKENS,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    message, finish_reason = _message(answer)
    calls = message.get("tool_calls") or []
    figures: dict[str, Any] = {"finish_reason": finish_reason, "tool_calls": len(calls)}
    if not calls:
        raise CheckFailed(
            f"no tool call came back (finish_reason {finish_reason!r}) although tools were given "
            f"and model.tool_call_parser is {parser}",
            figures,
        )
    function = calls[0]["function"]
    figures.update(function=function["name"], arguments=function.get("arguments"))
    if function["name"] != "get_weather":
        raise CheckFailed(
            f"the tool call names {function['name']!r}, not the offered get_weather", figures
        )
    return f"tool call get_weather({function.get('arguments')})", figures


def check_multi_turn(probe: _Probe, api_key: str | None) -> CheckResult:
    history = [
        {"role": "user", "content": "My name is Alice. Remember it."},
        {"role": "assistant", "content": "Nice to meet you, Alice!"},
        {"role": "user", "content": "What is my name?"},
    ]
    max_tokens = REASONING_MAX_TOKENS if probe.config.model.reasoning_parser else 64
    answer = probe.chat(history, max_tokens)
    message, finish_reason = _message(answer)
    content = message.get("content") or ""
    figures = {"prompt_tokens": answer["usage"]["prompt_tokens"], "finish_reason": finish_reason}
    if not (content or _reasoning(message)):
        raise CheckFailed("a three-message history got an empty answer", figures)
    if probe.config.model.generated:
        return "a three-message history was answered (random weights: recall not judged)", figures
    if "alice" not in content.lower():
        raise CheckFailed(
            f"the answer does not recall the name given two turns earlier: {content[:120]!r}",
            figures,
        )
    return "the name given two turns earlier was recalled", figures


def check_api_key(probe: _Probe, api_key: str | None) -> CheckResult:
    variable = probe.config.engine.api_key_env
    if not variable:
        raise Skipped("engine.api_key_env is not set")
    if not api_key:
        raise CheckFailed(
            f"{variable} is not set in runner's environment, so it cannot present the key"
        )
    attempts = {"without a key": None, "with a wrong key": WRONG_KEY, "with the key": api_key}
    expected = {"without a key": 401, "with a wrong key": 401, "with the key": 200}
    statuses = {}
    with httpx.Client(base_url=probe.engine.base_url, timeout=30.0) as bare:
        for label, key in attempts.items():
            statuses[label] = bare.get("/v1/models", headers=auth_headers(key)).status_code
    figures = {label.replace(" ", "_"): status for label, status in statuses.items()}
    wrong = [
        f"HTTP {statuses[label]} {label} (expected {code})"
        for label, code in expected.items()
        if statuses[label] != code
    ]
    if wrong:
        raise CheckFailed("the API key is not enforced as configured: " + "; ".join(wrong), figures)
    return "401 without a key and with a wrong key, 200 with the key", figures


# Every request depends on these: once one fails, the checks after it are not run.
GATES = frozenset({"health", "models"})
SEED004_CHECKS: list[tuple[str, CheckFunction]] = [
    ("health", check_health),
    ("models", check_models),
    ("metrics", check_metrics),
    ("chat", check_chat),
    ("max_total", check_max_total),
    ("stream_usage", check_stream),
    ("memory", check_memory),
]
SEED003_CHECKS: list[tuple[str, CheckFunction]] = [
    ("reasoning", check_reasoning),
    ("tool_call", check_tool_call),
    ("multi_turn", check_multi_turn),
    ("api_key", check_api_key),
]
