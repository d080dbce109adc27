"""``python -m runner slo=tiers`` on the real vLLM CPU engine: one search answers every
tier, and capacity.json, the report, the console and MLflow say so; without tiers the
default floor's answer is the only one. A CPU run has no cost figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.runs import external, run, runner_command

pytestmark = pytest.mark.integration

TIERS = ["interactive", "standard", "batch"]


@pytest.fixture(scope="module")
def tiered(vllm_server, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("tiered")
    command = runner_command(
        work, cache_dir, "tiered", *external(vllm_server.base_url), "slo=tiers",
        "search.users=[2,4]",
    )  # fmt: skip
    done = run(command)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, work, command


def test_capacity_json_holds_the_default_floor_and_every_tier(tiered) -> None:
    _, work, _ = tiered
    record = json.loads((work / "results" / "capacity.json").read_text())
    rows = [
        json.loads(line) for line in (work / "results" / "results.jsonl").read_text().splitlines()
    ]
    assert record["schema"] == 1 and record["run_id"] == "tiered"
    assert record["hw"] == "cpu" and record["gpus"] is None and record["usd_per_hour"] is None
    assert [entry["name"] for entry in record["tiers"]] == ["default", *TIERS]
    interactive = record["tiers"][1]
    assert interactive["limits"] == {"min_user_tok_s": 30.0, "ttft_p99_ms": 1000.0}
    measured = {row["users"]: row for row in rows}
    for entry in record["tiers"]:
        assert entry["tok_s_per_gpu"] is None and entry["usd_per_mtok"] is None  # no GPU
        if entry["users"] is None:
            assert entry["reason"]
            continue
        row = measured[entry["users"]]
        assert entry["aggregate_tok_s"] == row["aggregate_output_tok_s"]
        assert entry["min_user_tok_s"] == row["min_user_tok_s"]
        for metric, limit in entry["limits"].items():
            value = row[metric]
            assert value >= limit if metric == "min_user_tok_s" else value <= limit
    # The batch tier (5 tok/s) admits at least as many users as the standard one.
    users = {entry["name"]: entry["users"] or 0 for entry in record["tiers"]}
    assert users["batch"] >= users["standard"] >= users["interactive"]


def test_report_console_and_mlflow_show_each_tier(tiered) -> None:
    done, work, command = tiered
    report = (work / "results" / "report.md").read_text()
    table = report.split("## SLO tiers")[1].split("\n## ")[0]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()
            if line.startswith("| ") and "---" not in line][1:] == TIERS  # fmt: skip
    assert "- **Flags:** " in report and "- **Output throughput per GPU" not in report
    best = next(
        i
        for i, line in enumerate(done.stdout.splitlines())
        if "best N=" in line or "No valid" in line
    )
    tier_lines = [line for line in done.stdout.splitlines() if line.startswith("tier ")]
    assert [line.split(":")[0].split(" (")[0] for line in tier_lines] == [
        f"tier {t}" for t in TIERS
    ]
    assert done.stdout.splitlines().index(tier_lines[0]) > best

    record = json.loads((work / "results" / "capacity.json").read_text())
    uri = next(arg for arg in command if arg.startswith("tracking.uri=")).split("=", 1)[1]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner")
    (parent,) = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`runner.kind` = 'search'"
    )
    metrics, tags = parent.data.metrics, parent.data.tags
    for entry in record["tiers"][1:]:
        assert tags[f"tier.{entry['name']}.limits"]
        if entry["users"] is not None:
            assert metrics[f"tier.{entry['name']}.users"] == entry["users"]
            assert metrics[f"tier.{entry['name']}.aggregate_tok_s"] == entry["aggregate_tok_s"]
            assert tags[f"tier.{entry['name']}.binding"] == entry["binding"]
    assert not any("usd" in key or "per_gpu" in key for key in metrics)  # a CPU run
    assert "capacity.json" in {item.path for item in client.list_artifacts(parent.info.run_id)}


def test_a_rerun_of_the_answered_search_writes_the_same_answers(tiered) -> None:
    """The same command again measures nothing and writes capacity.json anew, the same."""
    _, work, command = tiered
    path = work / "results" / "capacity.json"
    before = json.loads(path.read_text())
    path.unlink()
    again = run(command)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "already has its answer" in again.stdout
    assert json.loads(path.read_text()) == before


def test_without_tiers_the_default_floor_is_the_only_answer(
    vllm_server, cache_dir: Path, tmp_path: Path
) -> None:
    done = run(runner_command(tmp_path, cache_dir, "untiered", *external(vllm_server.base_url)))
    assert done.returncode == 0, done.stdout[-3000:]
    record = json.loads((tmp_path / "results" / "capacity.json").read_text())
    assert [entry["name"] for entry in record["tiers"]] == ["default"]
    assert not any(line.startswith("tier ") for line in done.stdout.splitlines())
    assert "## SLO tiers" not in (tmp_path / "results" / "report.md").read_text()
