"""The host doctor's checks (seed 003 section 2): what breaks a run before it starts.

Each check reads one thing about this machine and returns a :class:`Check`: what it
found, and a fix when it is not fine. A check is *needed* when the configured run
cannot work without it (Docker for backend=docker, the driver for a GPU profile,
the engine port for a local process); a needed check that fails is ``fail`` and
makes ``python -m runner.doctor`` exit non-zero, anything else that is off is
``warn``. The ``judge_*`` functions and :func:`is_orphan` are pure, so they are
tested with plain values; the rest read the host.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from runner.config import RunConfig
from runner.engines.docker import (
    LABEL_HOST,
    LABEL_PID,
    connect,
    device_requests,
    find_image,
    remove_containers,
    run_once,
)
from runner.errors import RunnerError
from runner.prepare import host
from runner.prepare.launch import DEFAULT_HOST_HF_CACHE
from runner.prepare.modelref import hub_folder
from runner.prepare.preflight import version_at_least
from runner.prepare.validate import LOOPBACK, MachineMemory, validate

log = logging.getLogger("runner")

Status = Literal["ok", "warn", "fail", "skip"]
# vLLM warns below this many open files; every user holds a connection, every engine
# worker a few pipes.
MIN_OPEN_FILES = 65536
# Free space a run needs: the results folder, runner's cache (tiny model, flags,
# workloads) and an engine image that is not yet on this host (vLLM's CUDA images
# unpack to about 20-30 GB).
RESULTS_GIB = 1.0
CACHE_GIB = 2.0
IMAGE_GIB = 30.0
GPU_PROBE_TIMEOUT_S = 120
# How a vLLM OpenAI server shows in a process list: ``python -m`` of one of these
# modules, or the ``vllm serve`` command.
VLLM_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
VLLM_DEFAULT_PORT = 8000


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table."""

    name: str
    status: Status
    found: str
    fix: str = ""


def problem(name: str, needed: bool, found: str, fix: str) -> Check:
    """``fail`` when the run needs this, ``warn`` otherwise."""
    return Check(name, "fail" if needed else "warn", found, fix)


# -- pure judgements ------------------------------------------------------------------
def judge_open_files(soft: int, hard: int) -> Check:
    found = f"soft {soft}, hard {hard}"
    if soft >= MIN_OPEN_FILES:
        return Check("ulimit -n", "ok", found)
    fix = (
        f"`ulimit -n {MIN_OPEN_FILES}` in the shell that starts runner"
        if hard >= MIN_OPEN_FILES
        else f"raise the hard limit to {MIN_OPEN_FILES} (limits.conf, or docker run --ulimit "
        f"nofile={MIN_OPEN_FILES}), then `ulimit -n {MIN_OPEN_FILES}`"
    )
    return Check("ulimit -n", "warn", found + f" (vLLM warns below {MIN_OPEN_FILES})", fix)


def judge_driver(version: str, minimum: str, profile: str, needed: bool = True) -> Check:
    found = f"{version} (profile {profile} needs >= {minimum})"
    if version_at_least(version, minimum):
        return Check("NVIDIA driver", "ok", found)
    return problem("NVIDIA driver", needed, found, f"install driver {minimum} or newer")


def judge_disk(label: str, folder: Path, free_gib: float, need_gib: float, needed: bool) -> Check:
    need = f"needs {need_gib:g} GiB" if need_gib else "the model's size is not known here"
    found = f"{free_gib:.1f} GiB free at {folder} ({need})"
    if free_gib >= need_gib:
        return Check(f"disk: {label}", "ok", found)
    return problem(
        f"disk: {label}", needed, found, f"free space on {folder} or point {label} elsewhere"
    )


def judge_numa(
    nodes: list[host.NumaNode], memory: MachineMemory | None, kv_gib: float | None
) -> Check:
    """Node figures as they are now; vLLM CPU allocates its KV cache on node 0."""
    figures = ", ".join(
        f"node {n.index}: {n.free_gib:.1f}/{n.total_gib:.1f} GiB free" for n in nodes
    )
    total = memory.describe() if memory else "physical memory unknown"
    found = f"{total}; {figures or 'no NUMA nodes shown'}"
    caveat = (
        " (on some VMs node 0 starts small and grows as memory is used; these are today's figures)"
    )
    node0 = next((node for node in nodes if node.index == 0), None)
    if kv_gib is None or node0 is None or kv_gib <= node0.free_gib:
        return Check("NUMA memory", "ok", found + caveat)
    return Check(
        "NUMA memory",
        "warn",
        found + caveat,
        f"vLLM checks engine.kv_cache_memory_gib={kv_gib:g} against node 0's free memory when it "
        "starts: lower it, or stop what holds memory on node 0",
    )


def is_vllm_server(cmdline: Sequence[str]) -> bool:
    """Whether a process's argv starts a vLLM server (``python -m vllm.entrypoints...``
    or ``vllm serve``)."""
    if any(module in cmdline for module in VLLM_SERVER_MODULES):
        return True
    return any(
        Path(word).name == "vllm" and later == "serve"
        for word, later in itertools.pairwise(cmdline)
    )


def server_port(cmdline: Sequence[str]) -> int:
    """The port a vLLM server listens on: its ``--port N`` (or ``--port=N``), else vLLM's
    default."""
    for index, word in enumerate(cmdline):
        value = cmdline[index + 1] if word == "--port" and index + 1 < len(cmdline) else None
        if word.startswith("--port="):
            value = word.split("=", 1)[1]
        if value is not None and value.isdigit():
            return int(value)
    return VLLM_DEFAULT_PORT


def judge_other_engines(found: Sequence[tuple[int, int]]) -> Check:
    """vLLM servers on this host other than the run's, as (pid, port). Only the pid and
    port are shown: a server's argv may carry an API key."""
    if not found:
        return Check("other vLLM servers", "ok", "none running")
    listed = ", ".join(f"pid {pid} (port {port})" for pid, port in found)
    return Check(
        "other vLLM servers",
        "warn",
        listed,
        "stop them before measuring: even serving nothing, a vLLM CPU engine keeps threads "
        "that wake a hundred times a second on the cores runner's client needs (its "
        "windows are then refused for a late client), and on a GPU one holds its memory",
    )


def is_orphan(labels: Mapping[str, str], this_host: str, alive: Callable[[int], bool]) -> bool:
    """A container runner started on this host whose runner process is gone.

    One started elsewhere (another host, or runner inside a container, whose pids live
    in another namespace) is never judged: its owner cannot be seen from here.
    """
    pid = labels.get(LABEL_PID, "")
    return labels.get(LABEL_HOST) == this_host and pid.isdigit() and not alive(int(pid))


def needs_docker(config: RunConfig) -> bool:
    return config.backend.kind == "docker"


def uses_gpu(config: RunConfig) -> bool:
    return config.hw is not None and config.backend.kind != "external"


# -- checks that read the host -----------------------------------------------------
def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def check_config(config: RunConfig) -> Check:
    try:
        warnings = validate(config, host.machine_memory())
    except RunnerError as exc:
        return Check("config", "fail", "refused", str(exc))
    return Check("config", "warn" if warnings else "ok", "; ".join(warnings) or "validates")


def check_docker(config: RunConfig) -> tuple[Check, Any]:
    """Whether a Docker engine answers; returns the client for the checks that follow."""
    try:
        client = connect()
    except RunnerError as exc:
        fix = "start dockerd (or set DOCKER_HOST), or use backend=process"
        return problem("Docker engine", needs_docker(config), str(exc.__cause__ or exc), fix), None
    version = client.version()
    return Check(
        "Docker engine", "ok", f"{version.get('Version')} (API {version.get('ApiVersion')})"
    ), client


def check_nvidia_runtime(config: RunConfig, client: Any) -> Check:
    name = "NVIDIA container runtime"
    if config.hw is None or client is None:
        return Check(name, "skip", "no GPU profile" if config.hw is None else "no Docker engine")
    runtimes = sorted((client.info().get("Runtimes") or {}).keys())
    hook = shutil.which("nvidia-container-runtime-hook") or shutil.which("nvidia-ctk")
    if "nvidia" in runtimes or hook:
        return Check(name, "ok", f"runtimes {runtimes}" + (f", {hook}" if hook else ""))
    return problem(
        name,
        needs_docker(config),
        f"runtimes {runtimes}, no nvidia-container-runtime-hook on PATH",
        "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure "
        "--runtime=docker`, then restart dockerd",
    )


def check_gpu_in_container(config: RunConfig, client: Any, runtime: Check) -> Check:
    """``nvidia-smi -L`` in a throwaway container from the run's image, GPUs passed through."""
    name = "GPU inside a container"
    if config.hw is None or client is None or runtime.status != "ok":
        return Check(name, "skip", "needs a GPU profile, Docker and the NVIDIA runtime")
    image = find_image(client, config.image.reference)
    if image is None:
        return Check(name, "skip", f"{config.image.reference} is not on this host yet")
    try:
        status, output = run_once(
            client,
            image.id,
            "doctor",
            GPU_PROBE_TIMEOUT_S,
            entrypoint=["nvidia-smi", "-L"],
            device_requests=device_requests("all"),
        )
    except Exception as exc:  # noqa: BLE001 - docker and requests errors alike: the row says what failed
        return problem(
            name, needs_docker(config), f"{type(exc).__name__}: {exc}", "see the NVIDIA runtime row"
        )
    output = output.strip()
    gpus = [line for line in output.splitlines() if line.startswith("GPU ")]
    if status == 0 and len(gpus) >= config.hw.count:
        return Check(name, "ok", f"{len(gpus)} GPU(s): {gpus[0]}")
    return problem(
        name,
        needs_docker(config),
        output[-300:] or f"exit {status}",
        f"the profile needs {config.hw.count} GPU(s) visible to containers",
    )


def check_gpus(config: RunConfig) -> Iterator[Check]:
    """Driver against the profile's minimum, and compute processes that are not runner's."""
    from runner.nvml import load, nvml_available, read, text

    if config.hw is None:
        yield Check("NVIDIA driver", "skip", "no GPU profile (+hw=NAME)")
        return
    if not nvml_available():
        yield problem(
            "NVIDIA driver",
            uses_gpu(config),
            "NVML does not load: no NVIDIA driver",
            "run GPU profiles on a GPU host with the NVIDIA driver",
        )
        return
    nvml = load()
    nvml.nvmlInit()
    try:
        driver = text(nvml.nvmlSystemGetDriverVersion())
        yield judge_driver(driver, config.hw.min_driver, config.hw.name, uses_gpu(config))
        count = nvml.nvmlDeviceGetCount()
        indices = config.hw.device_ids or list(range(min(count, config.hw.count)))
        busy = []
        for index in indices:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for process in read(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []:
                busy.append(
                    f"GPU {index}: pid {process.pid} ({(process.usedGpuMemory or 0) / 2**30:.1f} GiB)"
                )
    finally:
        nvml.nvmlShutdown()
    if busy:
        yield problem(
            "foreign GPU processes",
            uses_gpu(config),
            "; ".join(busy),
            "stop them: a benchmark on a shared GPU measures the wrong thing (seed 004 §3)",
        )
    else:
        yield Check("foreign GPU processes", "ok", f"none on GPU(s) {indices}")


def local_hf_cache(config: RunConfig) -> Path:
    return Path(config.backend.hf_cache or DEFAULT_HOST_HF_CACHE).expanduser()


def check_hf_cache(config: RunConfig) -> Check:
    model = config.model
    if model.generated or config.backend.kind == "external":
        return Check(
            "HF cache",
            "skip",
            "the model is generated locally" if model.generated else "backend=external",
        )
    folder = hub_folder(local_hf_cache(config), model.repo)
    snapshots = folder / "snapshots"
    wanted = snapshots / model.revision if model.revision else None
    if (wanted or snapshots).is_dir() and any((wanted or snapshots).iterdir()):
        return Check("HF cache", "ok", str(wanted or snapshots))
    revision = f" --revision {model.revision}" if model.revision else ""
    return problem(
        "HF cache",
        needs_docker(config),
        f"{wanted or snapshots} is missing",
        f"huggingface-cli download {model.repo}{revision} --cache-dir {local_hf_cache(config)} "
        "(the container reads it offline)",
    )


def check_disks(config: RunConfig, client: Any) -> Iterator[Check]:
    wants = [
        ("results", Path(config.results.dir), RESULTS_GIB, True),
        ("cache_dir", Path(config.cache_dir), CACHE_GIB, True),
    ]
    if (
        needs_docker(config)
        and client is not None
        and find_image(client, config.image.reference) is None
    ):
        root = Path(client.info().get("DockerRootDir") or "/var/lib/docker")
        wants.append(("image (Docker root)", root, IMAGE_GIB, True))
    if not config.model.generated and config.backend.kind != "external":
        # The model's size is unknown here; the folder is reported so its room is seen.
        wants.append(("HF cache", local_hf_cache(config), 0.0, False))
    for label, path, need, needed in wants:
        folder, free = host.free_disk_gib(path)
        yield judge_disk(label, folder, free, need, needed)


def check_port(config: RunConfig) -> Check:
    from runner.engines.process import port_is_free

    if config.backend.kind != "process":
        why = "Docker publishes on a free port" if needs_docker(config) else "backend=external"
        return Check("engine port", "skip", why)
    port = config.engine.port
    if port_is_free("127.0.0.1", port):
        return Check("engine port", "ok", f"127.0.0.1:{port} is free")
    return problem(
        "engine port",
        True,
        f"127.0.0.1:{port} is in use",
        "stop what listens there, or choose another with engine.port=N",
    )


def check_torch_stack(config: RunConfig) -> Check:
    import sys

    from runner.prepare.torchstack import check_companions

    if config.backend.kind != "process":
        return Check("torch companions", "skip", f"backend={config.backend.kind}")
    python = config.backend.python or sys.executable
    try:
        stack = check_companions(python, Path(config.cache_dir))
    except RunnerError as exc:
        return problem("torch companions", True, "do not load with the engine's torch", str(exc))
    found = ", ".join(f"{name} {version}" for name, version in stack.companions.items())
    return Check("torch companions", "ok", f"torch {stack.torch}; " + (found or "none installed"))


def check_memory(config: RunConfig) -> Check:
    kv = config.engine.kv_cache_memory_gib if config.hw is None else None
    return judge_numa(host.numa_nodes(), host.machine_memory(), kv)


def check_other_engines(config: RunConfig) -> Check:
    """Other vLLM servers running on this host. With ``backend=external`` on this host,
    the server listening on the run's port is the one measured, and is left out."""
    import psutil

    spared = None
    if config.backend.kind == "external" and config.backend.url:
        url = urlsplit(config.backend.url)
        # 0.0.0.0, dialled, reaches this host too.
        if url.hostname in LOOPBACK | {"0.0.0.0"}:
            spared = url.port or (443 if url.scheme == "https" else 80)
    servers: dict[int, int] = {}
    parents: dict[int, int] = {}
    for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if is_vllm_server(cmdline):
            servers[process.info["pid"]] = server_port(cmdline)
            parents[process.info["pid"]] = process.info["ppid"]
    # A server's forked children show its argv too; the one that started them is listed.
    found = [
        (pid, port)
        for pid, port in sorted(servers.items())
        if parents[pid] not in servers and port != spared
    ]
    return judge_other_engines(found)


def check_orphans(client: Any, clean: bool) -> Check:
    """Engine containers whose runner is gone; removed with ``--clean``."""
    if client is None:
        return Check("orphaned containers", "skip", "no Docker engine")
    this_host = socket.gethostname()
    labelled = client.containers.list(all=True, ignore_removed=True, filters={"label": LABEL_PID})
    orphans = [item for item in labelled if is_orphan(item.labels, this_host, pid_alive)]
    if not orphans:
        return Check(
            "orphaned containers",
            "ok",
            f"none ({len(labelled)} of runner's, each with its runner alive)",
        )
    names = ", ".join(item.name for item in orphans)
    if clean:
        removed = remove_containers(orphans)
        return Check("orphaned containers", "ok", f"removed {removed}: {names}")
    return Check(
        "orphaned containers",
        "warn",
        f"{len(orphans)} whose runner is gone: {names}",
        "python -m runner.doctor --clean",
    )


def run_checks(config: RunConfig, *, clean: bool = False) -> list[Check]:
    """Every check, in the order a user fixes them."""
    docker_row, client = check_docker(config)
    runtime = check_nvidia_runtime(config, client)
    return [
        check_config(config),
        docker_row,
        runtime,
        check_gpu_in_container(config, client, runtime),
        *check_gpus(config),
        check_torch_stack(config),
        check_hf_cache(config),
        *check_disks(config, client),
        check_port(config),
        judge_open_files(*host.open_files_limit()),
        check_memory(config),
        check_other_engines(config),
        check_orphans(client, clean),
    ]
