"""What every smoke check shares: the probe that sends its requests, the outcome
types, and the failure a check raises. The checks themselves live in
:mod:`runner.smoke.seed004` and :mod:`runner.smoke.seed003`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from runner.config import RunConfig
from runner.engines.base import RunningEngine
from runner.errors import SmokeError
from runner.measure.metrics import EngineMetrics, parse_metrics
from runner.workload.prompt import Prompt

CHAT_MAX_TOKENS = 32
# A reasoning model may spend hundreds of tokens thinking before it answers or calls a tool.
REASONING_MAX_TOKENS = 1024
IDLE_TIMEOUT_S = 30.0


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
CheckFunction = Callable[["Probe", str | None], CheckResult]


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


class Probe:
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


def chat_message(answer: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    choice = answer["choices"][0]
    return choice["message"], choice.get("finish_reason")


def reasoning_text(message: dict[str, Any]) -> str:
    # vLLM 0.32 names it "reasoning"; earlier releases used "reasoning_content".
    return message.get("reasoning") or message.get("reasoning_content") or ""


def wait_engine_idle(probe: Probe) -> EngineMetrics:
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
