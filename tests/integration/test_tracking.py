"""MLflow tracking and comparison against a real MLflow sqlite store in a temporary folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from runner.compare import main
from runner.config import Tracking
from runner.errors import TrackingError
from runner.measure.result import WindowResult
from runner.output.compare import compare, render_compare
from runner.output.tracking import BEST_AGGREGATE_TOK_S, BEST_MIN_USER_TOK_S, BEST_USERS, Tracker
from tests import builders

pytestmark = pytest.mark.integration


def make_result(users: int, aggregate: float, valid: bool = True) -> WindowResult:
    return builders.make_result(
        users, window_s=30.0, aggregate_output_tok_s=aggregate, server_output_tok_s=None,
        mean_user_tok_s=aggregate / users, min_user_tok_s=aggregate / users - 1.0,
        p05_user_tok_s=aggregate / users - 0.5, valid=valid,
        detail={"phase": "bracket", "invalid_reasons": [] if valid else ["audit 2.3% > 1%"]},
    )  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sqlite store per module: creating MLflow's tables takes seconds, logging does not."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture
def tracking(store: Path, monkeypatch: pytest.MonkeyPatch) -> Tracking:
    # Relative paths as in the shipped defaults, resolved against the folder runner runs in.
    monkeypatch.chdir(store)
    return Tracking(uri="sqlite:///mlruns/mlflow.db", experiment="capacity")


def client(tracking: Tracking) -> MlflowClient:
    return MlflowClient(tracking_uri=tracking.uri)


def children_of(tracking: Tracking, parent: str) -> list:
    mlflow = client(tracking)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    return mlflow.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'"
    )


def test_parent_and_one_child_per_window(tracking: Tracking, store: Path) -> None:
    windows = [make_result(7, 140.0), make_result(14, 250.0), make_result(28, 300.0, valid=False)]
    params = {"engine.max_num_seqs": 256, "workload.buckets": [{"total_tokens": 1000}],
              "long": "x" * 7000}  # fmt: skip
    with Tracker(tracking, run_id="run-a", config_id="cfg-a",
                 tags={"family": "fam-1", "hw": "cpu"}, params=params) as tracker:  # fmt: skip
        for index, result in enumerate(windows):
            tracker.log_window(result, index)
        tracker.log_metrics(
            {BEST_USERS: 14, BEST_AGGREGATE_TOK_S: 250.0, BEST_MIN_USER_TOK_S: 16.9}
        )
        report = store / "report.md"
        report.write_text("# report\n")
        tracker.log_artifact(report)
        tracker.log_startup_facts({"kv_cache_size_tokens": 179376, "vllm_version": "0.32.0"})
        parent = tracker.parent_run_id

    mlflow = client(tracking)
    run = mlflow.get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "cfg-a-run-a"
    assert run.data.tags["config_id"] == "cfg-a" and run.data.tags["family"] == "fam-1"
    assert run.data.params["engine.max_num_seqs"] == "256"
    assert len(run.data.params["long"]) <= 6000
    assert run.data.metrics[BEST_USERS] == 14
    assert run.data.metrics["startup.kv_cache_size_tokens"] == 179376
    assert run.data.tags["startup.vllm_version"] == "0.32.0"
    # The parent holds every window's metric at step=users: a metric-vs-N curve.
    history = mlflow.get_metric_history(parent, "aggregate_output_tok_s")
    assert sorted((m.step, m.value) for m in history) == [(7, 140.0), (14, 250.0), (28, 300.0)]
    assert "server_output_tok_s" not in run.data.metrics  # unavailable, not zero

    children = children_of(tracking, parent)
    assert sorted(int(c.data.tags["users"]) for c in children) == [7, 14, 28]
    invalid = next(c for c in children if c.data.tags["users"] == "28")
    assert invalid.data.tags["valid"] == "false" and invalid.data.tags["phase"] == "bracket"
    assert mlflow.get_metric_history(invalid.info.run_id, "min_user_tok_s")[0].step == 28

    artifacts = {item.path for item in mlflow.list_artifacts(parent)}
    assert {"report.md", "startup_facts.json"} <= artifacts
    artifact_dir = Path(
        mlflow.get_experiment_by_name("capacity").artifact_location.removeprefix("file://")
    )
    assert artifact_dir == store / "mlruns" / "artifacts"
    assert list(artifact_dir.rglob("report.md"))


def test_resume_reuses_the_parent_and_skips_logged_windows(tracking: Tracking) -> None:
    tags = {"family": "fam-1"}
    with (
        pytest.raises(KeyboardInterrupt),
        Tracker(tracking, run_id="run-b", config_id="cfg-a", tags=tags, params={"a": 1}) as first,
    ):
        first.log_window(make_result(7, 140.0), 0)
        raise KeyboardInterrupt
    assert client(tracking).get_run(first.parent_run_id).info.status == "KILLED"

    with Tracker(tracking, run_id="run-b", config_id="cfg-a", tags=tags, params={"a": 1}) as again:
        assert again.resumed and again.parent_run_id == first.parent_run_id
        again.log_window(make_result(7, 140.0), 0)
        again.log_window(make_result(14, 250.0), 1)

    mlflow = client(tracking)
    experiment = mlflow.get_experiment_by_name(tracking.experiment)
    parents = mlflow.search_runs(
        [experiment.experiment_id],
        filter_string="tags.run_id = 'run-b' and tags.`runner.kind` = 'search'",
    )
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(
        c.data.tags["window_index"] for c in children_of(tracking, first.parent_run_id)
    ) == ["0", "1"]
    steps = [m.step for m in mlflow.get_metric_history(first.parent_run_id, "users")]
    assert sorted(steps) == [7, 14]


def test_compare_lists_config_ids_by_family(
    tracking: Tracking, capsys: pytest.CaptureFixture[str]
) -> None:
    for config_id, family, best in (
        ("cfg-x", "fam-2", 400.0),
        ("cfg-y", "fam-2", 450.0),
        ("cfg-z", "fam-3", 900.0),
    ):
        with Tracker(
            tracking, run_id="run-c", config_id=config_id, tags={"family": family}, params={}
        ) as tracker:
            tracker.log_metrics(
                {BEST_USERS: 16, BEST_AGGREGATE_TOK_S: best, BEST_MIN_USER_TOK_S: 15.2}
            )

    rows = compare(tracking.uri, tracking.experiment, "fam-2")
    assert [row.config_id for row in rows] == ["cfg-y", "cfg-x"]
    assert rows[0].best_users == 16

    everything = compare(tracking.uri, tracking.experiment, None)
    assert {"fam-2", "fam-3"} <= {row.family for row in everything}
    assert render_compare(everything).count("family: fam-") >= 2

    assert (
        main(["--tracking-uri", tracking.uri, "--experiment", "capacity", "--family", "fam-3"]) == 0
    )
    printed = capsys.readouterr().out
    assert "cfg-z" in printed and "cfg-x" not in printed


def test_compare_reports_a_missing_store(tmp_path: Path) -> None:
    with pytest.raises(TrackingError, match="no MLflow database"):
        compare(f"sqlite:///{tmp_path}/absent.db", "capacity", None)


def test_disabled_tracking_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tracking = Tracking(enabled=False)
    with Tracker(tracking, run_id="run-d", config_id="cfg-d", tags={}, params={"a": 1}) as tracker:
        tracker.log_window(make_result(7, 140.0), 0)
        tracker.log_metrics({BEST_USERS: 7})
        tracker.log_artifact(tmp_path)
    assert tracker.parent_run_id is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(30)
def test_unreachable_server_fails_fast_with_a_tracking_error() -> None:
    """MLflow's client alone would retry a dead server for minutes before failing."""
    tracking = Tracking(uri="http://user:secret@127.0.0.1:9", experiment="capacity")
    with pytest.raises(TrackingError, match="tracking.enabled=false") as caught:
        Tracker(tracking, run_id="run-e", config_id="cfg-e", tags={}, params={})
    assert "secret" not in str(caught.value)
    with pytest.raises(TrackingError, match="does not answer"):
        compare("http://127.0.0.1:9", "capacity", None)


def test_environment_values_never_reach_params() -> None:
    """Secrets come only from environment variables and never reach MLflow (house rule)."""
    from runner.output.tracking import config_params

    config = _minimal_config(engine_env={"HF_TOKEN": "hf_secret_value"})
    params = config_params(config)
    assert params["engine.env"] == "HF_TOKEN"
    assert not any("hf_secret_value" in str(value) for value in params.values())


def _minimal_config(engine_env: dict[str, str]):
    from runner.config import build_config

    return build_config(
        {
            "image": {
                "name": "cpu",
                "repository": "local/vllm-cpu",
                "tag": "dev",
                "allow_unpinned": True,
            },
            "model": {
                "name": "tiny",
                "repo": "local/tiny",
                "weights": "fp32",
                "served_name": "tiny",
                "max_context": 2048,
            },  # fmt: skip
            "kv": {"name": "auto", "cache_dtype": "auto", "precision": "auto"},
            "engine": {"name": "default", "env": engine_env},
            "workload": {"name": "mix", "buckets": [{"total_tokens": 1000}]},
            "search": {"kind": "fixed", "users": [1]},
            "backend": {"kind": "process"},
            "results": {"dir": "results"},
        }
    )


def test_parallel_runs_open_one_fresh_sqlite_store_together(tmp_path: Path) -> None:
    """The jobs of a parallel sweep open the same new sqlite file at once: one creates
    MLflow's tables while the others wait for it, and every job gets its parent run."""
    code = (
        "import sys; from runner.config import Tracking; from runner.output.tracking import Tracker; "
        "t = Tracking(uri=sys.argv[1], artifact_root=sys.argv[2]); "
        "print(Tracker(t, run_id=sys.argv[3], config_id='c').parent_run_id)"
    )
    uri = f"sqlite:///{tmp_path}/fresh.db"
    repo = Path(__file__).resolve().parents[2]
    jobs = [
        subprocess.Popen([sys.executable, "-c", code, uri, str(tmp_path / "artifacts"), f"job-{i}"],
                         cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(3)
    ]  # fmt: skip
    outputs = [job.communicate(timeout=300) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    parents = {out.strip() for out, _ in outputs}
    assert len(parents) == 3 and all(parents)
