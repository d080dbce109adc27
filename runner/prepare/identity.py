"""Names for what was measured: config_id, result family and run id.

``config_id`` identifies the served engine (seed 004 §10: "give every changed
server setup a new config_id"): the same setup gets the same id on any machine,
and any change to what is served gets a new one. What the users send (workload,
search, SLO) and where results go are not part of it, so results of one engine
under several workloads share an id.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from runner.config import Precision, RunConfig, Workload

# Engine fields that do not change what is served: a label, the port the
# server listens on (which only decides how it is reached) and the *name* of
# the variable an API key is read from.
_ENGINE_FIELDS_NOT_SERVED = {"name", "port", "api_key_env"}

_WEIGHT_FAMILIES: dict[Precision, str] = {
    "fp32": "fp32",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "nvfp4": "nvfp4-w4a4",
    "nvfp4a16": "nvfp4a16",
    "int4": "int4",
}
_SIXTEEN_BIT = {"fp32", "bf16", "fp16"}
DUMMY_WEIGHTS = "dummy-weights"


def served_setup(config: RunConfig) -> dict[str, Any]:
    """Everything that defines the served engine, as plain values."""
    hw = config.hw
    image = config.image
    model = config.model
    engine = config.engine.model_dump(exclude=_ENGINE_FIELDS_NOT_SERVED)
    if engine["kv_cache_memory_gib"] is None:
        # A field added later: left out while unset, so setups that never set it keep
        # the config_id they were measured under.
        del engine["kv_cache_memory_gib"]
    setup: dict[str, Any] = {
        "hw": "cpu" if hw is None else {"name": hw.name, "gpu_name": hw.gpu_name, "count": hw.count},
        "image": {"reference": image.reference, "vllm_version": image.vllm_version},
        "model": {
            "repo": f"{model.repo}@{model.revision}",
            "weights": model.weights,
            "quantization": model.quantization,
            "trust_remote_code": model.trust_remote_code,
            "reasoning_parser": model.reasoning_parser,
            "tool_call_parser": model.tool_call_parser,
            "mamba_ssm_cache_dtype": model.mamba_ssm_cache_dtype,
            "generated": model.generated,
        },
        "kv_cache_dtype": config.kv.cache_dtype,
        "engine": engine,
    }
    if model.architecture is not None:
        # A generated model is its config.json; the built-in tiny one keeps the id it always had.
        setup["model"]["architecture"] = model.architecture
        setup["model"]["max_context"] = model.max_context
    return setup


def config_id(config: RunConfig) -> str:
    """A short stable hash (12 hex digits) of :func:`served_setup`."""
    canonical = json.dumps(served_setup(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def family(config: RunConfig) -> str:
    """The result family (seed 004 §10): results of two families never share a leaderboard.

    The weights' precision, plus the KV precision whenever it is not what those
    weights imply ("auto", or 16-bit KV for 16-bit weights): ``bf16``,
    ``fp8-fp8kv``, ``nvfp4a16``, ``nvfp4-w4a4-fp8kv``, ``nvfp4-w4a4-nvfp4kv``;
    then the workload's own mark (:func:`workload_family`), e.g. ``bf16-natural-eos``.
    Random weights come first, ``dummy-weights-bf16``: such results are never ranked
    with a real checkpoint's.
    """
    base = _WEIGHT_FAMILIES[config.model.weights]
    kv = config.kv.precision
    if not (kv == "auto" or (kv == "bf16" and config.model.weights in _SIXTEEN_BIT)):
        base = f"{base}-{kv}kv"
    if dummy_weights(config):
        base = f"{DUMMY_WEIGHTS}-{base}"
    return base + workload_family(config.workload)


def dummy_weights(config: RunConfig) -> bool:
    """Whether the engine serves random weights: a generated model, or ``--load-format dummy``."""
    return config.model.generated or config.engine.load_format == "dummy"


def caveats(config: RunConfig) -> list[str]:
    """What a reader of these results must know before comparing them with others."""
    if not dummy_weights(config):
        return []
    notes = [
        (
            "Random weights (`--load-format dummy`): the figures are this architecture's "
            "compute, not a trained checkpoint's, and the generated text is meaningless. They "
            f"are kept in the `{DUMMY_WEIGHTS}-*` families, never ranked with a real checkpoint's."
        ),
        (
            "MoE routing is not realistic: random router weights spread tokens over the experts "
            "unlike a trained router, so expert load (and expert-parallel balance) can differ."
        ),
        (
            "Speculative decoding is not realistic: a draft agrees with random weights almost "
            "never, so acceptance, and any speedup from it, is a worst case."
        ),
    ]
    if config.workload.ignore_eos:
        notes.append(
            "Output lengths are forced (`ignore_eos`, every answer exactly max_tokens), which is "
            "what makes random weights do a trained model's work per request."
        )
    else:
        notes.append(
            "Answers end where random sampling hits the end-of-sequence token, not where a "
            "trained model would stop: output lengths are not a real model's."
        )
    return notes


def workload_family(workload: Workload) -> str:
    """The family suffix of what the users send; empty for seed 004's forced-length mix.

    Answers that stop at the model's own EOS are shorter than forced ones, so their
    throughput is not comparable (seed 004 §12 keeps them apart as ``*-natural-eos``);
    seed 000's ShareGPT benchmark reports other figures altogether (``-sharegpt``), and
    chat sessions, with their reused history and think time, another load (``-chat``).
    The workload stays out of ``config_id``, which names the served engine only.
    """
    marks = []
    if workload.kind == "sharegpt":
        marks.append("sharegpt")
    if workload.kind == "chat_sessions":
        marks.append("chat")
    if not workload.ignore_eos:
        marks.append("natural-eos")
    return "".join(f"-{mark}" for mark in marks)


def new_run_id(config: RunConfig, now: datetime | None = None, job: int | None = None) -> str:
    """``<hw>-<model>-<YYYYMMDD-HHMMSS>`` in UTC (seed 004 §1); a multirun's job adds
    ``-j<N>``, since parallel jobs start in the same second."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    hw = "cpu" if config.hw is None else config.hw.name
    parts = [hw, config.model.name, moment.strftime("%Y%m%d-%H%M%S")]
    if job is not None:
        parts.append(f"j{job}")
    return "-".join(part.replace("_", "-") for part in parts)
