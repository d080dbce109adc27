"""Smoke checks against a real vLLM CPU before any window (seed 004 §5, seed 003's checks)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from runner.config import RunConfig, build_config
from runner.engines.base import LaunchPlan
from runner.engines.process import ProcessEngine
from runner.errors import SmokeError
from runner.measure.metrics import parse_metrics
from runner.smoke import SEED003, SEED004, run_smoke
from runner.workload.context_mix import build_prompts, load_tokenizer
from runner.workload.prompt import Prompt
from tests.conftest import compose
from tests.integration.conftest import EAGER, KV_CACHE_ARGS, TINY_CONTEXT, free_port

pytestmark = pytest.mark.integration

SEED_004_CHECKS = ["health", "models", "metrics", "chat", "max_total", "stream_usage", "memory"]
SEED_003_CHECKS = ["reasoning", "tool_call", "multi_turn", "api_key"]


def smoke_config(*overrides: str) -> RunConfig:
    return build_config(
        compose(
            [
                "workload.buckets=[{total_tokens:128},{total_tokens:512},{total_tokens:1024}]",
                "workload.max_tokens=64",
                "workload.prompts_per_bucket=2",
                "workload.request_timeout_s=60",
                "model.served_name=tiny",
                f"engine.max_model_len={TINY_CONTEXT}",
                *overrides,
            ]
        )
    )


def prompts_for(config: RunConfig, model_dir: Path) -> list[Prompt]:
    return build_prompts(load_tokenizer(model_dir), config.workload)


def assert_idle(base_url: str) -> None:
    assert parse_metrics(httpx.get(f"{base_url}/metrics", timeout=30).text).idle


# The limit covers the shared engine's start when this test is the session's first user.
@pytest.mark.timeout(600)
def test_seed_004_checks_pass_and_report_their_figures(vllm_server) -> None:
    """seed 004 §5: endpoints answer, a chat completion, a request at prompt + output equal
    to the largest bucket with the server's prompt token IDs verified (§6), streamed IDs
    equal to usage, and no memory growth or preemption over repeats at concurrency 1."""
    config = smoke_config()
    prompts = prompts_for(config, vllm_server.model_dir)
    largest = max(prompts, key=lambda prompt: prompt.bucket_total)

    report = run_smoke(vllm_server.engine, config, prompts, None)

    assert report.passed and report.enabled
    assert [check.name for check in report.checks] == SEED_004_CHECKS
    assert {check.suite for check in report.checks} == {SEED004}
    assert all(check.seconds >= 0 and not check.skipped for check in report.checks)
    figures = {check.name: check.figures for check in report.checks}
    assert figures["models"]["models"] == ["tiny"]
    assert figures["models"]["max_model_len"] == TINY_CONTEXT
    assert figures["metrics"]["vllm:generation_tokens_total"] is not None
    assert 0 < figures["chat"]["completion_tokens"] <= 32 and figures["chat"]["chars"] > 0
    max_total = figures["max_total"]
    assert max_total["prompt_tokens"] == largest.prompt_tokens
    assert max_total["completion_tokens"] == config.workload.max_tokens
    assert (
        max_total["prompt_tokens"] + max_total["completion_tokens"] == config.workload.largest_total
    )
    assert max_total["prompt_ids_verified"] is True
    stream = figures["stream_usage"]
    assert (
        stream["streamed_token_ids"]
        == stream["usage_completion_tokens"]
        == config.workload.max_tokens
    )
    memory = figures["memory"]
    assert memory["repeats"] == config.smoke.memory_repeats
    assert memory["memory_before_mib"] > 0 and memory["memory_after_mib"] > 0
    assert memory["memory_growth_mib"] <= memory["memory_tolerance_mib"]
    assert memory["preemptions"] == 0
    assert memory["kv_cache_usage_after"] is not None and memory["kv_cache_usage_after"] <= 0.01
    assert report.as_dict()["passed"] is True
    assert_idle(vllm_server.base_url)


@pytest.mark.timeout(60)
def test_a_served_name_the_engine_does_not_serve_stops_the_run(vllm_server) -> None:
    """seed 004 §5: /v1/models must list the served name; every request depends on it,
    so the checks behind it are not run and the error names the cause."""
    config = smoke_config("model.served_name=not-tiny")
    prompts = prompts_for(config, vllm_server.model_dir)

    report = run_smoke(vllm_server.engine, config, prompts, None, raise_on_failure=False)
    assert [check.name for check in report.failed] == ["models"]
    assert "not model.served_name='not-tiny'" in report.check("models").detail
    assert "'tiny'" in report.check("models").detail
    unrun = [check.name for check in report.checks if check.skipped and not check.passed]
    assert unrun == SEED_004_CHECKS[2:]

    with pytest.raises(
        SmokeError, match=r"models: the engine serves \['tiny'\], not model.served_name='not-tiny'"
    ):
        run_smoke(vllm_server.engine, config, prompts, None)


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "largest_total",
    [
        # The prompt fits but prompt + output does not: vLLM shortens max_tokens to fit,
        # then refuses min_tokens above it (without min_tokens it would answer short).
        TINY_CONTEXT + 54,
        # The prompt alone is longer than max-model-len.
        TINY_CONTEXT + 104,
    ],
)
def test_a_largest_bucket_beyond_max_model_len_fails_the_max_total_check(
    vllm_server, largest_total: int
) -> None:
    """seed 004 §5 item 3: a request with prompt + output equal to the largest total succeeds."""
    config = smoke_config(
        f"workload.buckets=[{{total_tokens:128}},{{total_tokens:{largest_total}}}]",
        "smoke.memory_repeats=2",
    )
    prompts = prompts_for(config, vllm_server.model_dir)

    report = run_smoke(vllm_server.engine, config, prompts, None, raise_on_failure=False)

    assert [check.name for check in report.failed] == ["max_total"]
    max_total = report.check("max_total")
    assert "answered HTTP 400" in max_total.detail
    assert f"raise engine.max_model_len to at least {largest_total}" in max_total.detail
    assert max_total.figures["max_model_len"] == TINY_CONTEXT
    with pytest.raises(SmokeError, match="max_total"):
        report.raise_for_failure()
    assert_idle(vllm_server.base_url)


@pytest.mark.timeout(60)
def test_memory_of_an_engine_runner_cannot_see_is_unavailable_not_zero(vllm_server) -> None:
    """seed 004 §5 item 5 on an engine without a process id or container (as behind
    backend=external): growth is reported unavailable, preemptions are still read."""
    config = smoke_config("smoke.memory_repeats=2")
    prompts = prompts_for(config, vllm_server.model_dir)

    report = run_smoke(vllm_server, config, prompts, None)  # the fixture's wrapper has no pid

    memory = report.check("memory")
    assert memory.passed and "memory growth unavailable" in memory.detail
    assert memory.figures["memory_growth_mib"] is None
    assert memory.figures["preemptions"] == 0


@pytest.mark.timeout(60)
def test_an_engine_that_accepts_requests_without_a_key_fails_the_key_check(vllm_server) -> None:
    """seed 003 (API key enforcement): a key is configured, but this engine answers anyone."""
    config = smoke_config(
        "smoke.seed003=true", "smoke.memory_repeats=2", "engine.api_key_env=VLLM_API_KEY"
    )
    prompts = prompts_for(config, vllm_server.model_dir)

    report = run_smoke(
        vllm_server.engine,
        config,
        prompts,
        "a-key-the-engine-never-asks-for",
        raise_on_failure=False,
    )

    assert [check.name for check in report.checks] == SEED_004_CHECKS + SEED_003_CHECKS
    assert [check.name for check in report.failed] == ["api_key"]
    assert "HTTP 200 without a key (expected 401)" in report.check("api_key").detail
    # The tiny model has no parsers: those checks do not apply and say so.
    for name in ("reasoning", "tool_call"):
        assert report.check(name).skipped and report.check(name).passed
    multi_turn = report.check("multi_turn")
    assert (
        multi_turn.passed
        and multi_turn.suite == SEED003
        and multi_turn.figures["prompt_tokens"] > 0
    )


@pytest.mark.timeout(480)
def test_a_second_engine_started_with_an_api_key_enforces_it(
    vllm_server, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """seed 003 (API key enforcement): 401 without a key and with a wrong key, 200 with the
    key; every other smoke request carries the key. The key reaches the engine only
    through its environment (VLLM_API_KEY), never its argv."""
    key = "runner-test-key-4f1c"
    monkeypatch.setenv("VLLM_API_KEY", key)
    max_model_len = 1024
    port = free_port(8600)
    plan = LaunchPlan(
        image=None,
        argv=[
            "--model",
            str(tiny_model_dir),
            "--served-model-name",
            "tiny",
            "--load-format",
            "dummy",
            *KV_CACHE_ARGS,
            "--max-model-len",
            str(max_model_len),
            "--max-num-seqs",
            "8",
            "--no-enable-prefix-caching",
            *EAGER,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        secret_env=["VLLM_API_KEY"],
        port=port,
    )
    config = smoke_config(
        "workload.buckets=[{total_tokens:128},{total_tokens:256}]",
        f"engine.max_model_len={max_model_len}",
        "engine.api_key_env=VLLM_API_KEY",
        "smoke.seed003=true",
        "smoke.memory_repeats=2",
    )
    prompts = prompts_for(config, tiny_model_dir)
    with ProcessEngine(plan, log_dir=tmp_path, startup_timeout_s=420) as engine:
        report = run_smoke(engine, config, prompts, key)
        assert report.passed, report.failed
        assert report.check("api_key").figures == {
            "without_a_key": 401,
            "with_a_wrong_key": 401,
            "with_the_key": 200,
        }
        keyless = run_smoke(engine, config, prompts, None, raise_on_failure=False)
    assert "answered HTTP 401" in keyless.check("models").detail
    assert keyless.check("api_key").skipped and not keyless.check("api_key").passed
    assert key not in (tmp_path / "engine.log").read_text()
