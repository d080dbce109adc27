"""One real measurement window against vLLM CPU (seed 004 §7 protocol, §8 row)."""

from __future__ import annotations

import httpx
import pytest

from runner.config import RunConfig, build_config
from runner.measure.metrics import parse_metrics
from runner.measure.protocol import run_window
from runner.measure.result import WindowRow
from runner.workload.context_mix import build_prompts, load_tokenizer
from runner.workload.prompt import Prompt
from tests.conftest import compose
from tests.integration.conftest import wait_idle

pytestmark = pytest.mark.integration

# No GPU here, and the engine runs without a prefix cache.
UNAVAILABLE_HERE = {"gpu_util_avg_pct", "power_avg_w", "prefix_cache_hit_pct"}


def short_window_config(server) -> RunConfig:
    return build_config(
        compose(
            [
                "workload.buckets=[{total_tokens:128},{total_tokens:256},{total_tokens:512}]",
                "workload.max_tokens=48",
                "workload.prompts_per_bucket=8",
                "workload.request_timeout_s=60",
                "search=fixed",
                "search.window_s=8",
                "search.warmup_s=2",
                "search.drain_timeout_s=60",
                f"model.served_name={server.served_name}",
            ]
        )
    )


def server_metrics(base_url: str):
    return parse_metrics(httpx.get(f"{base_url}/metrics", timeout=30).text)


def test_one_window_measures_every_user_and_passes_the_audit(vllm_server) -> None:
    """seed 004 §7: exact window, per-user token IDs, server counter audit, idle afterwards."""
    config = short_window_config(vllm_server)
    prompts = build_prompts(load_tokenizer(vllm_server.model_dir), config.workload)
    result = run_window(
        vllm_server, config, prompts, 8, config_id="cpu-test", run_id="window-test", phase="coarse"
    )
    row, detail = result.row, result.detail

    assert list(row.as_dict()) == WindowRow.field_names()
    for name, value in row.as_dict().items():
        assert (value is None) == (name in UNAVAILABLE_HERE), name
    assert (row.users, row.window_s, row.config_id, row.run_id) == (
        8,
        8.0,
        "cpu-test",
        "window-test",
    )
    assert row.request_errors == 0
    assert detail.audit_delta_pct is not None and detail.audit_delta_pct <= 1.0, detail
    assert row.valid, detail.invalid_reasons
    assert len(detail.user_tok_s) == 8 and min(detail.user_tok_s) > 0
    assert row.min_user_tok_s <= row.p05_user_tok_s <= row.mean_user_tok_s
    assert row.aggregate_output_tok_s == pytest.approx(sum(detail.user_tok_s))
    # Round-robin: 8 users over 3 buckets is 3/3/2, every bucket measured.
    assert [bucket.users for bucket in detail.buckets] == [3, 3, 2]
    assert all(bucket.requests > 0 and bucket.ttft_p99_ms is not None for bucket in detail.buckets)
    assert row.ttft_p50_ms <= row.ttft_p99_ms <= row.request_latency_p99_ms
    assert detail.requests_completed == detail.requests_dispatched
    assert detail.usage_mismatches == 0  # streamed IDs agree with usage (seed 004 §5)
    assert row.peak_kv_cache_pct > 0
    assert detail.queue.samples >= 8  # 1 Hz sampling through the window
    assert server_metrics(vllm_server.base_url).idle


def test_requests_failing_before_their_first_token_are_errors(vllm_server) -> None:
    """seed 004 §7: a request that fails before its first token is counted, never dropped."""
    config = short_window_config(vllm_server)
    good = build_prompts(load_tokenizer(vllm_server.model_dir), config.workload)[:4]
    # Longer than the engine's max-model-len: vLLM refuses it before any token.
    too_long = Prompt(
        id="too-long",
        bucket_total=8192,
        prompt_tokens=8000,
        max_tokens=48,
        token_ids=[5] * 8000,
        text="",
    )
    result = run_window(
        vllm_server,
        config,
        [*good, too_long],
        2,
        config_id="cpu-test",
        run_id="window-errors",
        phase="coarse",
        window_s=3.0,
    )
    assert result.row.request_errors > 0
    assert not result.row.valid
    assert any("HTTP 400" in reason for reason in result.detail.invalid_reasons)
    assert result.detail.user_tok_s[0] > 0 and result.detail.user_tok_s[1] == 0
    assert result.row.request_latency_p99_ms is not None
    wait_idle(vllm_server.base_url, 30)
