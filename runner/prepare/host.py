"""Facts about this machine that decide whether an engine can start here.

Read from /proc and /sys (Linux); nothing here judges them: validation compares a
KV cache size with :func:`machine_memory`, and ``python -m runner.doctor`` shows
every figure next to what the run needs.
"""

from __future__ import annotations

import logging
import resource
import shutil
from dataclasses import dataclass
from pathlib import Path

from runner.prepare.validate import MachineMemory

log = logging.getLogger("runner")

GIB = 2**30
# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1; anything this large is no limit.
_NO_LIMIT = 2**60


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node's memory now; on some VMs node 0 grows as memory is used."""

    index: int
    total_gib: float
    free_gib: float


def _meminfo(path: Path, key: str) -> float | None:
    """A ``kB`` figure of a meminfo file, in GiB."""
    try:
        for line in path.read_text().splitlines():
            words = line.replace(":", " ").split()
            if key in words:
                return int(words[words.index(key) + 1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_total_gib() -> float | None:
    """Physical memory; None where the kernel does not show it (not Linux)."""
    return _meminfo(Path("/proc/meminfo"), "MemTotal")


def memory_available_gib() -> float | None:
    return _meminfo(Path("/proc/meminfo"), "MemAvailable")


def cgroup_memory_limit_gib(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The lowest memory limit on this process's cgroup and its parents (v1 or v2), or None."""
    limits = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            base, file = root, "memory.max"
        elif "memory" in controllers.split(","):
            base, file = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = base / path.lstrip("/")
        for candidate in [folder, *folder.parents]:
            limits.append(_read_limit(candidate / file))
            if candidate == base:
                break
    known = [limit for limit in limits if limit is not None]
    return min(known) / GIB if known else None


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= _NO_LIMIT:
        return None  # "max" (v2) or the v1 sentinel: no limit here
    return int(text)


def machine_memory() -> MachineMemory | None:
    """What a local engine can ever get here; None where it cannot be read."""
    total = memory_total_gib()
    if total is None:
        return None
    return MachineMemory(total_gib=total, cgroup_limit_gib=cgroup_memory_limit_gib())


def numa_nodes(root: Path = Path("/sys/devices/system/node")) -> list[NumaNode]:
    """Each NUMA node's total and free memory now; empty where the kernel shows none."""
    nodes = []
    for folder in sorted(root.glob("node[0-9]*"), key=lambda path: int(path.name[4:])):
        total = _meminfo(folder / "meminfo", "MemTotal")
        free = _meminfo(folder / "meminfo", "MemFree")
        if total is not None and free is not None:
            nodes.append(NumaNode(int(folder.name[4:]), total, free))
    return nodes


def open_files_limit() -> tuple[int, int]:
    """``ulimit -n``: the soft and hard limits on open file descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def free_disk_gib(path: str | Path) -> tuple[Path, float]:
    """Free space on the file system that holds ``path`` (or the nearest folder above it
    that exists, since results and caches are created on first use)."""
    folder = Path(path).expanduser().resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder, shutil.disk_usage(folder).free / GIB
