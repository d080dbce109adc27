"""Rules that span config groups, checked before anything starts.

:func:`validate` collects every broken rule and raises one :class:`ConfigError`
naming them all, so a user fixes a config in one pass rather than one error
per launch. Doubtful but runnable choices come back as warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from runner.config import RunConfig
from runner.errors import ConfigError
from runner.prepare.launch import API_KEY_VARIABLE, TYPED_FLAGS, flag_name

_FP4 = {"nvfp4", "nvfp4a16"}
_CPU_WEIGHTS = {"bf16", "fp32"}
_CPU_KV = {"auto", "bf16"}
_SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


def _precision(config: RunConfig) -> Iterator[str]:
    hw, model, kv = config.hw, config.model, config.kv
    if hw is None:
        if model.weights not in _CPU_WEIGHTS:
            yield (
                f"model {model.name} has {model.weights} weights, but the CPU backend runs "
                "only bf16 or fp32 checkpoints (append +hw=PROFILE for a GPU)"
            )
        if kv.precision not in _CPU_KV:
            yield f"kv={kv.name} is not supported on the CPU; use kv=auto or kv=bf16"
        return
    native = set(hw.native_precisions)
    if model.weights in _FP4 | {"fp8"} and model.weights not in native:
        why = " (Hopper has no native FP4 tensor cores, seed 003)" if model.weights in _FP4 else ""
        yield (
            f"model {model.name} has {model.weights} weights, which {hw.name} ({hw.arch}) "
            f"does not run natively{why}; its native precisions are {sorted(native)}"
        )
    if kv.precision in {"fp8", "nvfp4"} and kv.precision not in native:
        why = " (Hopper has no native FP4, seed 003)" if kv.precision == "nvfp4" else ""
        yield (
            f"kv={kv.name} needs native {kv.precision}, which {hw.name} ({hw.arch}) "
            f"lacks{why}; choose one of {sorted(native)} or kv=auto"
        )


def _lengths(config: RunConfig) -> Iterator[str]:
    engine, model, workload = config.engine, config.model, config.workload
    served_len = engine.max_model_len or model.max_context
    source = "engine.max_model_len" if engine.max_model_len else f"model {model.name}'s max_context"
    if workload.kind == "context_mix" and served_len < workload.largest_total:
        yield (
            f"{source} is {served_len} tokens but workload {workload.name}'s largest bucket "
            f"needs {workload.largest_total}; raise it or choose a smaller workload"
        )
    allowed_long = engine.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1"
    if engine.max_model_len and engine.max_model_len > model.max_context and not allowed_long:
        yield (
            f"engine.max_model_len={engine.max_model_len} exceeds model {model.name}'s "
            f"max_context={model.max_context}; vLLM refuses that unless "
            "engine.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN='1' (seed 003)"
        )
    if workload.max_tokens is None:
        yield (
            f"workload {workload.name} has no max_tokens; vLLM would silently stop every "
            "answer at 16 tokens (seed 004 §12)"
        )
    elif workload.kind == "sharegpt":
        if workload.max_tokens >= served_len:
            yield (
                f"workload {workload.name}'s max_tokens={workload.max_tokens} leaves no room "
                f"for a prompt in the {served_len}-token context ({source})"
            )
    elif workload.max_tokens >= min(bucket.total_tokens for bucket in workload.buckets):
        smallest = min(bucket.total_tokens for bucket in workload.buckets)
        yield (
            f"workload {workload.name}'s max_tokens={workload.max_tokens} leaves no room for "
            f"a prompt in its smallest bucket ({smallest} tokens in total)"
        )


def _concurrency(config: RunConfig) -> Iterator[str]:
    search, engine = config.search, config.engine
    if config.workload.kind == "sharegpt":
        # The fixed-concurrency benchmark runs no search: its users are workload.concurrency.
        yield from _benchmark_concurrency(config)
        return
    if search.kind == "fixed":
        largest, what = max(search.users), "the largest of search.users"
    else:
        if search.start_users > search.max_users:
            yield (
                f"search.start_users={search.start_users} is above "
                f"search.max_users={search.max_users}"
            )
        largest, what = search.max_users, "search.max_users (the bracket search's ceiling)"
    if engine.max_num_seqs is not None and engine.max_num_seqs < largest:
        yield (
            f"engine.max_num_seqs={engine.max_num_seqs} is below {what}={largest}; the engine "
            "would queue users instead of serving them (seed 004 §10); raise "
            "engine.max_num_seqs or lower the user count"
        )


def _benchmark_concurrency(config: RunConfig) -> Iterator[str]:
    workload, engine = config.workload, config.engine
    if workload.concurrency is None:
        yield (
            f"workload {workload.name} (kind sharegpt) needs workload.concurrency, the number "
            "of users that keep a request in flight (seed 000 runs 32)"
        )
    elif engine.max_num_seqs is not None and engine.max_num_seqs < workload.concurrency:
        yield (
            f"engine.max_num_seqs={engine.max_num_seqs} is below "
            f"workload.concurrency={workload.concurrency}; the engine would queue users "
            "instead of serving them (seed 000 serves 32 users with --max-num-seqs 32)"
        )


def _workload_kind(config: RunConfig, warnings: list[str]) -> Iterator[str]:
    """The input the ShareGPT benchmark needs: its local dataset file."""
    workload = config.workload
    if workload.kind != "sharegpt":
        return
    dataset = Path(workload.dataset_path).expanduser()
    if not dataset.is_file():
        message = (
            f"workload.dataset_path={workload.dataset_path} is not a file on this host; "
            "download the ShareGPT JSON (seed 000: ShareGPT_V3_unfiltered_cleaned_split.json) "
            "and point dataset_path at it, nothing is fetched during a run"
        )
        if config.dry_run:
            warnings.append(message)
        else:
            yield message


def _provenance(config: RunConfig, warnings: list[str]) -> Iterator[str]:
    image, model = config.image, config.model
    if config.backend.kind == "docker" and not image.pinned and not image.allow_unpinned:
        message = (
            f"image {image.name} ({image.reference}) has no digest; a tag can move, so "
            "pin it with image.digest=sha256:... (docker inspect --format "
            "'{{index .RepoDigests 0}}' IMAGE)"
        )
        if config.dry_run:
            warnings.append(message + " before measuring")
        else:
            yield message + " before measuring"
    if model.revision is None and not model.allow_unresolved_revision:
        message = (
            f"model {model.name} ({model.repo}) has no revision; set model.revision=COMMIT "
            "(the snapshot folder name in the Hugging Face cache) so results name the exact "
            "checkpoint (seed 004 §4)"
        )
        if config.dry_run:
            warnings.append(message)
        else:
            yield message


def _placement(config: RunConfig, warnings: list[str]) -> Iterator[str]:
    backend, engine, hw = config.backend, config.engine, config.hw
    if backend.kind == "external":
        if not backend.url:
            yield "backend=external needs backend.url, the running server's base URL"
        warnings.append(
            "backend=external: runner starts no engine, so the engine, model and kv options "
            "only label the results; make sure they describe the server at "
            f"{backend.url}"
        )
    if hw is not None and engine.tensor_parallel_size > hw.count:
        yield (
            f"engine.tensor_parallel_size={engine.tensor_parallel_size} needs more GPUs than "
            f"{hw.name} has ({hw.count})"
        )
    if hw is not None and hw.device_ids is not None and len(hw.device_ids) != hw.count:
        yield f"hw.device_ids lists {len(hw.device_ids)} GPUs but hw.count is {hw.count}"
    if hw is None and backend.kind == "docker" and not config.image.local_build:
        warnings.append(
            f"image {config.image.name} is a registry image and no hw profile is given; "
            "official vLLM images need a GPU"
        )
    if hw is None and (engine.gpu_memory_utilization or 0) > 0.5:
        warnings.append(
            f"engine.gpu_memory_utilization={engine.gpu_memory_utilization} on the CPU "
            "reserves that share of RAM for the KV cache; vLLM fails to start when it is "
            "not free"
        )


def _flags_and_secrets(config: RunConfig) -> Iterator[str]:
    engine = config.engine
    covered = sorted(
        {flag_name(arg) for arg in engine.extra_args if flag_name(arg) in TYPED_FLAGS}
    )
    for flag in covered:
        yield f"engine.extra_args sets {flag}, which {TYPED_FLAGS[flag]} already sets; use that field"
    if engine.api_key_env and engine.api_key_env != API_KEY_VARIABLE:
        yield (
            f"engine.api_key_env={engine.api_key_env}: vLLM reads its API key from "
            f"{API_KEY_VARIABLE} only, so export the key under that name and set "
            f"engine.api_key_env={API_KEY_VARIABLE}"
        )
    for name in engine.env:
        if any(marker in name.upper() for marker in _SECRET_MARKERS):
            yield (
                f"engine.env.{name} looks like a secret; secrets are read from your "
                "environment at launch (engine.api_key_env, model.needs_hf_token), "
                "never written in a config"
            )


_RULES: list[Callable[[RunConfig], Iterator[str]]] = [
    _precision,
    _lengths,
    _concurrency,
    _flags_and_secrets,
]


def validate(config: RunConfig) -> list[str]:
    """Return warnings, or raise ConfigError naming every broken rule."""
    warnings: list[str] = []
    problems = [problem for rule in _RULES for problem in rule(config)]
    problems += list(_provenance(config, warnings))
    problems += list(_placement(config, warnings))
    problems += list(_workload_kind(config, warnings))
    if config.engine.max_num_seqs is None:
        warnings.append("engine.max_num_seqs is unset: vLLM's default limits concurrency")
    if problems:
        count = "one rule" if len(problems) == 1 else f"{len(problems)} rules"
        raise ConfigError(
            f"The configuration breaks {count}: "
            + "; ".join(f"({index}) {text}" for index, text in enumerate(problems, 1))
            + ". Nothing was started; fix these in the YAML or on the command line."
        )
    return warnings
