"""A reference run in MLflow, beside the search it checks."""

from __future__ import annotations

from dataclasses import asdict

from runner.config import Tracking
from runner.measure.reference import ReferenceRun
from runner.output.mlflowstore import call, connect, experiment_id
from runner.output.tracking import KIND_TAG, PARENT_TAG

REFERENCE_KIND = "reference"


def log_reference(tracking: Tracking, reference: ReferenceRun, run_id: str | None) -> str:
    """One MLflow run (``runner.kind=reference``) with the benchmark's figures; a child of
    the search ``run_id`` when that search is in the store. Returns its MLflow id."""
    client = call(tracking, "open the MLflow store", lambda: connect(tracking))
    experiment = call(tracking, "open the experiment", lambda: experiment_id(client, tracking))
    tags = {KIND_TAG: REFERENCE_KIND, "users": str(reference.users), "tool": "vllm bench serve"}
    if run_id is not None:
        tags["run_id"] = run_id
        parents = call(
            tracking,
            "find the search this reference belongs to",
            lambda: client.search_runs(
                [experiment],
                f"tags.`{KIND_TAG}` = 'search' and tags.run_id = '{run_id}'",
                max_results=1,
            ),
        )
        if parents:
            tags[PARENT_TAG] = parents[0].info.run_id
    figures = asdict(reference)

    def log() -> str:
        run = client.create_run(experiment, run_name=f"reference-n{reference.users}", tags=tags)
        for key in ("input_len", "output_len", "num_prompts"):
            client.log_param(run.info.run_id, key, figures[key])
        for key, value in figures.items():
            if isinstance(value, int | float) and key not in ("input_len", "output_len", "num_prompts"):
                client.log_metric(run.info.run_id, key, float(value), step=reference.users)
        client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id

    return call(tracking, "log the reference run", log)
