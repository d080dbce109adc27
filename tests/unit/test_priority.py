"""runner's load loop gets a larger CPU weight while it measures, and gives it back
(issue 9: an engine in another session held a 5%-CPU client off the cores for 0.7 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.measure.priority import AUTOGROUP

REPO = Path(__file__).resolve().parents[2]
CODE = """
from runner.measure.priority import AUTOGROUP, raise_client_priority, restore_client_priority
before = AUTOGROUP.read_text().split()[-1]
priority = raise_client_priority()
during = AUTOGROUP.read_text().split()[-1]
restore_client_priority(priority)
print(priority.how, before, during, AUTOGROUP.read_text().split()[-1])
"""


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="this kernel has no autogroups")
def test_the_session_group_weight_is_raised_and_given_back() -> None:
    # A session of its own, so the test's own terminal session is never touched.
    done = subprocess.run(
        [sys.executable, "-c", CODE], cwd=REPO, capture_output=True, text=True, check=True,
        start_new_session=True,
    )  # fmt: skip
    how, before, during, after = done.stdout.split()
    if how == "autogroup":
        assert (before, during, after) == ("0", "-10", "0")
    else:  # no privilege here: nothing changed, and the run says why
        assert how in ("nice", "none") and before == during == after
