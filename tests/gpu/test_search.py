"""The whole pipeline on a real GPU with the process backend: a Llama-3.1-8B-shaped
model with random weights (no checkpoint to download), BF16 and FP8 weights with an
FP8 KV cache, seed 004's context mix (1k..30k, 512 forced output tokens) with windows
short enough for a rented hour (issue 11). Skipped where NVML or vLLM is absent.

Each search runs as a user runs it, ``python -m runner +hw=h200 backend=process ...``,
into ``$RUNNER_GPU_RESULTS/<precision>`` when that is set (so the results can be kept),
and its record is checked: the NVML preflight, start-up facts parsed from the GPU
log, the precision proof, power and utilisation in every window, a decision, and
vLLM's own benchmark client at the answer on the same engine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner import nvml

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not nvml.nvml_available(), reason="no NVIDIA driver (NVML) on this machine"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="no vLLM next to runner"),
]
REPO = Path(__file__).resolve().parents[2]
PRECISIONS = {
    "bf16": ["model=llama31_8b_dummy", "kv=auto"],
    "fp8": ["model=llama31_8b_dummy_fp8", "kv=fp8"],
}
# Seed 004's protocol with windows that fit a rented hour for both precisions: 8 s
# screening windows for the doubling, 16 s full windows, 8 s of warm-up, one window's
# evidence at the answer; vLLM's client at the answer with one prompt per user.
SHORT_SEARCH = [
    "search.screening_window_s=8", "search.window_s=16", "search.warmup_s=8",
    "search.confirm_repeats=1", "reference.enabled=true", "reference.prompts_per_user=1",
]  # fmt: skip


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_a_capacity_search_on_this_gpu(precision: str, tmp_path: Path) -> None:
    results = Path(os.environ.get("RUNNER_GPU_RESULTS", tmp_path)) / precision
    command = [
        sys.executable, "-m", "runner", "+hw=h200", "backend=process", "image=local_vllm",
        *PRECISIONS[precision], *SHORT_SEARCH, f"hydra.run.dir={results}",
        f"tracking.uri=sqlite:///{results}/mlflow.db", f"tracking.artifact_root={results}/artifacts",
        f"run_id=h200-{precision}-search",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    with (results.parent / f"{precision}.log").open("w") as log:
        done = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=1800, check=False)  # fmt: skip
    output = (results.parent / f"{precision}.log").read_text()
    assert done.returncode == 0, output[-4000:]
    manifest = json.loads((results / "manifest.json").read_text())
    assert manifest["preflight"]["gpus"][0]["name"] == "NVIDIA H200"
    startup = manifest["startup"]
    for fact in ("kv_cache_size_tokens", "weights_gib", "engine_init_s", "graph_capture_s"):
        assert startup.get(fact), (fact, startup)
    if precision == "fp8":
        assert startup["engine_cache_dtype"] == "fp8" and startup["engine_quantization"] == "fp8"
    rows = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
    assert rows and all(row["gpu_util_avg_pct"] is not None for row in rows)
    assert all(row["power_avg_w"] and row["power_avg_w"] > 100 for row in rows), rows
    summary = manifest["summary"]
    assert summary["best_users"], summary
    reference = manifest["reference"]
    assert reference["users"] == summary["best_users"] and reference["output_tok_s"] > 0
