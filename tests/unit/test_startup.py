"""Start-up facts parsed from real engine logs, and the precision proof built on them.

The logs in tests/unit/data are the first lines (up to "Application startup
complete.") of vLLM 0.26.0 serving Llama 3.1 8B's architecture with random weights on
an NVIDIA H200, unedited: BF16, and FP8 weights with an FP8 KV cache (issue 11).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from runner.config import RunConfig, build_config
from runner.engines.startup import facts_from_version, parse_startup_log, verify_precision
from runner.errors import PrecisionMismatch
from tests.conftest import compose

DATA = Path(__file__).parent / "data"


def h200_log(precision: str) -> str:
    return (DATA / f"vllm_0_26_h200_llama31_8b_dummy_{precision}_startup.log").read_text()


@functools.cache
def config(*overrides: str) -> RunConfig:
    return build_config(compose(["+hw=h200", "backend=process", *overrides]))


def test_the_bf16_h200_log_gives_every_start_up_fact() -> None:
    """Seed 000 reports the KV pool, weights, graph capture, compile and init times."""
    facts = parse_startup_log(h200_log("bf16"))
    assert facts == {
        "kv_cache_size_tokens": 919_824,
        "kv_cache_gib": 112.28,
        "max_concurrency": 224.57,
        "max_concurrency_request_tokens": 4096,
        "weights_gib": 15.0,
        "weights_load_s": 2.908494,
        "graph_capture_s": 5,
        "graph_capture_gib": 0.98,
        "torch_compile_s": 21.32,
        "engine_init_s": 48.22,
        "vllm_version": "0.26.0",
        "engine_quantization": "None",
        "engine_kv_cache_dtype": "auto",
        "engine_dtype": "torch.bfloat16",
    }


def test_the_fp8_h200_log_says_fp8_weights_and_an_fp8_kv_cache() -> None:
    facts = parse_startup_log(h200_log("fp8"))
    assert facts["kv_cache_size_tokens"] == 1_944_992
    assert facts["kv_cache_gib"] == 118.71
    assert (facts["max_concurrency"], facts["max_concurrency_request_tokens"]) == (474.85, 4096)
    assert (facts["weights_gib"], facts["weights_load_s"]) == (8.54, 3.510165)
    assert (facts["graph_capture_s"], facts["graph_capture_gib"]) == (4, 0.90)
    assert (facts["torch_compile_s"], facts["engine_init_s"]) == (38.98, 60.59)
    assert facts["vllm_version"] == "0.26.0"
    assert (facts["engine_quantization"], facts["engine_kv_cache_dtype"]) == ("fp8", "fp8")


def test_the_cpu_format_of_the_loading_line_still_parses() -> None:
    """vLLM 0.32's format string: "Model loading took %s GiB memory and %.6f seconds"."""
    line = "INFO [gpu_model_runner.py:5150] Model loading took 0.0259 GiB memory and 0.512345 seconds"
    facts = parse_startup_log(line)
    assert (facts["weights_gib"], facts["weights_load_s"]) == (0.0259, 0.512345)


def test_the_fp8_engine_proves_what_the_fp8_dummy_model_asks_for() -> None:
    """Seed 004 §5: the engine's own words prove FP8 weights and an FP8 KV cache."""
    asked = config("model=llama31_8b_dummy_fp8", "kv=fp8")
    assert verify_precision(asked, parse_startup_log(h200_log("fp8"))) == []
    assert verify_precision(config("model=llama31_8b_dummy", "kv=auto"), parse_startup_log(h200_log("bf16"))) == []


@pytest.mark.parametrize(
    ("log", "overrides", "words"),
    [
        ("bf16", ("model=llama31_8b_dummy_fp8", "kv=fp8"), "quantization 'None' where 'fp8'"),
        ("fp8", ("model=llama31_8b_dummy", "kv=auto"), "KV cache dtype 'fp8' where 'auto'"),
    ],
)
def test_an_engine_running_another_precision_is_refused(log: str, overrides: tuple[str, ...], words: str) -> None:
    """Seed 004 §5: a silent fallback (or a wrong engine) is never counted as the one asked."""
    with pytest.raises(PrecisionMismatch, match=words):
        verify_precision(config(*overrides), parse_startup_log(h200_log(log)))


def test_an_external_engine_names_its_version_through_the_api() -> None:
    """The H200 external run labelled a vLLM 0.26.0 server with the profile's 0.20.0."""
    assert facts_from_version({"version": "0.26.0"}) == {"vllm_version": "0.26.0"}
    assert facts_from_version({}) == {}
