"""A second signal during a teardown waits for it (issue 8: a second Ctrl-C cannot skip
the engine's removal), from any thread it lands on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_sigterm_and_sighup_unwind_as_ctrl_c_does(signum: int) -> None:
    """A scheduler's SIGTERM and a closed terminal's SIGHUP take the same path as Ctrl-C,
    so the teardown the integration tests check for one signal holds for all three;
    SIGINT does so even when the shell that started runner in the background had it
    ignored."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `runner &` from a script inherits it
    try:
        shutdown.install()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
            time.sleep(1)  # the handler runs at the next bytecode boundary
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


STREAMING = """
import asyncio, os, signal, sys, time
from runner import shutdown
from runner.measure.transport import run

shutdown.install()
steps = []

class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        self.transport.write(data)

class Reader(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
    def data_received(self, data):
        # The main thread spends its time here, as in a stream's parser: a signal
        # raised here was taken by the loop for this connection's error.
        spin = time.perf_counter() + 0.002
        while time.perf_counter() < spin:
            pass
        self.transport.write(data)
    def connection_lost(self, exc):
        steps.append(f"lost {exc!r}")

async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(Reader, "127.0.0.1", port)
    loop.call_later(0.3, os.kill, os.getpid(), int(sys.argv[1]))
    try:
        transport.write(b"x" * 64)
        await asyncio.sleep(5)
        steps.append("finished")
    finally:
        steps.append("unwound")
        transport.close()
        server.close()

try:
    run(main())
    print("returned", steps)
except KeyboardInterrupt as exc:
    print("interrupted", exc, steps, signal.getsignal(signal.SIGTERM) is shutdown._interrupt)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_while_the_loop_measures_cancels_it_and_is_raised_after(signum: int) -> None:
    """A SIGTERM raised inside a stream's read callback was once taken by uvloop for that
    connection's error: the window went on with one failed request and the run ended
    with exit 0 (seen in CI, tests/integration/test_faults.py). While a loop measures,
    the loop now takes the signal: nothing is raised inside a callback, the measuring
    coroutine unwinds, and KeyboardInterrupt naming the signal follows, with runner's
    handlers back in place."""
    done = subprocess.run(
        [sys.executable, "-c", STREAMING, str(int(signum))], capture_output=True, text=True,
        timeout=60, check=False, start_new_session=True,
    )  # fmt: skip
    assert done.stdout.startswith(f"interrupted signal {int(signum)}"), done.stdout + done.stderr
    assert "'unwound'" in done.stdout and "'finished'" not in done.stdout
    assert "lost KeyboardInterrupt" not in done.stdout, done.stdout
    assert done.stdout.rstrip().endswith("True")
    assert "Traceback" not in done.stderr, done.stderr
