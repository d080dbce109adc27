"""What the engine says about itself at start-up, and the proof that it runs what was asked.

Pure: parses the engine log and the labels of ``vllm:cache_config_info``. The log
formats are vLLM's own format strings (ENVIRONMENT.md lists them); seed 000 reports
these facts (KV pool, weights GiB, graph capture, compile and init seconds).
Seed 004 §5: a silent fallback to another precision must abort the run.
"""

from __future__ import annotations

import re
from typing import Any

from runner.config import RunConfig
from runner.errors import PrecisionMismatch

_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
# vLLM 0.32 logs "Model loading took X GiB memory and Y seconds"; 0.26's GPU model
# runner (tests/unit/data, the H200 logs) drops the word "memory".
_LOADING = rf"Model loading took {_NUMBER} GiB(?: memory)? and {_NUMBER} seconds"
_CONCURRENCY = rf"Maximum concurrency for {_NUMBER} tokens per request: {_NUMBER}x"
_PATTERNS: dict[str, tuple[str, ...]] = {
    "kv_cache_size_tokens": (rf"(?:GPU|CPU) KV cache size: {_NUMBER} tokens",),
    "kv_cache_gib": (rf"Available KV cache memory: {_NUMBER} GiB",),
    "max_concurrency": (_CONCURRENCY,),
    "max_concurrency_request_tokens": (_CONCURRENCY,),
    "weights_gib": (_LOADING,),
    "weights_load_s": (_LOADING,),
    "graph_capture_s": (rf"Graph capturing finished in {_NUMBER} secs",),
    "graph_capture_gib": (rf"Graph capturing finished in {_NUMBER} secs, took {_NUMBER} GiB",),
    "torch_compile_s": (rf"torch\.compile took {_NUMBER} s in total",),
    "engine_init_s": (rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} s",),
}
# Which capture group holds the figure for patterns with two numbers.
_GROUP = {"max_concurrency": 2, "weights_load_s": 2, "graph_capture_gib": 2}
_CONFIG_LINE = re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config: (.*)")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_startup_log(text: str) -> dict[str, Any]:
    """Start-up facts from an engine log; a fact the log does not hold is absent."""
    facts: dict[str, Any] = {}
    for key, patterns in _PATTERNS.items():
        for pattern in patterns:
            matches = re.findall(pattern, text)
            if matches:
                last = matches[-1]
                value = last[_GROUP.get(key, 1) - 1] if isinstance(last, tuple) else last
                facts[key] = _number(value)
                break
    config_line = _CONFIG_LINE.search(text)
    if config_line:
        facts["vllm_version"] = config_line.group(1)
        for field in ("quantization", "kv_cache_dtype", "dtype"):
            found = re.search(rf"(?:^|, ){field}=([^,]+)", config_line.group(2))
            if found:
                facts[f"engine_{field}"] = found.group(1).strip().strip("'")
    return facts


def facts_from_version(answer: dict[str, Any]) -> dict[str, Any]:
    """The vLLM version from the server's ``GET /version`` (an external engine has no log)."""
    version = answer.get("version")
    return {"vllm_version": str(version)} if version else {}


def facts_from_cache_config(labels: dict[str, str]) -> dict[str, Any]:
    """Start-up facts from the labels of ``vllm:cache_config_info``."""
    facts: dict[str, Any] = {}
    if "cache_dtype" in labels:
        facts["engine_cache_dtype"] = labels["cache_dtype"]
    for key in ("kv_cache_size_tokens", "kv_cache_max_concurrency"):
        value = labels.get(key)
        if value not in (None, "None", ""):
            facts[key] = _number(str(value))
    return facts


# Spellings engines use for the same KV dtype.
_KV_ALIASES = {
    "auto": {"auto"},
    "bfloat16": {"bfloat16", "bf16", "torch.bfloat16"},
    "fp8": {"fp8", "fp8_e4m3", "fp8_e5m2", "torch.float8_e4m3fn"},
    "nvfp4": {"nvfp4", "torch.uint8"},
}


def verify_precision(config: RunConfig, facts: dict[str, Any]) -> list[str]:
    """Refuse an engine whose reported KV dtype or quantization differs from the config.

    Returns notes on what could not be checked (the engine did not say); raises
    :class:`PrecisionMismatch` on a contradiction: a fallback precision is never
    counted as the requested one.
    """
    notes: list[str] = []
    problems: list[str] = []
    wanted_kv = config.kv.cache_dtype
    reported_kv = facts.get("engine_cache_dtype") or facts.get("engine_kv_cache_dtype")
    if reported_kv is None:
        notes.append("the engine did not report its KV cache dtype")
    elif reported_kv not in _KV_ALIASES.get(wanted_kv, {wanted_kv}):
        problems.append(f"KV cache dtype {reported_kv!r} where {wanted_kv!r} was asked for")
    wanted_quant = config.model.expected_quantization or config.model.quantization
    reported_quant = facts.get("engine_quantization")
    if reported_quant is None:
        notes.append("the engine did not report its quantization method")
    elif wanted_quant is None and reported_quant not in ("None", "none"):
        problems.append(f"quantization {reported_quant!r} where unquantized weights were expected")
    elif wanted_quant is not None and reported_quant != wanted_quant:
        problems.append(f"quantization {reported_quant!r} where {wanted_quant!r} was asked for")
    if problems:
        raise PrecisionMismatch(
            "The engine does not run the precision this config asks for: "
            + "; ".join(problems)
            + ". runner never counts a fallback precision as the requested one (seed 004 §5), "
            "so the run stops here. Pin an image whose kernels support the requested precision, "
            "or change kv=/model= to what the engine really runs (a new config_id)."
        )
    return notes
