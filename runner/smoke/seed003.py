"""Seed 003's smoke checks (``smoke.seed003``): a reasoning field when a reasoning
parser is configured, a tool call when a tool-call parser is, a multi-turn history
answered, and the API key enforced (401 without a key and with a wrong one, 200 with
the right one).
"""

from __future__ import annotations

from typing import Any

import httpx

from runner.measure.load import auth_headers
from runner.smoke.probe import (
    REASONING_MAX_TOKENS,
    CheckFailed,
    CheckFunction,
    CheckResult,
    Probe,
    Skipped,
    chat_message,
    reasoning_text,
)

WRONG_KEY = "runner-smoke-deliberately-wrong-key"


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


def check_reasoning(probe: Probe, api_key: str | None) -> CheckResult:
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
    message, finish_reason = chat_message(answer)
    reasoning = reasoning_text(message)
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


def check_tool_call(probe: Probe, api_key: str | None) -> CheckResult:
    parser = probe.config.model.tool_call_parser
    if not parser:
        raise Skipped("model.tool_call_parser is not set")
    answer = probe.chat(
        [{"role": "user", "content": "What is the weather in Tokyo?"}],
        REASONING_MAX_TOKENS,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
    )
    message, finish_reason = chat_message(answer)
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


def check_multi_turn(probe: Probe, api_key: str | None) -> CheckResult:
    history = [
        {"role": "user", "content": "My name is Alice. Remember it."},
        {"role": "assistant", "content": "Nice to meet you, Alice!"},
        {"role": "user", "content": "What is my name?"},
    ]
    max_tokens = REASONING_MAX_TOKENS if probe.config.model.reasoning_parser else 64
    answer = probe.chat(history, max_tokens)
    message, finish_reason = chat_message(answer)
    content = message.get("content") or ""
    figures = {"prompt_tokens": answer["usage"]["prompt_tokens"], "finish_reason": finish_reason}
    if not (content or reasoning_text(message)):
        raise CheckFailed("a three-message history got an empty answer", figures)
    if probe.config.model.generated:
        return "a three-message history was answered (random weights: recall not judged)", figures
    if "alice" not in content.lower():
        raise CheckFailed(
            f"the answer does not recall the name given two turns earlier: {content[:120]!r}",
            figures,
        )
    return "the name given two turns earlier was recalled", figures


def check_api_key(probe: Probe, api_key: str | None) -> CheckResult:
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


SEED003_CHECKS: list[tuple[str, CheckFunction]] = [
    ("reasoning", check_reasoning),
    ("tool_call", check_tool_call),
    ("multi_turn", check_multi_turn),
    ("api_key", check_api_key),
]
