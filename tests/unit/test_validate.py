"""Cross-group rules: every broken rule is named, in one paragraph, before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from runner.config import RunConfig, build_config
from runner.errors import ConfigError
from runner.prepare.validate import MachineMemory, validate

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
        kind_changes = isinstance(value, dict) and value.get("kind", data.get(key, {}).get("kind")) != data.get(key, {}).get("kind")
        if isinstance(value, dict) and isinstance(data.get(key), dict) and not kind_changes:
            data[key] = data[key] | value
        else:
            data[key] = value
    return build_config(data)


NVFP4_KV = {"name": "nvfp4", "cache_dtype": "nvfp4", "precision": "nvfp4"}
FP8_KV = {"name": "fp8", "cache_dtype": "fp8", "precision": "fp8"}
PINNED = {"digest": "sha256:" + "0" * 64, "allow_unpinned": False, "local_build": False,
          "repository": "vllm/vllm-openai"}


def refusal(config: RunConfig) -> str:
    return refusal_with(config, None)


def refusal_with(config: RunConfig, memory: MachineMemory | None) -> str:
    with pytest.raises(ConfigError) as caught:
        assert validate(config, memory) == []
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
    assert validate(make_config(hw=BLACKWELL, kv=NVFP4_KV)) == []


def test_fp8_kv_needs_native_fp8() -> None:
    assert "fp8" in refusal(make_config(hw=AMPERE, kv=FP8_KV))
    assert validate(make_config(hw=HOPPER, kv=FP8_KV)) == []


def test_the_cpu_runs_only_16_and_32_bit_precisions() -> None:
    assert "CPU" in refusal(make_config(kv=FP8_KV))
    assert "CPU" in refusal(make_config(model={"weights": "fp8"}))
    assert validate(make_config(kv={"name": "bf16", "cache_dtype": "bfloat16", "precision": "bf16"})) == []


def test_a_context_window_below_the_largest_bucket_is_refused() -> None:
    assert "1024" in refusal(make_config(engine={"max_model_len": 1000}))


def test_without_max_model_len_the_models_context_must_hold_the_largest_bucket() -> None:
    message = refusal(make_config(engine={"max_model_len": None}, model={"max_context": 512}))
    assert "max_context" in message and "1024" in message


def test_a_context_beyond_the_models_needs_vllms_long_context_switch() -> None:
    """seed 003: --max-model-len 1048576 with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."""
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in refusal(make_config(engine={"max_model_len": 8192}))
    assert validate(make_config(engine={"max_model_len": 8192,
                                 "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}})) == []


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
    assert validate(make_config(search={"kind": "fixed", "users": [4, 64]})) == []


@pytest.mark.parametrize("users", [[], [0], [4, -1]])
def test_a_fixed_search_needs_users_of_at_least_one(users: list[int]) -> None:
    with pytest.raises(ConfigError, match=r"search\.users"):
        make_config(search={"kind": "fixed", "users": users})


def test_an_unpinned_image_is_refused_for_a_measured_docker_run() -> None:
    unpinned = {"repository": "vllm/vllm-openai", "tag": "v0.20.0", "allow_unpinned": False,
                "local_build": False}
    gpu = {"hw": HOPPER, "backend": {"kind": "docker"}}
    assert "image.digest" in refusal(make_config(image=unpinned, **gpu))
    warnings = validate(make_config(image=unpinned, dry_run=True, **gpu))
    assert any("image.digest" in warning for warning in warnings)
    assert validate(make_config(image=PINNED, **gpu)) == []


def test_an_unresolved_model_revision_is_refused_unless_allowed() -> None:
    hub_model = {"repo": "nvidia/Llama-3.1-8B-Instruct-FP8", "allow_unresolved_revision": False}
    assert "model.revision" in refusal(make_config(model=hub_model))
    assert validate(make_config(model=hub_model | {"revision": "a" * 40})) == []
    dry = validate(make_config(model=hub_model, dry_run=True))
    assert any("model.revision" in warning for warning in dry)


def test_an_external_backend_needs_its_url() -> None:
    assert "backend.url" in refusal(make_config(backend={"kind": "external"}))
    warnings = validate(make_config(backend={"kind": "external", "url": "http://127.0.0.1:8000"}))
    assert any("label" in warning for warning in warnings)


def test_tensor_parallel_needs_as_many_gpus() -> None:
    message = refusal(make_config(hw=HOPPER, engine={"tensor_parallel_size": 2}))
    assert "tensor_parallel_size=2" in message
    assert validate(make_config(hw=HOPPER | {"count": 2}, engine={"tensor_parallel_size": 2})) == []


@pytest.mark.parametrize(
    ("args", "owner"),
    [
        (["--max-num-seqs", "4"], "engine.max_num_seqs"),
        (["--max_num_seqs=4"], "engine.max_num_seqs"),
        (["--max-num-seqs.x=4"], "engine.max_num_seqs"),
        (["-tp", "2"], "engine.tensor_parallel_size"),
        (["-tp=2"], "engine.tensor_parallel_size"),
        (["--kv_cache_dtype", "fp8"], "kv"),
        (["--kv-cache-memory-bytes=1G"], "engine.kv_cache_memory_gib"),
        (["--gpu-memory-util", "0.5"], "engine.gpu_memory_utilization"),  # argparse prefix
        (["--config", "serve.yaml"], "typed fields"),
        (["--revision", "main"], "model.revision"),
    ],
)
def test_extra_args_may_not_set_a_flag_a_typed_field_owns(args: list[str], owner: str) -> None:
    """vLLM's parser reads --a_b as --a-b, --x.k=v as --x and a unique prefix as the
    whole flag, so each spelling would change what is served behind config_id."""
    assert owner in refusal(make_config(engine={"extra_args": args}))


@pytest.mark.parametrize(
    "args",
    [["--api-key", "sk-planted"], ["--api_key", "sk-planted"], ["--api-key=sk-planted"],
     ["--api_key=sk-planted"], ["--api-k=sk-planted"], ["--hf_token=hf_planted"],
     ["--hf-token", "hf_planted"]],
)
def test_extra_args_may_not_carry_a_secret_and_the_refusal_does_not_repeat_it(args: list[str]) -> None:
    message = refusal(make_config(engine={"extra_args": args}))
    assert "secret" in message and "planted" not in message
    assert "--api-key" in message or "--hf-token" in message


def test_a_url_with_credentials_in_extra_args_is_refused_unseen() -> None:
    args = ["--otlp-traces-endpoint", "http://collector:hunter2@10.0.0.9:4317"]
    message = refusal(make_config(engine={"extra_args": args}))
    assert "credentials" in message and "hunter2" not in message


def test_extra_args_carry_flags_vllm_has_and_no_field_covers() -> None:
    extra = ["--enforce-eager", "--long-prefill-token-threshold-adaptive", "--model-impl", "vllm"]
    assert validate(make_config(engine={"extra_args": extra})) == []


def test_the_kv_cache_size_of_vllm_cpu_is_a_typed_field_not_an_env_variable() -> None:
    assert "kv_cache_memory_gib" in refusal(make_config(engine={"env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}))


def test_a_kv_cache_size_that_cannot_fit_the_machine_is_refused_with_its_figures() -> None:
    """Judged against the physical total, not what is free now: NUMA node 0 grows on
    these VMs (ENVIRONMENT.md pitfalls), so today's free memory would refuse a size
    that fits later."""
    machine = MachineMemory(total_gib=24.0)
    assert validate(make_config(engine={"kv_cache_memory_gib": 8}), machine) == []
    message = refusal_with(make_config(engine={"kv_cache_memory_gib": 30}), machine)
    assert "30" in message and "24.0 GiB of physical memory" in message and "22.0" in message


def test_a_cgroup_limit_below_the_machine_bounds_a_local_process_not_a_container() -> None:
    machine = MachineMemory(total_gib=24.0, cgroup_limit_gib=4.0)
    message = refusal_with(make_config(engine={"kv_cache_memory_gib": 3}), machine)
    assert "cgroup limit of 4.0 GiB" in message
    assert validate(make_config(engine={"kv_cache_memory_gib": 3}, backend={"kind": "docker"}), machine) == []


def test_a_gpu_kv_cache_size_must_fit_one_gpu() -> None:
    config = make_config(hw=HOPPER | {"native_precisions": ["bf16"]},
                         engine={"kv_cache_memory_gib": 150, "gpu_memory_utilization": None})
    assert "140.4" in refusal(config)


def test_a_fixed_kv_size_and_a_memory_fraction_together_are_refused() -> None:
    """vLLM 0.32 --help: kv_cache_memory_bytes (when not-None) ignores gpu_memory_utilization."""
    message = refusal(make_config(engine={"kv_cache_memory_gib": 2, "gpu_memory_utilization": 0.3}))
    assert "kv_cache_memory_gib" in message and "gpu_memory_utilization" in message


def test_a_memory_fraction_on_the_cpu_is_warned_about() -> None:
    warnings = validate(make_config(engine={"kv_cache_memory_gib": None, "gpu_memory_utilization": 0.3}))
    assert any("node 0" in warning and "kv_cache_memory_gib" in warning for warning in warnings)


EXTERNAL_LABEL = "runner starts no engine"  # the warning every external run gets


@pytest.mark.parametrize(
    "url",
    ["https://10.0.0.5:8000", "http://127.0.0.1:8000", "http://localhost:8000",
     "http://[::1]:8000", "http://127.0.1.1:8000"],
)
def test_a_bearer_key_goes_over_tls_or_to_this_host(url: str) -> None:
    config = make_config(backend={"kind": "external", "url": url}, engine={"api_key_env": "VLLM_API_KEY"})
    (warning,) = validate(config)
    assert EXTERNAL_LABEL in warning


def test_a_bearer_key_over_plain_http_to_another_host_is_refused_unless_allowed() -> None:
    url = "http://10.0.0.5:8000"
    config = make_config(backend={"kind": "external", "url": url}, engine={"api_key_env": "VLLM_API_KEY"})
    assert "allow_insecure_key" in refusal(config)
    allowed = make_config(backend={"kind": "external", "url": url, "allow_insecure_key": True},
                          engine={"api_key_env": "VLLM_API_KEY"})  # fmt: skip
    (warning,) = validate(allowed)
    assert EXTERNAL_LABEL in warning


def test_the_api_key_must_be_read_from_vllms_own_variable() -> None:
    assert "VLLM_API_KEY" in refusal(make_config(engine={"api_key_env": "MY_KEY"}))
    assert validate(make_config(engine={"api_key_env": "VLLM_API_KEY"})) == []


def test_a_key_given_where_its_variable_name_belongs_is_never_echoed() -> None:
    """An HF token has the shape of a name; one with dashes does not: both are refused unseen."""
    assert "hf_planted" not in refusal(make_config(engine={"api_key_env": "hf_planted0123"}))
    with pytest.raises(ConfigError) as caught:
        make_config(engine={"api_key_env": "sk-planted-0123"})
    assert "planted" not in str(caught.value) and "NAME" in str(caught.value)


def test_secrets_may_not_be_written_into_engine_env() -> None:
    assert "secret" in refusal(make_config(engine={"env": {"HF_TOKEN": "hf_x"}}))


def test_every_broken_rule_is_named_in_one_paragraph() -> None:
    message = refusal(make_config(
        hw=HOPPER, kv=NVFP4_KV, engine={"max_model_len": 1000}, workload={"max_tokens": None},
    ))
    assert "breaks 3 rules" in message
    assert all(f"({index})" in message for index in (1, 2, 3))
