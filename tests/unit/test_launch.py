"""Golden launches: the composed seed recipes start the engine the seeds started.

Each test composes the real config (as `python -m runner ...` does) and compares
the launch plan with the seed's own command, flag by flag. Where runner differs
on purpose, the difference is listed and explained.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.config import RunConfig, build_config
from runner.engines.base import LaunchPlan
from runner.prepare.launch import (
    build_launch_plan,
    container_model_path,
    docker_run_line,
    render_plan,
)

CONF = Path(__file__).resolve().parents[2] / "conf"
REVISION = "4f2c0a9e6d1b8c7a5e3f2d1c0b9a8e7d6c5b4a39"

# seed 004 §5, verbatim but for the line breaks.
SEED_004_SERVE = """vllm serve /workspace/model --served-model-name llama31-8b-nvfp4
  --quantization modelopt_fp4 --dtype auto --kv-cache-dtype nvfp4 --max-model-len 30000
  --gpu-memory-utilization 0.92 --max-num-seqs 256 --enable-chunked-prefill
  --no-enable-prefix-caching --generation-config vllm --host 127.0.0.1 --port 8000"""
SEED_004_IMAGE = (
    "vllm/vllm-openai@sha256:a671d5fcda70fe9ac6f245f9780821de459fb4ee22c018fd07a0f10a55279bf9"
)

# seed 003 Step 7: the vLLM arguments of launch_docker.sh.
SEED_003_SERVE = """--model /root/.cache/huggingface/models--nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8/snapshots/SNAPSHOT_HASH
  --served-model-name nvidia/nemotron-3-super --host 0.0.0.0 --port 20000
  --api-key "$API_KEY" --async-scheduling --dtype auto --kv-cache-dtype fp8
  --tensor-parallel-size 2 --enable-expert-parallel --trust-remote-code
  --gpu-memory-utilization 0.90 --enable-chunked-prefill --max-model-len 1048576
  --max-num-seqs 32 --mamba-ssm-cache-dtype float32 --reasoning-parser nemotron_v3
  --enable-auto-tool-choice --tool-call-parser qwen3_coder"""
SEED_003_ENV = {
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HOME": "/root/.cache/huggingface",
    "HF_MODULES_CACHE": "/root/.cache/hf_modules",
}

# seed 000: the arguments after the image in its docker run line.
SEED_000_SERVE = """nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4
  --host 0.0.0.0 --port 8000 --max-model-len 65536
  --gpu-memory-utilization 0.85 --max-num-seqs 32
  --trust-remote-code --reasoning-parser nemotron_v3"""


@functools.lru_cache(maxsize=None)
def compose_config(*overrides: str) -> RunConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = compose("runner", overrides=[*overrides, "results.dir=results/test"])
    return build_config(OmegaConf.to_container(composed, resolve=True))


def docker_plan(config: RunConfig, host: str) -> LaunchPlan:
    return build_launch_plan(config, model_path=container_model_path(config.model), host=host)


def flags(argv: list[str]) -> dict[str, str | bool]:
    """argv as {flag: value, or True for a switch}; a bare word is the model (`vllm serve MODEL`)."""
    parsed: dict[str, str | bool] = {}
    index = 0
    while index < len(argv):
        word = argv[index]
        if not word.startswith("-"):
            parsed["--model"] = word
            index += 1
        elif index + 1 < len(argv) and not argv[index + 1].startswith("-"):
            parsed[word] = argv[index + 1]
            index += 2
        else:
            parsed[word] = True
            index += 1
    return parsed


def same(left: str | bool, right: str | bool) -> bool:
    try:
        return float(left) == float(right)  # "0.9" is "0.90"
    except (TypeError, ValueError):
        return left == right


def assert_same_flags(
    plan: LaunchPlan, seed: dict[str, str | bool], *, added: set[str], dropped: set[str]
) -> None:
    ours = flags(plan.argv)
    for flag, value in seed.items():
        if flag in dropped:
            assert flag not in ours, flag
            continue
        assert flag in ours, f"seed flag {flag} missing"
        assert same(ours[flag], value), f"{flag}: {ours[flag]!r} != seed {value!r}"
    assert set(ours) - set(seed) == added


def test_seed_004_rtx5090_nvfp4_launch() -> None:
    """seed 004 §5: the explicit ModelOpt FP4 load with NVFP4 KV, on the pinned nightly."""
    config = compose_config("+hw=rtx5090", "kv=nvfp4", f"model.revision={REVISION}")
    plan = build_launch_plan(config, model_path="/workspace/model", host="127.0.0.1")
    seed = flags(shlex.split(SEED_004_SERVE)[2:])
    # runner states the single GPU.
    assert_same_flags(plan, seed, added={"--tensor-parallel-size"}, dropped=set())
    assert plan.argv[:2] == ["--model", "/workspace/model"]
    assert flags(plan.argv)["--tensor-parallel-size"] == "1"
    assert plan.image == SEED_004_IMAGE
    assert plan.secret_env == []


def test_seed_003_h200x2_fp8_launch() -> None:
    """seed 003 Step 7: TP 2 + expert parallel, FP8 KV, 1M context, parsers, API key.

    The key is read by vLLM from VLLM_API_KEY instead of `--api-key` on argv, and
    prefix caching is explicitly off for the measurement (seed 004 §6).
    """
    config = compose_config(
        "+hw=h200x2", "model=nemotron3_super_fp8", "kv=fp8", f"model.revision={REVISION}",
        "backend.hf_cache=/opt/models",
    )
    plan = docker_plan(config, host="0.0.0.0")
    seed = flags(shlex.split(SEED_003_SERVE.replace("SNAPSHOT_HASH", REVISION)))
    assert_same_flags(plan, seed, added={"--no-enable-prefix-caching"}, dropped={"--api-key"})
    assert plan.image == "vllm/vllm-openai:v0.20.0"
    assert plan.env == SEED_003_ENV
    assert plan.secret_env == ["VLLM_API_KEY"]
    assert plan.mounts == [("/opt/models", "/root/.cache/huggingface", "ro")]
    assert (plan.gpus, plan.port) == ("2", 20000)
    line = docker_run_line(plan, config.backend)
    assert "--shm-size 16g" in line and "-p 127.0.0.1:20000:20000" in line
    assert " -e VLLM_API_KEY " in line


def test_seed_000_dgx_spark_nvfp4_launch() -> None:
    """seed 000: cu130 nightly, 64k context, 0.85 memory, 32 sequences, --ipc=host, HF_TOKEN.

    runner passes the snapshot path (seed 003 pitfall 2) and keeps the repo id as
    the served name, states dtype, KV dtype and the single GPU, and turns prefix
    caching off for the measurement.
    """
    config = compose_config("+hw=dgx_spark", f"model.revision={REVISION}")
    plan = docker_plan(config, host="0.0.0.0")
    seed = flags(shlex.split(SEED_000_SERVE))
    served = seed.pop("--model")
    assert_same_flags(
        plan,
        seed,
        added={"--model", "--served-model-name", "--dtype", "--kv-cache-dtype",
               "--tensor-parallel-size", "--no-enable-prefix-caching"},
        dropped=set(),
    )
    ours = flags(plan.argv)
    assert ours["--served-model-name"] == served
    assert (ours["--kv-cache-dtype"], ours["--tensor-parallel-size"]) == ("auto", "1")
    assert plan.image == "vllm/vllm-openai:cu130-nightly"
    # Seed 000 passes -e HF_TOKEN; runner's container reads the mounted cache with the
    # hub offline, where a token is never used, so the token stays home (issue 8).
    assert config.model.needs_hf_token and plan.env["HF_HUB_OFFLINE"] == "1"
    assert plan.secret_env == []
    line = docker_run_line(plan, config.backend)
    assert "--ipc=host" in line and "--shm-size" not in line
    assert "-p 127.0.0.1:8000:8000" in line and "--gpus 1" in line


def test_the_model_path_is_the_snapshot_inside_the_container() -> None:
    """seed 003 pitfall 2: neither the host path nor the repo id works offline."""
    model = compose_config("+hw=h200x2").model
    assert container_model_path(model) == (
        "/root/.cache/huggingface/models--nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8"
        "/snapshots/<unresolved-revision>"
    )
    pinned = model.model_copy(update={"revision": REVISION})
    assert container_model_path(pinned).endswith(f"/snapshots/{REVISION}")


def test_the_cpu_default_launches_a_local_process() -> None:
    config = compose_config("engine.extra_args=[--enforce-eager]")
    plan = build_launch_plan(config, model_path="/cache/tiny", host="127.0.0.1")
    ours = flags(plan.argv)
    assert plan.argv[:2] == ["--model", "/cache/tiny"]
    assert plan.argv[-1] == "--enforce-eager"  # extra_args come last
    assert (ours["--load-format"], ours["--port"], ours["--host"]) == ("dummy", "8011", "127.0.0.1")
    # A fixed KV size, not a fraction of a NUMA node that grows (ENVIRONMENT.md pitfalls).
    assert ours["--kv-cache-memory-bytes"] == str(2 * 2**30)
    assert "--gpu-memory-utilization" not in ours
    assert "--no-enable-prefix-caching" in ours
    assert (plan.image, plan.gpus, plan.mounts, plan.env) == (None, None, [], {})
    with pytest.raises(ValueError):
        docker_run_line(plan, config.backend)


def test_switches_are_said_both_ways() -> None:
    config = compose_config("engine.enable_chunked_prefill=false", "engine.enable_prefix_caching=true")
    ours = flags(build_launch_plan(config, model_path="m", host="127.0.0.1").argv)
    assert "--no-enable-chunked-prefill" in ours and "--enable-prefix-caching" in ours
    assert "--no-enable-prefix-caching" not in ours


def test_device_ids_select_the_gpus() -> None:
    config = compose_config("+hw=h200x2", "hw.device_ids=[2,3]")
    plan = docker_plan(config, host="0.0.0.0")
    assert plan.gpus == "device=2,3"
    assert "--gpus '\"device=2,3\"'" in docker_run_line(plan, config.backend)


def test_the_default_hf_cache_expands_in_the_shell() -> None:
    config = compose_config("+hw=rtx5090")
    line = docker_run_line(docker_plan(config, "0.0.0.0"), config.backend)
    assert '-v "$HOME"/.cache/huggingface/hub:/root/.cache/huggingface:ro' in line


@pytest.mark.parametrize(
    "overrides",
    [("+hw=h200x2",), ("+hw=dgx_spark",), ("+hw=rtx5090", "kv=nvfp4"), ()],
)
def test_no_secret_value_reaches_a_plan(
    overrides: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Secrets come only from the environment and never reach argv or a printed plan."""
    monkeypatch.setenv("VLLM_API_KEY", "nm-sentinel-api-key")
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel_token")
    config = compose_config(*overrides, "engine.api_key_env=VLLM_API_KEY",
                            "model.needs_hf_token=true")
    plan = build_launch_plan(config, model_path=container_model_path(config.model), host="0.0.0.0")
    shown = [repr(plan), render_plan(plan)]
    if plan.image is not None:
        shown.append(docker_run_line(plan, config.backend))
    assert not any("sentinel" in text for text in shown)
    # The token goes only to an engine that may reach the hub: not a container, whose
    # hub is kept offline.
    online = plan.image is None
    assert plan.secret_env == (["VLLM_API_KEY", "HF_TOKEN"] if online else ["VLLM_API_KEY"])
    assert "--api-key" not in plan.argv
    assert all(f"secret:  {name}" in render_plan(plan) for name in plan.secret_env)


def test_a_dry_run_shows_an_unpinned_image_as_such() -> None:
    config = compose_config("+hw=h200x2")
    assert "UNPINNED" in render_plan(docker_plan(config, "0.0.0.0"))
    pinned = compose_config("+hw=rtx5090")
    assert SEED_004_IMAGE in render_plan(docker_plan(pinned, "0.0.0.0"))


def test_a_generated_model_in_a_container_mounts_no_hub_cache() -> None:
    """The tiny model is not in the Hugging Face cache, which may not even exist."""
    config = compose_config("backend=docker")
    plan = build_launch_plan(config, model_path="/models/tiny", host="0.0.0.0")
    assert plan.image == "local/vllm-cpu:0.32.0"
    assert plan.mounts == [] and plan.gpus is None


def every_field_set(config: RunConfig) -> RunConfig:
    """``config`` with every optional model and engine field given a value, so that
    the plan emits every flag runner can emit."""
    model = config.model.model_copy(update={
        "quantization": "fp8", "trust_remote_code": True, "mamba_ssm_cache_dtype": "float32",
        "reasoning_parser": "r", "tool_call_parser": "t",
    })
    engine = config.engine.model_copy(update={
        "max_num_seqs": 8, "max_num_batched_tokens": 512, "gpu_memory_utilization": 0.5,
        "kv_cache_memory_gib": 1.0, "max_model_len": 1024, "enable_chunked_prefill": True,
        "enable_expert_parallel": True, "async_scheduling": True, "generation_config": "vllm",
        "long_prefill_token_threshold": 64, "max_num_partial_prefills": 2,
        "max_long_partial_prefills": 1, "load_format": "dummy", "enable_prefix_caching": True,
    })
    return config.model_copy(update={"model": model, "engine": engine})


@pytest.mark.parametrize("overrides", [(), ("+hw=h200x2",), ("engine.enable_chunked_prefill=false",)])
def test_every_flag_runner_emits_is_owned_by_a_typed_field(overrides: tuple[str, ...]) -> None:
    """So engine.extra_args can never set one behind config_id (issue 8)."""
    from runner.prepare.flags import argv_flags
    from runner.prepare.launch import TYPED_FLAGS

    config = every_field_set(compose_config(*overrides))
    plan = build_launch_plan(config, model_path="/m", host="127.0.0.1")
    assert set(argv_flags(plan.argv)) - set(TYPED_FLAGS) == set()


def test_a_kv_cache_size_in_gib_is_emitted_as_the_integer_bytes_vllm_reads() -> None:
    config = compose_config("engine.kv_cache_memory_gib=1.5")
    ours = flags(build_launch_plan(config, model_path="m", host="127.0.0.1").argv)
    assert ours["--kv-cache-memory-bytes"] == "1610612736"


def test_an_hf_token_goes_only_to_an_engine_that_may_reach_the_hub() -> None:
    online = compose_config("model.needs_hf_token=true")
    assert build_launch_plan(online, model_path="m", host="h").secret_env == ["HF_TOKEN"]
    offline = compose_config("model.needs_hf_token=true", "+engine.env.HF_HUB_OFFLINE=1")
    assert build_launch_plan(offline, model_path="m", host="h").secret_env == []
    unneeded = compose_config()
    assert build_launch_plan(unneeded, model_path="m", host="h").secret_env == []
