"""The pure parts of the smoke checks: stream accounting, the leak line, the report."""

from __future__ import annotations

import json

import pytest

from runner.config import build_config
from runner.errors import EngineError, SmokeError
from runner.smoke import run_smoke
from runner.smoke.probe import SmokeCheck, SmokeReport
from runner.smoke.seed004 import MEMORY_GROWTH_FLOOR_MIB, memory_tolerance_mib, tally_stream
from tests.conftest import compose


def sse(*events: dict | str) -> list[str]:
    """Server-sent-event lines as vLLM's /v1/completions streams them."""
    lines = []
    for event in events:
        lines.append("data: " + (event if isinstance(event, str) else json.dumps(event)))
        lines.append("")
    return lines


def chunk(
    token_ids: list[int], prompt_token_ids: list[int] | None = None, finish: str | None = None
) -> dict:
    return {
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": "x",
                "finish_reason": finish,
                "prompt_token_ids": prompt_token_ids,
                "token_ids": token_ids,
            }
        ],
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def test_streamed_token_ids_are_counted_against_the_usage_record() -> None:
    """seed 004 §5 item 4: the sum of streamed token IDs is what usage must equal."""
    lines = sse(
        chunk([146], prompt_token_ids=[1, 500, 600, 700]),
        chunk([30, 31]),
        chunk([146], finish="length"),
        usage(4, 4),
        "[DONE]",
    )
    tally = tally_stream(lines)
    assert tally.token_ids == 4
    assert tally.usage_completion_tokens == 4
    assert tally.usage_prompt_tokens == 4
    assert tally.prompt_token_ids == [1, 500, 600, 700]
    assert tally.finish_reason == "length"
    assert tally.done and tally.error is None


def test_a_stream_cut_short_is_seen() -> None:
    tally = tally_stream(sse(chunk([1]), chunk([2])))
    assert (tally.done, tally.usage_completion_tokens, tally.token_ids) == (False, None, 2)


def test_a_stream_error_event_is_kept() -> None:
    tally = tally_stream(sse(chunk([1]), {"error": {"message": "engine dead"}}, "[DONE]"))
    assert "engine dead" in (tally.error or "")


def test_a_line_that_is_not_json_raises_value_error() -> None:
    with pytest.raises(ValueError):
        tally_stream(["data: {not json"])


def test_memory_tolerance_has_a_floor_and_grows_with_the_engine() -> None:
    assert memory_tolerance_mib(500.0) == MEMORY_GROWTH_FLOOR_MIB
    assert memory_tolerance_mib(100_000.0) > MEMORY_GROWTH_FLOOR_MIB
    assert memory_tolerance_mib(200_000.0) == 2 * memory_tolerance_mib(100_000.0)


def check(name: str, passed: bool, detail: str = "ok", skipped: bool = False) -> SmokeCheck:
    return SmokeCheck(
        name=name, suite="seed004", passed=passed, detail=detail, seconds=0.5, skipped=skipped
    )


def test_a_failed_check_raises_one_paragraph_naming_it() -> None:
    """seed 004 §5: a failed smoke check stops the run before the search, with the reason."""
    report = SmokeReport(
        checks=[
            check("health", True),
            check("models", False, "the engine serves ['a'], not model.served_name='b'"),
            check("chat", False, "not run: the models check failed first", skipped=True),
        ]
    )
    assert not report.passed
    assert [c.name for c in report.failed] == ["models"]
    with pytest.raises(SmokeError) as caught:
        report.raise_for_failure()
    message = str(caught.value)
    assert isinstance(caught.value, EngineError)
    assert "models: the engine serves ['a'], not model.served_name='b'" in message
    assert "chat not run" in message
    assert "\n" not in message
    assert report.metrics() == {
        "smoke_passed": 0.0,
        "smoke_failed_checks": 1.0,
        "smoke_seconds": 1.5,
    }


def test_a_passing_report_with_skipped_checks_does_not_raise() -> None:
    report = SmokeReport(
        checks=[check("health", True), check("api_key", True, "skipped: no key", skipped=True)]
    )
    report.raise_for_failure()
    assert report.passed
    assert report.as_dict()["checks"][1]["skipped"] is True


def test_disabled_smoke_sends_nothing() -> None:
    """An engine that cannot be reached is never asked when smoke.enabled is false."""
    config = build_config(compose(["smoke.enabled=false"]))

    class Unreachable:
        base_url = "http://127.0.0.1:9"
        log_path = None

    report = run_smoke(Unreachable(), config, [], None)  # type: ignore[arg-type]
    assert (report.enabled, report.checks, report.passed) == (False, [], True)
