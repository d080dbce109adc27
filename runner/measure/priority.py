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
"""

from __future__ import annotations

import logging
import os
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


def raise_client_priority(nice: int = CLIENT_NICE) -> ClientPriority:
    """Lower runner's autogroup (or process) nice value to ``nice`` where permitted."""
    if AUTOGROUP.exists():
        try:
            previous = int(AUTOGROUP.read_text().split()[-1])
            AUTOGROUP.write_text(str(nice))
            log.info("runner's session group now runs at nice %d", nice)
            return ClientPriority("autogroup", nice, "session group weight raised", previous)
        except OSError as exc:
            reason = f"the session group's nice value cannot be lowered ({exc.strerror})"
    else:
        reason = "this kernel has no autogroups"
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        if current > nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        return ClientPriority(
            "nice", nice, f"{reason}; the process's nice value was lowered", current
        )
    except OSError as exc:
        log.info("runner keeps its scheduling priority: %s", exc)
        return ClientPriority("none", None, f"{reason}, nor the process's ({exc.strerror})")


def restore_client_priority(priority: ClientPriority) -> None:
    """Undo :func:`raise_client_priority` (the autogroup outlives runner otherwise)."""
    try:
        if priority.how == "autogroup" and priority.previous is not None:
            AUTOGROUP.write_text(str(priority.previous))
        elif priority.how == "nice" and priority.previous is not None:
            os.setpriority(os.PRIO_PROCESS, 0, priority.previous)
    except OSError as exc:  # raising a nice value back is allowed; this is unexpected
        log.warning("runner could not restore its scheduling priority: %s", exc)
