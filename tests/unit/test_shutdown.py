"""A second signal during a teardown waits for it (issue 8: a second Ctrl-C cannot skip
the engine's removal), from any thread it lands on."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from runner import shutdown


def test_a_signal_during_the_shield_is_held_until_the_block_ends() -> None:
    done = []
    with pytest.raises(KeyboardInterrupt), shutdown.shielded():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler has run: the block goes on regardless
        done.append("teardown")
    assert done == ["teardown"]


def test_nested_shields_hold_until_the_outer_one_ends() -> None:
    steps = []
    with pytest.raises(KeyboardInterrupt), shutdown.shielded():
        with shutdown.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            steps.append("inner")
        steps.append("outer")
    assert steps == ["inner", "outer"]


def test_a_signal_that_lands_on_another_thread_is_held_too() -> None:
    """The kernel may hand a process-directed signal to any thread that does not block
    it (a telemetry or log thread); Python still runs the handler in the main thread."""
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    steps = []
    try:
        with pytest.raises(KeyboardInterrupt), shutdown.shielded():
            # Blocked here, so only the other thread can take it.
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
                steps.append("teardown")
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    finally:
        stop.set()
        other.join()
    assert steps == ["teardown"]


def test_without_a_signal_the_shield_changes_nothing() -> None:
    previous = signal.getsignal(signal.SIGINT)
    with shutdown.shielded():
        pass
    assert signal.getsignal(signal.SIGINT) is previous
