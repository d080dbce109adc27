"""runner's load loop gets a larger CPU weight while it measures, and gives it back
(issue 9: an engine in another session held a 5%-CPU client off the cores for 0.7 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.measure.priority import AUTOGROUP, CLIENT_NICE, autogroup_nice

REPO = Path(__file__).resolve().parents[2]
CODE = """
from runner.measure.priority import AUTOGROUP, autogroup_nice, raise_client_priority, restore_client_priority
before = autogroup_nice(AUTOGROUP.read_text())
priority = raise_client_priority()
during = autogroup_nice(AUTOGROUP.read_text())
restore_client_priority(priority)
print(priority.how, before, during, autogroup_nice(AUTOGROUP.read_text()))
"""
DEFAULT_GROUP = """
import os, sys
from pathlib import Path
from runner.measure.priority import raise_client_priority, restore_client_priority
empty = Path(sys.argv[1])
before = os.getpriority(os.PRIO_PROCESS, 0)
priority = raise_client_priority(autogroup=empty)
during = os.getpriority(os.PRIO_PROCESS, 0)
restore_client_priority(priority)
print(priority.how, before, during, os.getpriority(os.PRIO_PROCESS, 0), repr(empty.read_text()))
print(priority.reason)
"""


def test_the_autogroup_file_is_read_for_its_nice_value() -> None:
    assert autogroup_nice("/autogroup-114 nice 0\n") == 0
    assert autogroup_nice("/autogroup-7 nice -10\n") == -10
    # A task in the kernel's default group reads an empty file: no session group.
    assert autogroup_nice("") is None


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="this kernel has no autogroups")
def test_the_session_group_weight_is_raised_and_given_back() -> None:
    # A session of its own, so the test's own terminal session is never touched.
    done = subprocess.run(
        [sys.executable, "-c", CODE], cwd=REPO, capture_output=True, text=True, check=True,
        start_new_session=True,
    )  # fmt: skip
    how, before, during, after = done.stdout.split()
    if how == "autogroup":
        assert (before, during, after) == ("0", str(CLIENT_NICE), "0")
    else:  # no privilege here: nothing changed, and the run says why
        assert how in ("nice", "none") and before == during == after


def test_in_the_default_group_the_process_nice_value_is_lowered_and_restored(
    tmp_path: Path,
) -> None:
    """A CI job or service whose session never left the kernel's default group reads an
    empty autogroup file; runner falls back to its own nice value instead of failing."""
    empty = tmp_path / "autogroup"
    empty.write_text("")
    done = subprocess.run(
        [sys.executable, "-c", DEFAULT_GROUP, str(empty)], cwd=REPO, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    first, reason = done.stdout.splitlines()
    how, before, during, after, left = first.split()
    assert "default group" in reason
    assert left == "''"  # the file stands for the kernel's: never written
    assert after == before
    if how == "nice":
        assert int(during) == min(int(before), CLIENT_NICE)
    else:  # no privilege to lower it: nothing changed, and the reason says so
        assert how == "none" and during == before and "nor can" in reason
