"""``python -m runner`` as a user runs it: dry runs and refusals start nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def run_cli(*overrides: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "runner", *overrides],
        cwd=cwd or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def engine_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "vllm.entrypoints.openai.api_server" in line and "--port 8011" in line]


def test_seed_004_dry_run_prints_the_pinned_launch(tmp_path: Path) -> None:
    """Seed 004 §2/§5: pinned nightly digest, ModelOpt FP4, NVFP4 KV, 30,000 context."""
    done = run_cli("+hw=rtx5090", "kv=nvfp4", "dry_run=true", f"results.dir={tmp_path}")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "vllm/vllm-openai@sha256:a671d5fcda70fe9ac6f245f9780821de459fb4ee22c018fd07a0f10a55279bf9" in out
    for flag in ("--quantization modelopt_fp4", "--kv-cache-dtype nvfp4", "--max-model-len 30000",
                 "--gpu-memory-utilization 0.92", "--max-num-seqs 256", "--no-enable-prefix-caching"):
        assert flag in " ".join(out.split()), flag
    assert "config_id=" in out
    assert not any(tmp_path.iterdir()), "a dry run writes no results"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["+hw=h200", "kv=nvfp4"], ["nvfp4", "h200"]),
        (["engine.max_model_len=8192", "workload=context_mix"], ["max_model_len", "30000"]),
        (["+engine.max_num_seq=4"], ["max_num_seq", "did you mean engine.max_num_seqs?"]),
        (["engine.max_num_seq=4"], ["max_num_seq", "did you mean engine.max_num_seqs?"]),
        (["kv=nvfp5"], ["kv/nvfp5", "nvfp4"]),
    ],
    ids=["nvfp4-kv-on-hopper", "context-too-short", "unknown-key", "unknown-key-no-plus",
         "unknown-option"],
)
def test_bad_config_fails_with_one_paragraph_and_starts_nothing(
    overrides: list[str], words: list[str], tmp_path: Path
) -> None:
    done = run_cli(*overrides, f"results.dir={tmp_path}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    message = done.stderr.strip()
    assert message.startswith("runner:"), message
    assert "Traceback" not in message
    paragraphs = [p for p in message.split("\n\n") if p.strip()]
    assert len(paragraphs) == 1, message
    for word in words:
        assert word.lower() in message.lower(), (word, message)
    assert not any(tmp_path.iterdir())
    assert not engine_processes()


def test_runs_from_any_directory(tmp_path: Path) -> None:
    """The packaged config is found when runner is started outside the repo."""
    env_path = os.environ.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "runner", "dry_run=true", f"results.dir={tmp_path}"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=f"{REPO}:{env_path}", COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--load-format dummy" in done.stdout
