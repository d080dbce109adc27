"""Seed 000's ShareGPT benchmark through ``python -m runner`` against the real vLLM CPU engine."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from runner.measure.benchmark import BenchmarkRow

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration

WORDS = (
    "river garden budget lighthouse bicycle kitchen window winter concert ladder "
    "museum harbour recipe station library tomato battery village"
).split()


def write_sharegpt(path: Path, conversations: int) -> Path:
    """A small ShareGPT-format file: first human turns of 3 to 300 words."""
    rng = random.Random(7)
    data = []
    for index in range(conversations):
        question = " ".join(rng.choice(WORDS) for _ in range(rng.choice([3, 20, 80, 300])))
        data.append({
            "id": f"conv{index:03d}_0",
            "conversations": [
                {"from": "human", "value": f"Question {index}: {question}?"},
                {"from": "gpt", "value": "An answer the benchmark never sends."},
            ],
        })  # fmt: skip
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def run_benchmark(work: Path, server, cache_dir: Path, run_id: str, *overrides: str):
    return subprocess.run(
        [
            sys.executable, "-m", "runner", "workload=sharegpt",
            f"workload.dataset_path={work / 'sharegpt.json'}",
            "backend=external", f"backend.url={server.base_url}",
            f"cache_dir={cache_dir}", f"results.dir={work / run_id}",
            f"tracking.uri=sqlite:///{work}/mlflow.db", f"tracking.artifact_root={work}/artifacts",
            f"run_id={run_id}", *overrides,
        ],  # fmt: skip
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="250"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sharegpt")
    write_sharegpt(folder / "sharegpt.json", 40)
    return folder


WHOLE_RUN = (
    "workload.num_prompts=30", "workload.concurrency=4", "workload.max_seconds=60",
    "workload.max_tokens=32",
)  # fmt: skip


@pytest.fixture(scope="module")
def whole_run(work: Path, vllm_server, cache_dir: Path):
    done = run_benchmark(work, vllm_server, cache_dir, "sharegpt-whole", *WHOLE_RUN)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, work / "sharegpt-whole"


def test_the_row_holds_seed_000s_figures_and_they_add_up(whole_run) -> None:
    """seed 000: prefill and decode tok/s are aggregate tokens over the run's duration,
    with median TTFT and TPOT, 0 errors and the prompts completed."""
    _, results = whole_run
    (row,) = read_jsonl(results / "benchmark.jsonl")
    assert list(row) == BenchmarkRow.field_names()
    assert (row["prompts_sent"], row["prompts_completed"], row["errors"]) == (30, 30, 0)
    assert row["capped"] is False and row["concurrency"] == 4
    assert 0 < row["duration_s"] < 60
    assert row["decode_tok_s"] * row["duration_s"] == pytest.approx(row["output_tokens"])
    assert row["prefill_tok_s"] * row["duration_s"] == pytest.approx(row["prompt_tokens"])
    # Natural EOS under an explicit cap: no answer is longer than max_tokens.
    assert 30 <= row["output_tokens"] <= 30 * 32
    assert row["ttft_median_ms"] > 0 and row["tpot_median_ms"] >= 0
    assert row["bursty"] in (True, False)
    # The engine's own counters agree with what the client counted.
    assert row["server_prompt_tokens"] == row["prompt_tokens"]
    assert abs(row["server_output_tokens"] - row["output_tokens"]) <= 0.01 * row["output_tokens"]


def test_the_prompts_are_the_files_first_turns_each_sent_once(whole_run) -> None:
    _, results = whole_run
    (row,) = read_jsonl(results / "benchmark.jsonl")
    header, *prompts = read_jsonl(results / "workload.jsonl")
    assert header["prompts"] == len(prompts) == 30
    assert len({prompt["id"] for prompt in prompts}) == 30
    assert sum(prompt["prompt_tokens"] for prompt in prompts) == row["prompt_tokens"]
    assert len({prompt["prompt_tokens"] for prompt in prompts}) > 3  # varied lengths
    assert all(prompt["max_tokens"] == 32 for prompt in prompts)


def test_console_manifest_and_mlflow_name_the_run(whole_run, work: Path) -> None:
    """The ShareGPT results form their own family; MLflow holds the figures and the row."""
    from mlflow.tracking import MlflowClient

    done, results = whole_run
    (row,) = read_jsonl(results / "benchmark.jsonl")
    assert "30/30 prompts completed" in done.stdout
    assert f"decode {row['decode_tok_s']:.1f} tok/s" in done.stdout
    manifest = json.loads((results / "manifest.json").read_text())
    assert manifest["family"] == "dummy-weights-bf16-sharegpt-natural-eos"
    assert manifest["config_id"] == row["config_id"]
    assert manifest["summary"]["benchmark"]["prompts_completed"] == 30
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlflow.db")
    experiment = client.get_experiment_by_name("runner")
    (parent,) = client.search_runs(
        [experiment.experiment_id], filter_string="tags.run_id = 'sharegpt-whole'"
    )
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["family"] == "dummy-weights-bf16-sharegpt-natural-eos"
    assert parent.data.metrics["decode_tok_s"] == pytest.approx(row["decode_tok_s"])
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"benchmark.jsonl", "manifest.json", "workload.jsonl"} <= artifacts


def test_a_rerun_of_a_finished_benchmark_reports_its_row_and_measures_nothing(
    whole_run, work: Path, vllm_server, cache_dir: Path
) -> None:
    """A benchmark is one measurement: the same command and run_id again prints the row it
    wrote; the same run_id with another engine setup is refused before anything starts."""
    done, results = whole_run
    again = run_benchmark(work, vllm_server, cache_dir, "sharegpt-whole", *WHOLE_RUN)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "run sharegpt-whole was already measured" in again.stdout
    assert "30/30 prompts completed" in again.stdout
    assert len(read_jsonl(results / "benchmark.jsonl")) == 1
    other = run_benchmark(
        work, vllm_server, cache_dir, "sharegpt-whole", *WHOLE_RUN, "engine.max_num_seqs=8"
    )
    assert other.returncode == 2, other.stdout[-2000:]
    assert "already holds results of config_id" in other.stderr
    assert len(read_jsonl(results / "benchmark.jsonl")) == 1


def test_the_time_cap_stops_dispatch_and_lets_requests_in_flight_finish(
    work: Path, vllm_server, cache_dir: Path
) -> None:
    """seed 000: "Hit the 15-min time cap at 361/1000 prompts, 0 errors (938 s)": no prompt
    is sent after the cap, the ones in flight complete and count."""
    done = run_benchmark(
        work, vllm_server, cache_dir, "sharegpt-capped",
        "workload.num_prompts=40", "workload.concurrency=2", "workload.max_seconds=1.5",
        "workload.max_tokens=256", "workload.ignore_eos=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = read_jsonl(work / "sharegpt-capped" / "benchmark.jsonl")
    assert row["capped"] is True and row["num_prompts"] == 40
    assert 2 <= row["prompts_sent"] < 40
    assert row["prompts_completed"] == row["prompts_sent"] and row["errors"] == 0
    assert row["duration_s"] > 1.5
    assert row["output_tokens"] == 256 * row["prompts_sent"]  # forced length
    assert "time cap 1.5 s reached" in done.stdout
    assert json.loads((work / "sharegpt-capped" / "manifest.json").read_text())["family"] == (
        "dummy-weights-bf16-sharegpt"
    )
