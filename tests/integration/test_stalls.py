"""The counters that name a late loop's cause, read from this machine's kernel with a
cause the test controls: a thread that shares its CPU with a busy process waits on the
run queue; a mapped file dropped from the page cache is read back by major faults."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner.measure.stalls import StallCounters, stalls_between

pytestmark = pytest.mark.integration

linux_only = pytest.mark.skipif(
    not Path("/proc/thread-self/schedstat").exists(), reason="no schedstat"
)


@linux_only
def test_a_thread_that_shares_its_cpu_with_a_busy_process_waits_on_the_run_queue() -> None:
    """Both pinned to one CPU and both runnable for 2 s: the kernel shares that CPU, so
    the measuring thread waits for it a large part of the time, whatever else the
    machine runs (more load there only lengthens the wait)."""
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    measured: dict[str, float] = {}

    def spin() -> None:
        os.sched_setaffinity(0, {cpu})  # this thread only
        time.sleep(0.3)  # the busy process is pinned and running by now
        start, began = StallCounters.now(), time.monotonic()
        while time.monotonic() - began < 2.0:
            pass
        measured["queue_s"] = stalls_between(start, StallCounters.now()).run_queue_s
        measured["wall_s"] = time.monotonic() - began

    try:
        thread = threading.Thread(target=spin)
        thread.start()
        thread.join(timeout=30)
    finally:
        hog.kill()
        hog.wait()
    assert measured["queue_s"] is not None
    assert measured["queue_s"] > 0.2 * measured["wall_s"], measured


def test_pages_dropped_from_the_page_cache_come_back_as_major_faults(tmp_path: Path) -> None:
    """A written, synced file is dropped from the page cache (POSIX_FADV_DONTNEED), then
    mapped and read: each read of a page not in memory is a major fault."""
    path = tmp_path / "cold"
    path.write_bytes(os.urandom(8 << 20))
    with path.open("rb") as handle:
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        start = StallCounters.now()
        with mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ) as pages:
            sum(pages[offset] for offset in range(0, len(pages), mmap.PAGESIZE))
        stalls = stalls_between(start, StallCounters.now())
    assert stalls.major_faults is not None and stalls.major_faults > 0
