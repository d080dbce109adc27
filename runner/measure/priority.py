"""Keeping runner's load loop on time on a shared host.

Linux schedules CPU time by session group (autogroup): every session gets an equal
share, whatever its number of threads. A vLLM CPU engine started in another terminal
is another session, and when it keeps the cores busy, runner's event loop waits its
turn behind the engine's whole session: a client at 5% CPU woke up 0.7 s late, read
its streams in lumps and dispatched late, so the engine saw 3.7 of 8 users.

:func:`raise_client_priority` gives runner's session group a larger weight, so the
scheduler runs the loop as soon as it is woken: the autogroup nice value (or, where
autogroups are off, the process's own nice value) is lowered. Both need privilege
(CAP_SYS_NICE, e.g. root); without it nothing changes and the reason is returned, and
the offered-load gate still refuses any window the client could not keep. It matters
where the engine runs in another session (``backend=external`` started elsewhere, a
Docker container under dockerd's); a local engine (``backend=process``) shares
runner's session and its weight, so nothing changes between the two. The previous
value is restored when the run ends: the group is the terminal's session too.

A session that never left the kernel's default group (a service or CI job whose
ancestors never called ``setsid``) shows an empty ``/proc/self/autogroup``: its threads
compete one by one in the root group, so the process's own nice value is the lever.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("runner")

AUTOGROUP = Path("/proc/self/autogroup")
CLIENT_NICE = -10


@dataclass(frozen=True)
class ClientPriority:
    """What runner did to its own scheduling: ``how`` is "autogroup", "nice" or "none";
    ``previous`` the value to restore."""

    how: str
    nice: int | None
    reason: str
    previous: int | None = None


def autogroup_nice(text: str) -> int | None:
    """The nice value in ``/proc/<pid>/autogroup`` ("/autogroup-114 nice 0"), or None
    where the file is empty: the task is in the default group, not a session group."""
    found = re.search(r"\bnice\s+(-?\d+)", text)
    return int(found.group(1)) if found else None


def raise_client_priority(nice: int = CLIENT_NICE, autogroup: Path = AUTOGROUP) -> ClientPriority:
    """Lower runner's autogroup (or process) nice value to ``nice`` where permitted."""
    if not autogroup.exists():
        reason = "this kernel has no autogroups"
    elif (previous := autogroup_nice(autogroup.read_text())) is None:
        reason = "runner's session is in the kernel's default group, not a session group"
    else:
        try:
            autogroup.write_text(str(nice))
            log.info("runner's session group now runs at nice %d", nice)
            return ClientPriority("autogroup", nice, "session group weight raised", previous)
        except OSError as exc:
            reason = f"the session group's nice value cannot be lowered ({exc.strerror})"
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current > nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        return ClientPriority(
            "nice", nice, f"{reason}; the process's nice value was lowered", current
        )
    except OSError as exc:
        log.info("runner keeps its scheduling priority: %s", exc)
        return ClientPriority(
            "none", None, f"{reason}; nor can the process's nice value be lowered ({exc.strerror})"
        )


def restore_client_priority(priority: ClientPriority, autogroup: Path = AUTOGROUP) -> None:
    """Undo :func:`raise_client_priority` (the autogroup outlives runner otherwise)."""
    try:
        if priority.how == "autogroup" and priority.previous is not None:
            autogroup.write_text(str(priority.previous))
        elif priority.how == "nice" and priority.previous is not None:
            os.setpriority(os.PRIO_PROCESS, 0, priority.previous)
    except OSError as exc:  # raising a nice value back is allowed; this is unexpected
        log.warning("runner could not restore its scheduling priority: %s", exc)
