"""``python -m runner.compare --baseline`` and ``--pareto`` against a real MLflow sqlite
store, with searches logged through the Tracker as a finished search logs them (no
engine needed: the figures are set here, the names and the store are the real ones)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.compare import main
from runner.config import Tracking
from runner.measure.uncertainty import Interval
from runner.output.answers import Capacity, TierAnswer, tok_s_per_gpu, usd_per_mtok
from runner.output.capacity import capacity_metrics, capacity_tags
from runner.output.tracking import Tracker
from runner.search.types import Constraint

pytestmark = pytest.mark.integration

PRICE = 3.59  # conf/hw/h200.yaml's indicative price


def answer(
    name: str, users: int, aggregate: float, slowest: float, half: float | None, gpus: int | None
) -> TierAnswer:
    ci = None if half is None else Interval(aggregate - half, aggregate + half)
    price = PRICE if gpus else None
    return TierAnswer(
        name=name,
        limits=(Constraint("min_user_tok_s", 30.0 if name == "interactive" else 15.0),),
        users=users,
        aggregate_tok_s=aggregate,
        min_user_tok_s=slowest,
        binding=None if name == "default" else "min_user_tok_s >= 30 tok/s",
        users_range=None if half is None else (users, users + 3),
        windows=3,
        reason="set by the test",
        ttft_p99_ms=800.0,
        aggregate_ci=ci,
        min_user_ci=None if half is None else Interval(slowest - 0.5, slowest + 0.5),
        tok_s_per_gpu=tok_s_per_gpu(aggregate, gpus),
        tok_s_per_gpu_ci=None if ci is None or not gpus else Interval(ci.low / gpus, ci.high / gpus),
        usd_per_mtok=usd_per_mtok(aggregate, price),
        usd_per_mtok_ci=None if ci is None or not gpus else Interval(
            usd_per_mtok(ci.high, price) or 0.0, usd_per_mtok(ci.low, price) or 0.0
        ),
    )  # fmt: skip


def log_search(
    tracking: Tracking,
    run_id: str,
    config_id: str,
    family: str,
    aggregate: float,
    half: float | None = 20.0,
    gpus: int | None = 1,
    interactive: tuple[int, float, float] | None = None,
) -> None:
    answers = [answer("default", 95, aggregate, 15.5, half, gpus)]
    if interactive is not None:
        answers.append(answer("interactive", *interactive, half, gpus))
    capacity = Capacity(tuple(answers), gpus=gpus, usd_per_hour=PRICE if gpus else None)
    with Tracker(
        tracking, run_id=run_id, config_id=config_id, tags={"family": family}, params={}
    ) as tracker:
        tracker.log_metrics(capacity_metrics(capacity))
        tracker.log_tags(capacity_tags(capacity))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Tracking:
    tracking = Tracking(
        uri=f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db", experiment="baselines"
    )
    log_search(tracking, "run-base", "cfg-base", "fp8", 1000.0, interactive=(25, 700.0, 31.0))
    log_search(tracking, "run-faster", "cfg-faster", "fp8", 1100.0, interactive=(30, 800.0, 32.0))
    log_search(tracking, "run-close", "cfg-close", "fp8", 1010.0)
    log_search(tracking, "run-old", "cfg-old", "fp8", 1300.0, half=None)
    log_search(tracking, "run-bf16", "cfg-bf16", "bf16", 500.0)
    return tracking


def compare_args(tracking: Tracking, *more: str) -> list[str]:
    return ["--tracking-uri", tracking.uri, "--experiment", tracking.experiment, *more]


def section(text: str, title: str) -> str:
    return text.split(title)[1].split(" against the baseline")[0]


def test_baseline_says_per_figure_whether_a_change_exceeds_the_noise(
    store: Tracking, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(compare_args(store, "--baseline", "run-base")) == 0
    out = capsys.readouterr().out
    assert "baseline: run-base (cfg-base), family fp8" in out
    tables = {
        name: out.split(f"{name} (cfg-")[1].split("\n\n")[0]
        for name in ("run-faster", "run-close", "run-old")
    }

    def verdict(table: str, tier: str, figure: str) -> str:
        row = next(
            line for line in table.splitlines()
            if line.startswith(f"│ {tier} ") and f"│ {figure} " in line
        )  # fmt: skip
        return row.split("│")[-2].strip()

    assert verdict(tables["run-faster"], "default", "aggregate tok/s").startswith(
        "better, beyond noise"
    )
    assert verdict(tables["run-faster"], "default", "$/Mtok").startswith("better, beyond noise")
    assert verdict(tables["run-close"], "default", "aggregate tok/s").startswith("within noise")
    assert verdict(tables["run-old"], "default", "aggregate tok/s").startswith("noise unknown")
    assert verdict(tables["run-old"], "default", "TTFT p99 ms").startswith("unchanged")
    # Both answered the interactive tier: its users are compared too, by their ranges.
    assert verdict(tables["run-faster"], "interactive", "users").startswith("better")
    assert "interactive" not in tables["run-close"]
    # Another family is never compared against the baseline (seed 004 §10).
    assert "run-bf16" not in out and "1 search(es) of other families left out" in out


def test_an_unknown_baseline_is_one_paragraph(
    store: Tracking, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(compare_args(store, "--baseline", "run-missing")) == 2
    captured = capsys.readouterr()
    assert "No search with run_id 'run-missing'" in " ".join(captured.err.split())
    assert "Traceback" not in captured.err and captured.out == ""


def test_pareto_plot_from_mlflow_marks_each_familys_front(
    store: Tracking, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plot = tmp_path / "plots" / "pareto.png"
    assert main(compare_args(store, "--pareto", str(plot))) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out

    def on_front(label: str) -> bool:
        row = next(line for line in out.splitlines() if f"│ {label} " in line)
        return row.split("│")[-2].strip() == "yes"

    # fp8: the faster search beats base and close on both axes; old is fastest per GPU
    # but its slowest user (15.5 tok/s, as every default answer here) ties, so it
    # dominates them too; the interactive tiers trade per-GPU throughput for speed.
    assert on_front("cfg-old/default") and on_front("cfg-faster/interactive")
    assert not on_front("cfg-base/default") and not on_front("cfg-close/default")
    assert not on_front("cfg-base/interactive")
    assert on_front("cfg-bf16/default")  # alone in its family
    assert f"Pareto plot: {plot}" in out


def test_pareto_without_gpu_figures_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CPU searches have no GPU count, so no tok/s per GPU: nothing to plot, said plainly."""
    tracking = Tracking(uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="cpu-only")
    log_search(tracking, "run-cpu", "cfg-cpu", "dummy-weights-bf16", 800.0, gpus=None)
    assert main(compare_args(tracking, "--pareto", str(tmp_path / "p.png"))) == 2
    assert "CPU runs have no GPU count" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "p.png").exists()
    assert main(compare_args(tracking)) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "cfg-cpu" in line)
    assert row.count("n/a") == 2  # tok/s/GPU and $/Mtok
