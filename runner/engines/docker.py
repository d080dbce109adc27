"""The Docker backend: vLLM's OpenAI server in a container started from a pinned image.

The container is started from the image the config pins (pulled by digest when it
is missing), its API port is published on 127.0.0.1 only, secrets reach it only
through its environment, and it carries the labels ``runner.run_id`` and
``runner.config_id`` so that :func:`remove_run_containers` can always find it, and
``runner.pid`` and ``runner.host`` so that ``runner.doctor --clean`` can tell an
orphan (its runner is gone) from a container a live run still uses.
It is stopped and removed on every way out: ``__exit__``, a failed start, SIGTERM
(turned into ``SystemExit`` so the ``with`` block unwinds) and interpreter exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import docker.errors
import httpx
from docker.types import DeviceRequest

import docker
from runner import shutdown
from runner.config import RunConfig
from runner.engines.base import EngineFault, LaunchPlan, container_fault
from runner.engines.process import secret_values
from runner.errors import EngineStartError, PreflightError

log = logging.getLogger("runner")

LABEL_RUN = "runner.run_id"
LABEL_CONFIG = "runner.config_id"
# Which runner process started a container: `python -m runner.doctor --clean` removes
# containers whose runner is gone (killed by SIGKILL, or its machine rebooted).
LABEL_PID = "runner.pid"
LABEL_HOST = "runner.host"
STOP_TIMEOUT_S = 10
HEALTH_INTERVAL_S = 1.0
_NO_GPU_RUNTIME = ("could not select device driver", "nvidia-container-cli", "unknown runtime")
_live: set[DockerEngine] = set()
_live_lock = threading.Lock()


class DockerUnreachable(EngineStartError):
    """No Docker engine answers here (a dry run goes on without one)."""


def connect() -> Any:
    """A Docker client for the local engine (``DOCKER_HOST`` and friends are honoured)."""
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerUnreachable(
            f"Cannot reach the Docker engine ({exc}). The docker backend needs a running "
            "dockerd that this user may talk to: start it (e.g. `dockerd &` as root) or "
            "set DOCKER_HOST, or choose backend=process."
        ) from exc
    return client


def find_image(client: Any, image_ref: str) -> Any | None:
    """The local image for ``image_ref``, or None.

    A locally built image has no registry digest, so a reference
    ``repository@sha256:X`` also matches a local image whose ID is ``sha256:X``
    and which carries that repository name.
    """
    try:
        return client.images.get(image_ref)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise PreflightError(
            f"Docker cannot look up the image {image_ref!r} ({exc}). Check image.repository, "
            "image.tag and image.digest (sha256: and 64 hex digits)."
        ) from exc
    repository, _, digest = image_ref.partition("@")
    if not digest:
        return None
    try:
        image = client.images.get(digest)
    except (docker.errors.ImageNotFound, docker.errors.APIError):
        return None
    names = {tag.rpartition(":")[0] for tag in image.tags}
    return image if repository in names else None


def ensure_image(client: Any, image_ref: str) -> Any:
    """The image to run: the local one, or pulled by its reference (digest)."""
    image = find_image(client, image_ref)
    if image is not None:
        return image
    log.info("pulling %s", image_ref)
    repository, sep, digest = image_ref.partition("@")
    try:
        if sep:
            return client.images.pull(repository, tag=digest)
        return client.images.pull(image_ref)
    except docker.errors.DockerException as exc:
        raise EngineStartError(
            f"The image {image_ref} is not on this machine and pulling it failed ({exc}). "
            "Check the registry is reachable and the digest exists, or build the image "
            "locally (scripts/build-engine-image.sh builds the CPU engine image)."
        ) from exc


def device_requests(gpus: str | None) -> list[DeviceRequest]:
    """Docker device requests for ``gpus``: "all", a count, or device ids ("0,1" or "device=0")."""
    if gpus is None or gpus == "":
        return []
    spec = gpus.strip().removeprefix("device=")
    if spec == "all":
        return [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if spec.isdigit() and not gpus.startswith("device="):
        return [DeviceRequest(count=int(spec), capabilities=[["gpu"]])]
    ids = [part.strip() for part in spec.split(",") if part.strip()]
    return [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]


def remove_run_containers(run_id: str, client: Any = None) -> int:
    """Force-remove every container labelled with ``run_id``; returns how many."""
    client = client or connect()
    # A container removed between the listing and its inspection is skipped, not an error.
    labelled = {"label": f"{LABEL_RUN}={run_id}"}
    containers = client.containers.list(all=True, ignore_removed=True, filters=labelled)
    return remove_containers(containers)


def remove_containers(containers: list[Any]) -> int:
    """Force-remove ``containers``; one already gone is not an error. Returns how many went."""
    removed = 0
    for container in containers:
        try:
            container.remove(force=True)
            removed += 1
        except docker.errors.NotFound:
            pass
    return removed


def _remove(container: Any) -> None:
    try:
        container.stop(timeout=STOP_TIMEOUT_S)
    except docker.errors.DockerException:
        pass  # already gone or already stopped: removal below settles it
    try:
        container.remove(force=True)
        log.info("removed engine container %s", container.name)
    except docker.errors.NotFound:
        pass
    except docker.errors.DockerException as exc:
        log.warning("could not remove engine container %s: %s", container.name, exc)
def owner_labels() -> dict[str, str]:
    """The labels naming this runner process as a container's owner."""
    return {LABEL_PID: str(os.getpid()), LABEL_HOST: socket.gethostname()}


def run_once(
    client: Any, image_id: str, purpose: str, timeout_s: float, **options: Any
) -> tuple[int | None, str]:
    """Run a throwaway container without network to its end: (exit status, output).

    It is removed whatever happens; Docker's and the wait's errors reach the caller,
    which says what could not be done.
    """
    container = None
    try:
        container = client.containers.run(
            image_id, detach=True, network_disabled=True,
            labels={"runner.purpose": purpose, **owner_labels()}, **options,
        )
        status = container.wait(timeout=timeout_s)
        return status.get("StatusCode"), container.logs().decode("utf-8", "replace")
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.DockerException:
                log.warning("could not remove the %s container %s", purpose, container.short_id)


def _container_name(config_id: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", config_id)[:40].strip("-.") or "engine"
    return f"runner-{safe}-{uuid.uuid4().hex[:6]}"


def _volumes(mounts: list[tuple[str, str, str]]) -> dict[str, dict[str, str]]:
    """Bind mounts with absolute host paths that must exist.

    Docker would create a missing host folder and mount it empty, so a mistyped
    HF cache would surface minutes later as a model that cannot be found.
    """
    volumes = {}
    for host, inside, mode in mounts:
        source = Path(host).expanduser().resolve()
        if not source.exists():
            raise EngineStartError(
                f"The folder {host} to be mounted at {inside} in the engine container does "
                "not exist. Check backend.hf_cache (the host's Hugging Face hub cache) or "
                "download the model first."
            )
        volumes[str(source)] = {"bind": inside, "mode": mode}
    return volumes


class DockerEngine:
    """Context manager: a vLLM container that serves, and is gone afterwards.

    ``with DockerEngine(config, plan, run_id=..., config_id=..., log_dir=...) as engine:``
    yields an object with ``base_url``, ``log_path``, ``fault()``, ``log_tail()``,
    ``image_id`` and ``repo_digests``.
    """

    def __init__(
        self,
        config: RunConfig,
        plan: LaunchPlan,
        *,
        run_id: str,
        config_id: str,
        log_dir: Path,
        client: Any = None,
    ) -> None:
        if not plan.image:
            raise EngineStartError("The docker backend needs an image; the launch plan has none.")
        self.config = config
        self.plan = plan
        self.run_id = run_id
        self.config_id = config_id
        self.log_path: Path | None = Path(log_dir) / "engine.log"
        self.base_url = ""
        self.image_id: str | None = None
        self.ready_s: float | None = None
        self.repo_digests: list[str] = []
        self.container: Any = None
        self._client = client
        self._log_thread: threading.Thread | None = None
        self._previous_sigterm: Any = None

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> DockerEngine:
        with _live_lock:
            _live.add(self)
        self._install_sigterm()
        try:
            self._start()
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop and remove the container; safe to call more than once."""
        container, self.container = self.container, None
        if container is not None:
            with shutdown.shielded():
                _remove(container)
        if self._log_thread is not None:
            self._log_thread.join(timeout=5)
            self._log_thread = None
        self._restore_sigterm()
        with _live_lock:
            _live.discard(self)

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            if callable(previous):
                previous(signum, frame)
            # Unwinding through SystemExit runs every __exit__ on the way out.
            raise SystemExit(128 + signum)

        self._previous_sigterm = previous
        signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is None:
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self._previous_sigterm = None

    # -- start ---------------------------------------------------------------------
    def _start(self) -> None:
        client = self._client or connect()
        self._client = client
        # The run holds its run_id's lock (runner.run.lock), so a container with this
        # run_id is one a killed runner left behind: it would hold the GPUs.
        orphans = remove_run_containers(self.run_id, client)
        if orphans:
            log.warning("removed %d engine container(s) a stopped run %s left behind", orphans, self.run_id)
        plan, backend = self.plan, self.config.backend
        image = ensure_image(client, plan.image)
        self.image_id = image.id
        self.repo_digests = list(image.attrs.get("RepoDigests") or [])
        environment = dict(plan.env)
        environment.update(secret_values(plan.secret_env))
        container_port = f"{plan.port}/tcp"
        options: dict[str, Any] = {
            "command": list(plan.argv),
            "name": _container_name(self.config_id),
            "environment": environment,
            "labels": {LABEL_RUN: self.run_id, LABEL_CONFIG: self.config_id, **owner_labels()},
            # Docker picks a free host port; the API is never exposed beyond this host.
            "ports": {container_port: ("127.0.0.1", None)},
            "volumes": _volumes(plan.mounts),
            "device_requests": device_requests(plan.gpus),
            "detach": True,
        }
        if backend.ipc_host:
            options["ipc_mode"] = "host"
        elif backend.shm_size:
            options["shm_size"] = backend.shm_size
        try:
            self.container = client.containers.create(image.id, **options)
        except docker.errors.DockerException as exc:
            raise EngineStartError(f"Docker refused to create the engine container ({exc}).") from exc
        log.info(
            "starting engine container %s from %s (%s)", self.container.name, plan.image, image.id
        )
        try:
            self.container.start()
        except docker.errors.DockerException as exc:
            raise self._start_failure(exc) from exc
        self.container.reload()
        bindings = self.container.attrs["NetworkSettings"]["Ports"].get(container_port) or []
        if not bindings:
            raise EngineStartError(
                f"The engine container {self.container.name} started but Docker published "
                f"no host port for {container_port}."
            )
        self.base_url = f"http://127.0.0.1:{bindings[0]['HostPort']}"
        self._log_thread = threading.Thread(
            target=self._stream_log, args=(self.container,), name="engine-log", daemon=True
        )
        self._log_thread.start()

    def _start_failure(self, exc: Exception) -> EngineStartError:
        text = str(exc)
        if self.plan.gpus and any(marker in text for marker in _NO_GPU_RUNTIME):
            return EngineStartError(
                f"Docker could not give the engine container the GPUs it asks for "
                f"(gpus={self.plan.gpus}): {text}. This host has no NVIDIA container "
                "runtime or no GPU. Install the NVIDIA Container Toolkit "
                "(`nvidia-ctk runtime configure --runtime=docker`, then restart dockerd) "
                "on a GPU host, or run a CPU profile here."
            )
        return EngineStartError(f"Docker could not start the engine container: {text}")

    def _stream_log(self, container: Any) -> None:
        assert self.log_path is not None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_path.open("ab") as sink:
                for chunk in container.logs(stream=True, follow=True):
                    sink.write(chunk)
                    sink.flush()
        except (docker.errors.DockerException, OSError, ValueError) as exc:
            # The stream ends with an error when the container is removed under it.
            log.debug("engine log stream ended: %s", exc)

    def _wait_ready(self) -> None:
        timeout_s = self.config.backend.startup_timeout_s
        started = time.monotonic()
        deadline = started + timeout_s
        with httpx.Client(timeout=5.0) as http:
            while time.monotonic() < deadline:
                fault = self.fault()
                if fault is not None:
                    if self._log_thread is not None:
                        self._log_thread.join(timeout=5)  # the last lines explain the exit
                    raise EngineStartError(
                        f"The engine container exited before it became ready ({fault.reason}). "
                        f"Last lines of its log ({self.log_path}):\n{self.log_tail(30)}"
                    )
                try:
                    if http.get(f"{self.base_url}/health").status_code == 200:
                        self.ready_s = time.monotonic() - started
                        log.info("engine ready at %s after %.1f s", self.base_url, self.ready_s)
                        return
                except httpx.HTTPError:
                    pass  # not listening yet
                time.sleep(HEALTH_INTERVAL_S)
        raise EngineStartError(
            f"The engine did not answer {self.base_url}/health within {timeout_s:.0f} s "
            f"(backend.startup_timeout_s). Last lines of its log ({self.log_path}):\n"
            f"{self.log_tail(30)}"
        )

    # -- while it serves -----------------------------------------------------------
    def fault(self) -> EngineFault | None:
        """None while the container runs; otherwise why it stopped (exit, OOM kill, restart)."""
        if self.container is None:
            return EngineFault(reason="the engine container is not running")
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return EngineFault(reason="the engine container was removed")
        except docker.errors.DockerException as exc:
            return EngineFault(reason=f"the engine container cannot be inspected ({exc})")
        attrs = self.container.attrs
        return container_fault(attrs.get("State", {}), attrs.get("RestartCount", 0))

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the engine log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open(encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines))


@atexit.register
def _remove_live_containers() -> None:
    with _live_lock:
        engines = list(_live)
    for engine in engines:
        engine.close()
