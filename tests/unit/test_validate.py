"""Cross-group rules: every broken rule is named, in one paragraph, before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from runner.config import RunConfig
from runner.errors import ConfigError
from runner.prepare.validate import validate

HOPPER = {
    "name": "h200",
    "gpu_name": "NVIDIA H200",
    "count": 1,
    "memory_gib": 140.4,
    "compute_capability": [9, 0],
    "arch": "hopper",
    "native_precisions": ["bf16", "fp8"],
    "min_driver": "580.105.08",
}
BLACKWELL = HOPPER | {
    "name": "rtx5090",
    "gpu_name": "NVIDIA GeForce RTX 5090",
    "memory_gib": 31.8,
    "compute_capability": [12, 0],
    "arch": "blackwell",
    "native_precisions": ["bf16", "fp8", "nvfp4", "nvfp4a16"],
}
AMPERE = HOPPER | {"name": "a100", "arch": "ampere", "native_precisions": ["bf16"]}


def make_config(**groups: dict[str, Any] | Any) -> RunConfig:
    """A valid CPU run; each keyword replaces fields of one group (or a top-level value)."""
    data: dict[str, Any] = {
        "image": {"name": "cpu_local", "repository": "local/vllm-cpu", "tag": "0.32.0",
                  "vllm_version": "0.32.0", "allow_unpinned": True, "local_build": True},
        "model": {"name": "tiny", "repo": "local/tiny-llama", "allow_unresolved_revision": True,
                  "weights": "bf16", "served_name": "tiny", "max_context": 4096,
                  "generated": True},
        "kv": {"name": "auto", "cache_dtype": "auto", "precision": "auto"},
        "engine": {"name": "cpu", "max_num_seqs": 64, "max_model_len": 2048,
                   "kv_cache_memory_gib": 2},
        "workload": {"name": "mix", "buckets": [{"total_tokens": 128}, {"total_tokens": 1024}],
                     "max_tokens": 64},
        "search": {"kind": "bracket", "start_users": 7, "max_users": 64},
        "backend": {"kind": "process"},
        "results": {"dir": "results/test"},
    }
    for key, value in groups.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = data[key] | value
        else:
            data[key] = value
    return RunConfig.model_validate(data)


NVFP4_KV = {"name": "nvfp4", "cache_dtype": "nvfp4", "precision": "nvfp4"}
FP8_KV = {"name": "fp8", "cache_dtype": "fp8", "precision": "fp8"}
PINNED = {"digest": "sha256:" + "0" * 64, "allow_unpinned": False, "local_build": False,
          "repository": "vllm/vllm-openai"}


def refusal(config: RunConfig) -> str:
    with pytest.raises(ConfigError) as caught:
        validate(config)
    message = str(caught.value)
    assert "\n" not in message, "a refusal is one paragraph"
    return message


def test_a_sound_cpu_config_passes_without_warnings() -> None:
    assert validate(make_config()) == []


def test_nvfp4_weights_on_hopper_are_refused() -> None:
    """seed 003: on Hopper FP4 has no native tensor-core support."""
    message = refusal(make_config(hw=HOPPER, model={"weights": "nvfp4"}))
    assert "nvfp4" in message and "Hopper has no native FP4" in message


def test_nvfp4_kv_on_hopper_is_refused_and_on_blackwell_accepted() -> None:
    """seed 003's rule: Blackwell -> NVFP4, Hopper -> FP8."""
    assert "nvfp4" in refusal(make_config(hw=HOPPER, kv=NVFP4_KV))
    validate(make_config(hw=BLACKWELL, kv=NVFP4_KV))


def test_fp8_kv_needs_native_fp8() -> None:
    assert "fp8" in refusal(make_config(hw=AMPERE, kv=FP8_KV))
    validate(make_config(hw=HOPPER, kv=FP8_KV))


def test_the_cpu_runs_only_16_and_32_bit_precisions() -> None:
    assert "CPU" in refusal(make_config(kv=FP8_KV))
    assert "CPU" in refusal(make_config(model={"weights": "fp8"}))
    validate(make_config(kv={"name": "bf16", "cache_dtype": "bfloat16", "precision": "bf16"}))


def test_a_context_window_below_the_largest_bucket_is_refused() -> None:
    assert "1024" in refusal(make_config(engine={"max_model_len": 1000}))


def test_without_max_model_len_the_models_context_must_hold_the_largest_bucket() -> None:
    message = refusal(make_config(engine={"max_model_len": None}, model={"max_context": 512}))
    assert "max_context" in message and "1024" in message


def test_a_context_beyond_the_models_needs_vllms_long_context_switch() -> None:
    """seed 003: --max-model-len 1048576 with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in refusal(make_config(engine={"max_model_len": 8192}))
    validate(make_config(engine={"max_model_len": 8192,
                                 "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}))


def test_a_workload_without_max_tokens_is_refused() -> None:
    """seed 004 §12: omitting max_tokens gave vLLM's hidden 16-token default."""
    assert "16 tokens" in refusal(make_config(workload={"max_tokens": None}))


def test_max_tokens_must_leave_room_for_a_prompt() -> None:
    assert "smallest bucket" in refusal(make_config(workload={"max_tokens": 128}))


def test_the_bracket_ceiling_may_not_exceed_max_num_seqs() -> None:
    """seed 004 §10: max-num-seqs at least as large as the candidate user count."""
    message = refusal(make_config(search={"max_users": 128}))
    assert "max_num_seqs=64" in message and "max_users" in message


def test_fixed_user_counts_may_not_exceed_max_num_seqs() -> None:
    message = refusal(make_config(search={"kind": "fixed", "users": [4, 80]}))
    assert "80" in message
    validate(make_config(search={"kind": "fixed", "users": [4, 64]}))
    assert "users" in refusal(make_config(search={"kind": "fixed", "users": []}))


def test_an_unpinned_image_is_refused_for_a_measured_docker_run() -> None:
    unpinned = {"repository": "vllm/vllm-openai", "tag": "v0.20.0", "allow_unpinned": False,
                "local_build": False}
    gpu = {"hw": HOPPER, "backend": {"kind": "docker"}}
    assert "image.digest" in refusal(make_config(image=unpinned, **gpu))
    warnings = validate(make_config(image=unpinned, dry_run=True, **gpu))
    assert any("image.digest" in warning for warning in warnings)
    validate(make_config(image=PINNED, **gpu))


def test_an_unresolved_model_revision_is_refused_unless_allowed() -> None:
    hub_model = {"repo": "nvidia/Llama-3.1-8B-Instruct-FP8", "allow_unresolved_revision": False}
    assert "model.revision" in refusal(make_config(model=hub_model))
    validate(make_config(model=hub_model | {"revision": "a" * 40}))
    assert validate(make_config(model=hub_model, dry_run=True))


def test_an_external_backend_needs_its_url() -> None:
    assert "backend.url" in refusal(make_config(backend={"kind": "external"}))
    warnings = validate(make_config(backend={"kind": "external", "url": "http://127.0.0.1:8000"}))
    assert any("label" in warning for warning in warnings)


def test_tensor_parallel_needs_as_many_gpus() -> None:
    message = refusal(make_config(hw=HOPPER, engine={"tensor_parallel_size": 2}))
    assert "tensor_parallel_size=2" in message
    validate(make_config(hw=HOPPER | {"count": 2}, engine={"tensor_parallel_size": 2}))


@pytest.mark.parametrize("flag", ["--max-num-seqs", "--max-num-seqs=4", "-tp", "--api-key"])
def test_extra_args_may_not_repeat_a_typed_flag(flag: str) -> None:
    message = refusal(make_config(engine={"extra_args": [flag, "4"]}))
    assert flag.split("=")[0] in message


def test_extra_args_carry_flags_no_field_covers() -> None:
    validate(make_config(engine={"extra_args": ["--enforce-eager"]}))


def test_the_api_key_must_be_read_from_vllms_own_variable() -> None:
    assert "VLLM_API_KEY" in refusal(make_config(engine={"api_key_env": "MY_KEY"}))
    validate(make_config(engine={"api_key_env": "VLLM_API_KEY"}))


def test_secrets_may_not_be_written_into_engine_env() -> None:
    assert "secret" in refusal(make_config(engine={"env": {"HF_TOKEN": "hf_x"}}))


def test_every_broken_rule_is_named_in_one_paragraph() -> None:
    message = refusal(make_config(
        hw=HOPPER, kv=NVFP4_KV, engine={"max_model_len": 1000}, workload={"max_tokens": None},
    ))
    assert "breaks 3 rules" in message
    assert all(f"({index})" in message for index in (1, 2, 3))
