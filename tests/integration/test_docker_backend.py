"""The docker backend against a real dockerd and the local vLLM-CPU engine image.

The image is built by ``scripts/build-engine-image.sh`` (CI runs it first). Tests
are skipped only when no Docker engine answers.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from runner.config import RunConfig, build_config
from runner.engines.base import LaunchPlan
from runner.errors import EngineFlagError, EngineStartError
from runner.measure.protocol import run_window
from runner.prepare.flags import check_flags, image_present, local_supported_flags, supported_flags
from runner.prepare.launch import build_launch_plan
from runner.workload.context_mix import build_prompts, load_tokenizer
from tests.conftest import compose
from tests.integration.conftest import EAGER, KV_CACHE_ARGS

ENGINE_IMAGE = "local/vllm-cpu:0.32.0"
TINY_CONTEXT = 4096


def _docker_client():
    try:
        import docker

        client = docker.from_env()
        client.ping()
        return client
    except Exception as exc:  # no daemon, no socket, no permission
        return exc


_CLIENT = _docker_client()
NO_DOCKER = isinstance(_CLIENT, Exception)


def docker_test(test):
    """Integration test against dockerd; skipped only when no Docker engine answers."""
    for mark in (
        pytest.mark.integration,
        pytest.mark.docker,
        pytest.mark.skipif(NO_DOCKER, reason=f"no Docker engine answers here ({_CLIENT!r})"),
    ):
        test = mark(test)
    return test


@pytest.fixture(scope="module")
def client():
    return _CLIENT


@pytest.fixture(scope="module")
def engine_image(client) -> str:
    if not image_present(ENGINE_IMAGE, docker_client=client):
        pytest.fail(f"{ENGINE_IMAGE} is missing: run scripts/build-engine-image.sh first")
    return ENGINE_IMAGE


@pytest.fixture(scope="module")
def docker_config() -> RunConfig:
    config = build_config(compose(["backend=docker", "image=cpu_local"]))
    backend = config.backend.model_copy(update={"startup_timeout_s": 300.0, "shm_size": "2g"})
    return config.model_copy(update={"backend": backend})


def run_containers(client, run_id: str) -> list:
    # ignore_removed: a container may go between the listing and its inspection.
    label = {"label": f"runner.run_id={run_id}"}
    return client.containers.list(all=True, ignore_removed=True, filters=label)


def new_run_id() -> str:
    return f"itest-{uuid.uuid4().hex[:8]}"


# -- flags -------------------------------------------------------------------------
@docker_test
def test_unknown_flag_is_refused_from_the_images_own_help(client, engine_image, tmp_path, docker_config):
    """Seed 003 pitfall 1: --swap-space is unknown to the pinned vLLM, found before start."""
    supported = supported_flags(engine_image, cache_dir=tmp_path, docker_client=client)
    assert {"--model", "--max-num-seqs", "--no-enable-prefix-caching"} <= supported
    with pytest.raises(EngineFlagError) as refused:
        check_flags(["--model", "/m", "--swap-space", "0", "--max-num-seqs", "8"], supported, engine_image)
    message = str(refused.value)
    assert "--swap-space" in message and engine_image in message
    assert "--max-num-seqs" not in message and "--model" not in message

    # Every flag runner itself builds from the real config is one the image knows.
    plan = build_launch_plan(docker_config, model_path="/models/tiny", host="0.0.0.0")
    check_flags(plan.argv, supported, engine_image)

    # The second call reads the cache (per image ID) instead of starting a container.
    cached = list((tmp_path / "flags").glob("*.json"))
    assert len(cached) == 1
    started = time.monotonic()
    assert supported_flags(engine_image, cache_dir=tmp_path, docker_client=client) == supported
    assert time.monotonic() - started < 1.0


@pytest.mark.integration
def test_local_engine_flags_come_from_the_installed_vllm(tmp_path):
    """Seed 003 pitfall 1, for the process backend: the installed vLLM's own --help=all."""
    supported = local_supported_flags(sys.executable, tmp_path)
    assert "--max-num-seqs" in supported
    with pytest.raises(EngineFlagError, match="--swap-space"):
        check_flags(["--swap-space", "0"], supported, "the local vLLM")
    check_flags(["--max_num_seqs=4", "--compilation-config.mode=0", "-O0"], supported, "the local vLLM")


@docker_test
def test_an_absent_image_is_reported_absent(client):
    assert not image_present("local/no-such-image:0", docker_client=client)


# -- engine lifecycle --------------------------------------------------------------
@docker_test
def test_gpu_request_on_a_host_without_gpu_runtime_fails_clearly_and_leaves_nothing(
    client, engine_image, docker_config, tmp_path
):
    """Seed 003 Step 7 runs with --gpus all; here that must fail at once, cleanly."""
    from runner.engines.docker import DockerEngine

    run_id = new_run_id()
    plan = LaunchPlan(image=engine_image, argv=["--help"], gpus="all")
    with pytest.raises(EngineStartError, match="no NVIDIA container runtime"):
        with DockerEngine(docker_config, plan, run_id=run_id, config_id="gpu", log_dir=tmp_path):
            pytest.fail("the engine must not start without a GPU runtime")
    assert run_containers(client, run_id) == []


@docker_test
def test_an_image_that_cannot_be_pulled_stops_the_start_and_leaves_nothing(client, docker_config, tmp_path):
    """Seed 004 §2 pins the image by digest; a missing one is pulled, and a failed pull is clear."""
    from runner.engines.docker import DockerEngine

    run_id = new_run_id()
    plan = LaunchPlan(image="local/runner-test-absent@sha256:" + "0" * 64, argv=[])
    with pytest.raises(EngineStartError, match="pulling it failed"):
        with DockerEngine(docker_config, plan, run_id=run_id, config_id="absent", log_dir=tmp_path):
            pytest.fail("an absent image must not start")
    assert run_containers(client, run_id) == []


@docker_test
def test_an_engine_that_exits_at_start_is_reported_with_its_log(client, engine_image, docker_config, tmp_path):
    """Seed 003 pitfall 1 as the engine itself reports it: 'unrecognized arguments'."""
    from runner.engines.docker import DockerEngine

    run_id = new_run_id()
    plan = LaunchPlan(image=engine_image, argv=["--swap-space", "0"])
    started = time.monotonic()
    with pytest.raises(EngineStartError) as failed:
        with DockerEngine(docker_config, plan, run_id=run_id, config_id="bad", log_dir=tmp_path):
            pytest.fail("the engine must not become ready")
    assert time.monotonic() - started < 120  # at once, not after startup_timeout_s
    assert "unrecognized arguments" in str(failed.value)
    assert run_containers(client, run_id) == []


@docker_test
def test_engine_serves_then_a_killed_container_is_a_fault_and_nothing_is_left(
    client, engine_image, docker_config, tiny_model_dir: Path, tmp_path
):
    """The container serves on 127.0.0.1 only; a kill shows in fault(); exit removes it."""
    from runner.engines.docker import DockerEngine

    run_id = new_run_id()
    plan = LaunchPlan(
        image=engine_image,
        argv=[
            "--model", "/models/tiny",
            "--served-model-name", "tiny",
            "--load-format", "dummy",
            *KV_CACHE_ARGS,
            "--max-model-len", str(TINY_CONTEXT),
            "--host", "0.0.0.0",
            "--port", "8000",
            *EAGER,
        ],
        env={"HF_HUB_OFFLINE": "1"},
        mounts=[(str(tiny_model_dir), "/models/tiny", "ro")],
        port=8000,
    )
    with DockerEngine(docker_config, plan, run_id=run_id, config_id="tiny-cpu", log_dir=tmp_path) as engine:
        assert engine.base_url.startswith("http://127.0.0.1:")
        assert engine.image_id == client.images.get(engine_image).id
        assert engine.fault() is None
        labels = engine.container.labels
        assert labels["runner.run_id"] == run_id and labels["runner.config_id"] == "tiny-cpu"
        published = engine.container.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
        assert {binding["HostIp"] for binding in published} == {"127.0.0.1"}

        # The first forward pass is a prompt of some length, as a run's is: vLLM-CPU
        # 0.32.0 with --enforce-eager skips its kernel warm-up, and on a CPU with AMX its
        # worker dies of SIGILL (exit code -4) when its first pass is a 3-token prompt;
        # after a longer one, short prompts are served.
        prompt = " ".join(["river garden budget lighthouse"] * 40)
        reply = httpx.post(
            f"{engine.base_url}/v1/completions",
            json={"model": "tiny", "prompt": prompt, "max_tokens": 8, "ignore_eos": True},
            timeout=60,
        )
        assert reply.status_code == 200
        assert reply.json()["usage"]["completion_tokens"] == 8
        assert "Application startup complete" in engine.log_tail(400)

        # Killed mid-window: the window ends invalid with the reason, never a figure.
        config = docker_config.model_copy(
            update={"search": docker_config.search.model_copy(update={"window_s": 30.0, "warmup_s": 2.0})}
        )
        tokenizer = load_tokenizer(tiny_model_dir)
        prompts = build_prompts(tokenizer, config.workload)
        killer = threading.Timer(6.0, engine.container.kill)
        killer.start()
        try:
            result = run_window(engine, config, prompts, 4, config_id="tiny-cpu", run_id=run_id, phase="coarse")
        finally:
            killer.cancel()
        assert result.row.valid is False
        reasons = " ".join(result.detail.invalid_reasons)
        assert "137" in reasons or "exited" in reasons, reasons
        fault = engine.fault()
        assert fault is not None and fault.exit_code == 137 and not fault.oom_killed
    assert run_containers(client, run_id) == []


SIGTERM_SCRIPT = """
import sys
from pathlib import Path
from runner.config import build_config
from runner.engines.base import LaunchPlan
from runner.engines.docker import DockerEngine
from tests.conftest import compose

config = build_config(compose(["backend=docker", "image=cpu_local"]))
plan = LaunchPlan(image=sys.argv[1], argv=["--model", "/nowhere", "--port", "8000"])
with DockerEngine(config, plan, run_id=sys.argv[2], config_id="term", log_dir=Path(sys.argv[3])):
    pass
"""


@docker_test
def test_sigterm_while_the_engine_starts_removes_its_container(client, engine_image, tmp_path):
    """A scheduler's SIGTERM must not leave a container holding the GPUs behind."""
    import signal
    import subprocess

    run_id = new_run_id()
    repo = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_SCRIPT, engine_image, run_id, str(tmp_path)], cwd=repo
    )
    try:
        deadline = time.monotonic() + 60
        while not run_containers(client, run_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert run_containers(client, run_id), "the engine container never appeared"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        child.kill()
    assert run_containers(client, run_id) == []
