"""How an engine is started, built purely from the run configuration.

:func:`build_launch_plan` maps every typed field of the model, KV cache and
engine options to its vLLM 0.32 flag, so the YAML is the single truth about
what is served. Secrets never reach argv: the plan names the environment
variables the engine reads them from (vLLM takes its API key from
``VLLM_API_KEY``; seed 003 passes ``--api-key`` on the command line, where any
``ps`` on the host can read it, and runner deliberately does not).
"""

from __future__ import annotations

import shlex

from runner.config import Backend, Model, RunConfig
from runner.engines.base import LaunchPlan
from runner.secret import API_KEY_VARIABLE, HF_TOKEN_VARIABLE, hub_offline

# Where the Hugging Face hub cache is mounted inside a container (seed 003 Step 7).
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# trust_remote_code modules are written at load time; the HF cache is mounted
# read-only, so they go to the container's own writable filesystem.
CONTAINER_MODULES_CACHE = "/root/.cache/hf_modules"
DEFAULT_HOST_HF_CACHE = "~/.cache/huggingface/hub"
UNRESOLVED_REVISION = "<unresolved-revision>"

# The variable vLLM reads its API key from, and huggingface_hub its token from.

# Engine flags that carry a secret on the command line, where `ps` on the host reads
# it; runner passes these through the environment instead (vLLM 0.32 --help=all).
SECRET_FLAGS: dict[str, str] = {
    "--api-key": "engine.api_key_env (the key is read from the environment)",
    "--hf-token": "model.needs_hf_token (HF_TOKEN is read from the environment)",
}

# Every flag a typed field (or runner itself) sets, with vLLM's aliases. An
# engine.extra_args entry naming one of them is refused by validation, so the typed
# value stays the one truth behind config_id. A test checks that every flag
# build_launch_plan emits is listed.
TYPED_FLAGS: dict[str, str] = {
    "--model": "the model path runner resolves",
    "--served-model-name": "model.served_name",
    "--quantization": "model.quantization",
    "-q": "model.quantization",
    "--trust-remote-code": "model.trust_remote_code",
    "--no-trust-remote-code": "model.trust_remote_code",
    "--reasoning-parser": "model.reasoning_parser",
    "--tool-call-parser": "model.tool_call_parser",
    "--enable-auto-tool-choice": "model.tool_call_parser",
    "--no-enable-auto-tool-choice": "model.tool_call_parser",
    "--mamba-ssm-cache-dtype": "model.mamba_ssm_cache_dtype",
    "--kv-cache-dtype": "kv",
    "--max-num-seqs": "engine.max_num_seqs",
    "--max-num-batched-tokens": "engine.max_num_batched_tokens",
    "--gpu-memory-utilization": "engine.gpu_memory_utilization",
    "--max-model-len": "engine.max_model_len",
    "--enable-chunked-prefill": "engine.enable_chunked_prefill",
    "--no-enable-chunked-prefill": "engine.enable_chunked_prefill",
    "--enable-prefix-caching": "engine.enable_prefix_caching",
    "--no-enable-prefix-caching": "engine.enable_prefix_caching",
    "--tensor-parallel-size": "engine.tensor_parallel_size",
    "-tp": "engine.tensor_parallel_size",
    "--enable-expert-parallel": "engine.enable_expert_parallel",
    "--no-enable-expert-parallel": "engine.enable_expert_parallel",
    "-ep": "engine.enable_expert_parallel",
    "--dtype": "engine.dtype",
    "--async-scheduling": "engine.async_scheduling",
    "--no-async-scheduling": "engine.async_scheduling",
    "--generation-config": "engine.generation_config",
    "--long-prefill-token-threshold": "engine.long_prefill_token_threshold",
    "--max-num-partial-prefills": "engine.max_num_partial_prefills",
    "--max-long-partial-prefills": "engine.max_long_partial_prefills",
    "--load-format": "engine.load_format",
    "--kv-cache-memory-bytes": "engine.kv_cache_memory_gib",
    "--revision": "model.revision",
    "--host": "the backend",
    "--port": "engine.port",
    "--config": "the typed fields (a --config YAML could set any flag behind them)",
}
# Environment variables vLLM reads in place of a typed field.
TYPED_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "engine.kv_cache_memory_gib"}


def flag_name(arg: str) -> str:
    """The option an argv word names, read as vLLM's parser reads it.

    vLLM turns ``_`` into ``-`` in option names and reads ``--x.key=1`` as part of
    ``--x``: ``--max_num_seqs=4``, ``--max-num-seqs`` and ``--max-num-seqs.a=1`` all
    name ``--max-num-seqs``; ``-tp=2`` names ``-tp``.
    """
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def owned_flag(arg: str, owners: dict[str, str]) -> str | None:
    """The flag of ``owners`` that ``arg`` sets, or None.

    Python's argparse (vLLM's parser) also accepts an unambiguous prefix of a long
    option, so ``--api-k`` sets ``--api-key``: a prefix counts as the flag it starts.
    """
    name = flag_name(arg)
    if not name.startswith("-") or name in ("-", "--"):
        return None
    if name in owners:
        return name
    if name.startswith("--") and len(name) > 3:
        started = [flag for flag in owners if flag.startswith(name)]
        return started[0] if started else None
    return None


def kv_cache_bytes(gib: float) -> int:
    """``engine.kv_cache_memory_gib`` as the integer vLLM's --kv-cache-memory-bytes takes."""
    return round(gib * 2**30)


def hub_cache_folder(repo: str) -> str:
    """The folder huggingface_hub keeps a repository in: ``models--ORG--NAME``."""
    return "models--" + repo.replace("/", "--")


def container_model_path(model: Model, hf_home: str = CONTAINER_HF_HOME) -> str:
    """The checkpoint's path as the engine sees it inside the container.

    Seed 003 pitfall 2: a host path does not exist in the container, and a repo id
    with ``HF_HUB_OFFLINE=1`` fails the revision lookup; the snapshot folder under
    the mount point works. An unresolved revision yields a visible placeholder.
    """
    revision = model.revision or UNRESOLVED_REVISION
    return f"{hf_home}/{hub_cache_folder(model.repo)}/snapshots/{revision}"


def _model_args(model: Model) -> list[str]:
    args = ["--served-model-name", model.served_name]
    if model.quantization:
        args += ["--quantization", model.quantization]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    if model.mamba_ssm_cache_dtype:
        args += ["--mamba-ssm-cache-dtype", model.mamba_ssm_cache_dtype]
    if model.reasoning_parser:
        args += ["--reasoning-parser", model.reasoning_parser]
    if model.tool_call_parser:
        # A tool parser does nothing unless the server may choose tools itself.
        args += ["--enable-auto-tool-choice", "--tool-call-parser", model.tool_call_parser]
    return args


def _engine_args(config: RunConfig) -> list[str]:
    engine = config.engine
    args = ["--dtype", engine.dtype, "--kv-cache-dtype", config.kv.cache_dtype]
    valued = [
        ("--max-model-len", engine.max_model_len),
        ("--gpu-memory-utilization", engine.gpu_memory_utilization),
        (
            "--kv-cache-memory-bytes",
            kv_cache_bytes(engine.kv_cache_memory_gib) if engine.kv_cache_memory_gib else None,
        ),
        ("--max-num-seqs", engine.max_num_seqs),
        ("--max-num-batched-tokens", engine.max_num_batched_tokens),
        ("--tensor-parallel-size", engine.tensor_parallel_size),
        ("--generation-config", engine.generation_config),
        ("--long-prefill-token-threshold", engine.long_prefill_token_threshold),
        ("--max-num-partial-prefills", engine.max_num_partial_prefills),
        ("--max-long-partial-prefills", engine.max_long_partial_prefills),
        # A generated model has no weights: left unset, vLLM is told to make random ones.
        ("--load-format", engine.load_format or ("dummy" if config.model.generated else None)),
    ]
    for flag, value in valued:
        if value is not None:
            args += [flag, str(value)]
    if engine.enable_chunked_prefill is not None:
        args.append(
            "--enable-chunked-prefill"
            if engine.enable_chunked_prefill
            else "--no-enable-chunked-prefill"
        )
    # vLLM turns prefix caching on by default; the measurement assumes every
    # request is a cache miss, so "off" is always said out loud (seed 004 §5).
    args.append(
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching"
    )
    if engine.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if engine.async_scheduling:
        args.append("--async-scheduling")
    return args


def _gpus(config: RunConfig) -> str | None:
    if config.hw is None:
        return None
    if config.hw.device_ids:
        # "device=" keeps "3" (one GPU, id 3) from reading as a count of three GPUs.
        return "device=" + ",".join(str(device) for device in config.hw.device_ids)
    return str(config.hw.count)


def build_launch_plan(config: RunConfig, *, model_path: str, host: str) -> LaunchPlan:
    """The vLLM serve arguments, environment and container settings for ``config``.

    ``model_path`` is the checkpoint as the engine sees it (see
    :func:`container_model_path` for containers); ``host`` is the address the
    server binds to (inside a container, 0.0.0.0 so the published port reaches it).
    """
    in_container = config.backend.kind == "docker"
    argv = ["--model", model_path, *_model_args(config.model), *_engine_args(config)]
    argv += ["--host", host, "--port", str(config.engine.port), *config.engine.extra_args]

    env = dict(config.engine.env)
    mounts: list[tuple[str, str, str]] = []
    if in_container:
        # The checkpoint is already on disk; the engine must not reach the hub.
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_HOME"] = CONTAINER_HF_HOME
        if config.model.trust_remote_code:
            env["HF_MODULES_CACHE"] = CONTAINER_MODULES_CACHE
        if not config.model.generated:  # a generated model is not in the hub cache
            host_cache = config.backend.hf_cache or DEFAULT_HOST_HF_CACHE
            mounts.append((host_cache, CONTAINER_HF_HOME, "ro"))

    secret_env: list[str] = []
    if config.engine.api_key_env:
        secret_env.append(API_KEY_VARIABLE)
    if config.model.needs_hf_token and not hub_offline(env):
        # An engine kept off the hub never uses the token, so it never gets it.
        secret_env.append(HF_TOKEN_VARIABLE)

    return LaunchPlan(
        image=config.image.reference if in_container else None,
        argv=argv,
        env=env,
        secret_env=secret_env,
        mounts=mounts,
        port=config.engine.port,
        gpus=_gpus(config) if in_container else None,
        model_path=model_path,
    )


def docker_run_line(plan: LaunchPlan, backend: Backend, *, name: str = "runner-engine") -> str:
    """The ``docker run`` command equivalent to what the docker backend starts.

    Secrets are passed as ``-e NAME``: Docker copies the value from the caller's
    environment, so it appears neither in the line nor in the shell history.
    The port is published on 127.0.0.1 only: the load generator runs on the host.
    """
    if plan.image is None:
        raise ValueError("docker_run_line needs a plan built for the docker backend")
    words = ["docker", "run", "--rm", "--name", name]
    if plan.gpus is not None:
        # docker's CLI needs the quotes inside the value for a list of ids: '"device=0,1"'.
        words += ["--gpus", plan.gpus if plan.gpus.isdigit() or plan.gpus == "all" else f'"{plan.gpus}"']
    if backend.ipc_host:
        words.append("--ipc=host")
    elif backend.shm_size:
        words += ["--shm-size", backend.shm_size]
    words += ["-p", f"127.0.0.1:{plan.port}:{plan.port}"]
    for key, value in plan.env.items():
        words += ["-e", f"{key}={value}"]
    for secret in plan.secret_env:
        words += ["-e", secret]
    line = shlex.join(words)
    for host_path, container_path, mode in plan.mounts:
        line += " -v " + _shell_path(f"{host_path}:{container_path}:{mode}")
    return line + " " + shlex.join([plan.image, *plan.argv])


def _shell_path(path: str) -> str:
    # Quoting would stop the shell expanding "~"; "$HOME" expands inside quotes.
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def render_plan(plan: LaunchPlan) -> str:
    """A dry run's account of what would be started; secrets by name only."""
    if plan.image is None:
        where = "local process"
    elif "@" in plan.image:
        where = plan.image
    else:
        where = f"{plan.image} (UNPINNED: no digest)"
    lines = [
        f"engine:  {where}",
        f"model:   {plan.model_path}",
        f"port:    {plan.port}",
        f"gpus:    {plan.gpus if plan.gpus is not None else 'none'}",
        "argv:    " + shlex.join(plan.argv),
    ]
    lines += [f"env:     {key}={value}" for key, value in plan.env.items()]
    lines += [f"secret:  {name} (read from your environment at launch)" for name in plan.secret_env]
    lines += [f"mount:   {host} -> {inside} ({mode})" for host, inside, mode in plan.mounts]
    return "\n".join(lines)
