"""How runner ends on a signal.

SIGTERM (a scheduler, ``docker stop``, ``kill``) and SIGHUP (a closed terminal or SSH
session) unwind like Ctrl-C: every context manager on the way out stops its engine
and the rows already written stay. While a run tears down (its engine stopped and
removed, its records and MLflow status written), a second signal is held back until
the teardown is done, so an impatient second Ctrl-C cannot leave a container holding
the GPUs, a process holding the port, or a run marked RUNNING forever.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """In a command's main thread: SIGTERM and SIGHUP unwind as KeyboardInterrupt does."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)


@contextmanager
def shielded() -> Iterator[None]:
    """Hold back SIGINT, SIGTERM and SIGHUP for the block; they are delivered after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
