"""A model generated from a Hugging Face config.json, served by the real vLLM CPU engine.

``model=dummy model.hf_config=FILE``: runner writes the folder (the architecture, a
tokenizer over its whole vocabulary), vLLM serves it with random weights, and the
smoke chat check sees text. On the H200 a 128,256-ID model behind a 992-token
tokenizer returned none (issue 11); here the vocabulary is 6,000, six times what the
tokenizer's training reaches, so the synthetic part of the vocabulary is sampled too.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from runner.prepare.generated import ARCHITECTURE
from tests.integration.conftest import free_port
from tests.integration.runs import FAST_START, run, runner_command

VOCAB_SIZE = 6000

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def generated_run(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[subprocess.CompletedProcess[str], Path, str]:
    work = tmp_path_factory.mktemp("generated")
    hf_config = work / "config.json"
    hf_config.write_text(
        json.dumps(dict(ARCHITECTURE, vocab_size=VOCAB_SIZE, max_position_embeddings=8192))
    )
    overrides = [
        "model=dummy", f"model.hf_config={hf_config}", "model.max_context=4096",
        "search.users=[2]", "search.window_s=4", "smoke.memory_repeats=2",
        f"engine.port={free_port(8460)}", FAST_START,
    ]  # fmt: skip
    done = run(runner_command(work, cache_dir, "generated-dummy", *overrides))
    return done, work, f"sqlite:///{work}/mlflow.db"


def test_the_generated_model_passes_the_smoke_chat_check(generated_run) -> None:
    done, work, _ = generated_run
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((work / "results" / "manifest.json").read_text())
    checks = {check["name"]: check for check in manifest["smoke"]["checks"]}
    assert checks["chat"]["passed"], checks["chat"]
    assert checks["chat"]["figures"]["chars"] > 0
    assert manifest["model"]["architecture"]["vocab_size"] == VOCAB_SIZE
    served = Path(manifest["launch"]["argv"][manifest["launch"]["argv"].index("--model") + 1])
    assert json.loads((served / "config.json").read_text())["vocab_size"] == VOCAB_SIZE
    assert "--load-format" in manifest["launch"]["argv"]


def test_its_results_say_the_weights_were_random(generated_run) -> None:
    """Issue 11: a dummy-weights family and tag, and the caveats in the report."""
    from mlflow.tracking import MlflowClient

    done, work, uri = generated_run
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((work / "results" / "manifest.json").read_text())
    assert manifest["family"] == "dummy-weights-bf16"
    report = (work / "results" / "report.md").read_text()
    assert "## Caveats" in report and "Random weights" in report
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("runner")
    parents = [
        run
        for run in client.search_runs([experiment.experiment_id])
        if "mlflow.parentRunId" not in run.data.tags
    ]
    assert [run.data.tags["weights"] for run in parents] == ["dummy-weights"]
    assert [run.data.tags["family"] for run in parents] == ["dummy-weights-bf16"]
