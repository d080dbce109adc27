"""How runner ends on a signal.

SIGTERM (a scheduler, ``docker stop``, ``kill``) and SIGHUP (a closed terminal or SSH
session) unwind like Ctrl-C: every context manager on the way out stops its engine
and the rows already written stay. While a run tears down (its engine stopped and
removed, its records and MLflow status written), a second signal is held back until
the teardown is done, so an impatient second Ctrl-C cannot leave a container holding
the GPUs, a process holding the port, or a run marked RUNNING forever.

While an event loop measures, a signal must not be raised wherever the main thread
happens to be: inside a transport callback (a stream's ``data_received``) the loop
takes the KeyboardInterrupt for that connection's error, closes it, and goes on.
:func:`interruptible` hands the signals to the loop for the coroutine's time, and a
signal cancels the coroutine and is raised as KeyboardInterrupt once it has unwound.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def install() -> None:
    """In a command's main thread: SIGTERM and SIGHUP unwind as KeyboardInterrupt does,
    and so does SIGINT even where it was ignored: a process started in the background
    by a non-interactive shell (``cmd &`` in a script, a CI job) inherits SIGINT ignored,
    and Python then installs no KeyboardInterrupt for it, so ``kill -INT`` would do
    nothing."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


_held: list[int] | None = None  # signals held back by the shield in force, if any


@contextmanager
def shielded() -> Iterator[None]:
    """Hold back SIGINT, SIGTERM and SIGHUP for the block; one that came meanwhile is
    raised as KeyboardInterrupt when the block is done.

    The handlers are swapped rather than the signal mask: a process-directed signal may
    land on any thread (a telemetry or log thread), and Python runs its handler in the
    main thread whichever thread the kernel picked. Nested shields are one shield.
    """
    global _held
    if threading.current_thread() is not threading.main_thread() or _held is not None:
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in TERMINATING}
    _held = held
    try:
        yield
    finally:
        _held = None
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            raise KeyboardInterrupt(f"signal {held[0]} during the teardown")


async def interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` with SIGINT, SIGTERM and SIGHUP taken by the running loop: the first
    cancels it, and once it has unwound (its ``async with`` blocks closed) the signal is
    raised as KeyboardInterrupt. A signal left at its default or ignored is not taken,
    nor is any while a teardown holds signals back (:func:`shielded`)."""
    if threading.current_thread() is not threading.main_thread() or _held is not None:
        return await coro
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    caught: list[int] = []

    def take(signum: int) -> None:
        caught.append(signum)
        if len(caught) == 1 and task is not None:
            task.cancel()

    previous = {
        signum: handler
        for signum in TERMINATING
        if (handler := signal.getsignal(signum)) not in (signal.SIG_DFL, signal.SIG_IGN, None)
    }
    for signum in previous:
        loop.add_signal_handler(signum, take, signum)
    try:
        result = await coro
    except asyncio.CancelledError:
        if caught:
            raise KeyboardInterrupt(f"signal {caught[0]}") from None
        raise
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)
    if caught:  # the coroutine finished before the cancellation reached it
        raise KeyboardInterrupt(f"signal {caught[0]}")
    return result
