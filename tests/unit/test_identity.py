"""config_id names the served engine; family and run id follow seed 004's naming."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from runner.config import RunConfig
from runner.prepare.identity import config_id, family, new_run_id

BASE: dict[str, Any] = {
    "hw": {"name": "rtx5090", "gpu_name": "NVIDIA GeForce RTX 5090", "count": 1,
           "memory_gib": 31.8, "compute_capability": [12, 0], "arch": "blackwell",
           "native_precisions": ["bf16", "fp8", "nvfp4", "nvfp4a16"], "min_driver": "595.58.03"},
    "image": {"name": "nightly", "repository": "vllm/vllm-openai", "tag": "nightly",
              "digest": "sha256:a671d5fcda70fe9ac6f245f9780821de459fb4ee22c018fd07a0f10a55279bf9"},
    "model": {"name": "llama31_8b_nvfp4", "repo": "nvidia/Llama-3.1-8B-Instruct-NVFP4",
              "revision": "a" * 40, "weights": "nvfp4", "quantization": "modelopt_fp4",
              "served_name": "llama31-8b-nvfp4", "max_context": 131072},
    "kv": {"name": "nvfp4", "cache_dtype": "nvfp4", "precision": "nvfp4"},
    "engine": {"name": "llama8b_rtx5090", "max_num_seqs": 256, "max_model_len": 30000,
               "gpu_memory_utilization": 0.92, "enable_chunked_prefill": True},
    "workload": {"name": "context_mix", "buckets": [{"total_tokens": 1000}], "max_tokens": 512},
    "search": {"kind": "bracket"},
    "backend": {"kind": "docker"},
    "results": {"dir": "results/a"},
}


def make_config(**changes: dict[str, Any] | Any) -> RunConfig:
    data = dict(BASE)
    for key, value in changes.items():
        data[key] = data[key] | value if isinstance(value, dict) and key in data else value
    return RunConfig.model_validate(data)


def test_config_id_is_twelve_hex_digits_and_stable() -> None:
    assert re.fullmatch(r"[0-9a-f]{12}", config_id(make_config()))
    assert config_id(make_config()) == config_id(make_config())


@pytest.mark.parametrize(
    "change",
    [
        {"workload": {"name": "other", "max_tokens": 256}},
        {"search": {"kind": "fixed", "users": [4]}},
        {"slo": {"min_user_tok_s": 20.0}},
        {"backend": {"kind": "external", "url": "http://10.0.0.1:8000"}},
        {"tracking": {"enabled": False}},
        {"results": {"dir": "/somewhere/else"}},
        {"run_id": "another-run"},
        {"engine": {"port": 20000}},
        {"engine": {"name": "renamed"}},
        {"engine": {"api_key_env": "VLLM_API_KEY"}},
        {"model": {"served_name": "another-name"}},
        {"cache_dir": "/tmp/cache"},
    ],
)
def test_what_does_not_change_the_served_engine_keeps_the_id(change: dict[str, Any]) -> None:
    assert config_id(make_config(**change)) == config_id(make_config())


@pytest.mark.parametrize(
    "change",
    [
        {"hw": None},
        {"hw": {"count": 2}},
        {"image": {"digest": "sha256:" + "1" * 64}},
        {"image": {"vllm_version": "0.20.0"}},
        {"model": {"revision": "b" * 40}},
        {"model": {"quantization": "modelopt"}},
        {"kv": {"name": "fp8", "cache_dtype": "fp8", "precision": "fp8"}},
        {"engine": {"max_num_seqs": 128}},
        {"engine": {"max_num_batched_tokens": 8192}},
        {"engine": {"enable_prefix_caching": True}},
        {"engine": {"extra_args": ["--enforce-eager"]}},
        {"engine": {"env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}},
    ],
)
def test_any_change_to_the_served_engine_gives_a_new_id(change: dict[str, Any]) -> None:
    """seed 004 §10: every changed server setup gets a new config_id."""
    assert config_id(make_config(**change)) != config_id(make_config())


@pytest.mark.parametrize(
    ("weights", "kv", "expected"),
    [
        ("bf16", "auto", "bf16"),
        ("bf16", "bf16", "bf16"),
        ("bf16", "fp8", "bf16-fp8kv"),
        ("fp8", "fp8", "fp8-fp8kv"),
        ("nvfp4a16", "auto", "nvfp4a16"),
        ("nvfp4", "fp8", "nvfp4-w4a4-fp8kv"),
        ("nvfp4", "nvfp4", "nvfp4-w4a4-nvfp4kv"),
    ],
)
def test_result_families_keep_precisions_apart(weights: str, kv: str, expected: str) -> None:
    """seed 004 §10: BF16, FP8, NVFP4A16, W4A4+FP8 KV and W4A4+NVFP4 KV never share a board."""
    cache = {"auto": "auto", "bf16": "bfloat16"}.get(kv, kv)
    config = make_config(model={"weights": weights},
                         kv={"name": kv, "cache_dtype": cache, "precision": kv})
    assert family(config) == expected


def test_run_id_names_box_model_and_utc_time() -> None:
    """seed 004 §1: 5090-llama31-8b-nvfp4-YYYYMMDD-HHMMSS."""
    moment = datetime(2026, 7, 10, 12, 30, 5, tzinfo=UTC)
    assert new_run_id(make_config(), moment) == "rtx5090-llama31-8b-nvfp4-20260710-123005"
    assert new_run_id(make_config(hw=None), moment).startswith("cpu-llama31-8b-nvfp4-")
    # Parallel jobs of one sweep start in the same second: the job number tells them apart.
    assert new_run_id(make_config(), moment, job=3) == "rtx5090-llama31-8b-nvfp4-20260710-123005-j3"
