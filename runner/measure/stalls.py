"""Where a late event loop's time went.

A client at 1% CPU whose 10 ms sleeps return 130 ms late was not busy: something held
it off. Three counters the kernel keeps say which, read at a window's start and end:

* ``/proc/thread-self/schedstat``: nanoseconds the loop's thread spent runnable but
  waiting for a CPU (other work on the cores);
* the process's major page faults (``getrusage``): pages of its code or memory that
  had been reclaimed and were read back from disk before the loop could go on;
* the ``steal`` column of ``/proc/stat``: time the hypervisor ran something else on
  this virtual machine's CPUs, when the guest wanted them (a busy host).

The window stays invalid whatever the cause; the reason names it, so a user knows
whether to quiet the machine, give it memory, or move to a host that is not shared.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from runner.measure.records import Stalls

SCHEDSTAT = Path("/proc/thread-self/schedstat")
PROC_STAT = Path("/proc/stat")
# /proc/stat counts in USER_HZ ticks.
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def run_queue_ns(text: str) -> int | None:
    """The second field of a schedstat line: nanoseconds spent waiting on a run queue."""
    fields = text.split()
    return int(fields[1]) if len(fields) >= 2 and fields[1].isdigit() else None


def steal_ticks(text: str) -> int | None:
    """The ``steal`` column (the 8th figure) of the ``cpu`` line of ``/proc/stat``."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            return int(fields[8]) if len(fields) > 8 and fields[8].isdigit() else None
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@dataclass(frozen=True)
class StallCounters:
    """The three counters at one instant; read on the loop's own thread."""

    run_queue_ns: int | None
    major_faults: int
    steal_ticks: int | None

    @classmethod
    def now(cls) -> StallCounters:
        return cls(
            run_queue_ns(_read(SCHEDSTAT)),
            resource.getrusage(resource.RUSAGE_SELF).ru_majflt,
            steal_ticks(_read(PROC_STAT)),
        )


def stalls_between(start: StallCounters, end: StallCounters) -> Stalls:
    """What accrued between two readings; a counter missing at either end is ``None``."""
    queue = (
        (end.run_queue_ns - start.run_queue_ns) / 1e9
        if start.run_queue_ns is not None and end.run_queue_ns is not None
        else None
    )
    steal = (
        (end.steal_ticks - start.steal_ticks) / TICKS_PER_S
        if start.steal_ticks is not None and end.steal_ticks is not None
        else None
    )
    return Stalls(queue, end.major_faults - start.major_faults, steal)


def describe(stalls: Stalls | None) -> str:
    """The counters as a phrase for a reason: "its loop waited 0.12 s for a CPU, 340
    major page fault(s), the hypervisor took 2.10 s of this machine's CPUs"; empty where
    nothing was read."""
    if stalls is None:
        return ""
    parts = []
    if stalls.run_queue_s is not None:
        parts.append(f"its loop waited {stalls.run_queue_s:.2f} s for a CPU")
    if stalls.major_faults is not None:
        parts.append(f"{stalls.major_faults} major page fault(s)")
    if stalls.steal_s is not None:
        parts.append(f"the hypervisor took {stalls.steal_s:.2f} s of this machine's CPUs")
    return ", ".join(parts)
