"""A search's answers in its outputs: capacity.json, the report, the console and the
MLflow names, with the 95% intervals and the cost figures.

The searches are :mod:`runner.search.serving`'s engine model (windows with known
truth, TTFT included, each with its 95% intervals), since no GPU runs here; the
hardware profiles are the shipped YAML.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from runner.config import RunConfig
from runner.errors import ConfigError
from runner.output.answers import Capacity, capacity_answer, tok_s_per_gpu, usd_per_mtok
from runner.output.capacity import capacity_metrics, capacity_record, capacity_tags, metric_name
from runner.output.report import render_report
from runner.run.capacity import print_summary
from runner.run.context import RunContext
from runner.run.summary import RunSummary
from runner.search.params import SearchParams
from runner.search.serving import draw_serving_curve
from runner.search.simulator import Trace, run_policy
from tests.unit.test_config import compose_config
from tests.unit.test_report import DETAILS, ROWS, SUMMARY
from tests.unit.test_tiers import BATCH, INTERACTIVE, STANDARD, TIERED

UNTIERED = SearchParams(screening=True)


def search(params: SearchParams) -> Trace:
    trace = run_policy(draw_serving_curve("decode_bound", 4), params, seed=4)
    assert trace.decision is not None
    return trace


@pytest.fixture(scope="module")
def tiered() -> Trace:
    return search(TIERED)


@pytest.fixture(scope="module")
def h200x2() -> RunConfig:
    return compose_config("+hw=h200x2")


def answer(trace: Trace, params: SearchParams, config: RunConfig) -> Capacity:
    assert trace.decision is not None
    return capacity_answer(trace.decision, trace.history, params, config.hw)


def record_of(capacity: Capacity, config: RunConfig) -> dict:
    record = capacity_record(capacity, config, run_id="run-a", config_id="cfg-a", family="fp8")
    return json.loads(json.dumps(record))  # what capacity.json holds


def test_capacity_json_holds_every_answer_with_intervals_and_cost(
    tiered: Trace, h200x2: RunConfig
) -> None:
    """The default floor's answer first, then each tier in the order configured, each
    with its limits, users, binding limit, range of N, 95% intervals and cost."""
    assert h200x2.hw is not None and h200x2.hw.usd_per_hour is not None
    record = record_of(answer(tiered, TIERED, h200x2), h200x2)
    decision = tiered.decision
    assert decision is not None
    assert [entry["name"] for entry in record["tiers"]] == [
        "default", "interactive", "standard", "batch"
    ]  # fmt: skip
    assert record["gpus"] == 2 and record["usd_per_hour"] == h200x2.hw.usd_per_hour
    assert record["users_range"] == list(decision.users_range)
    assert record["flags"] == list(decision.flags)
    default, *tiers = record["tiers"]
    assert default["users"] == decision.best_users and default["binding"] is None
    assert default["limits"] == {"min_user_tok_s": 15.0}
    by_name = {tier.name: tier for tier in decision.tiers}
    for entry, objective in zip(tiers, (INTERACTIVE, STANDARD, BATCH), strict=True):
        assert entry["users"] == by_name[objective.name].max_users
        assert entry["binding"] == by_name[objective.name].binding
        assert entry["limits"] == {c.metric: c.limit for c in objective.constraints}
        assert entry["users_range"][0] == entry["users"] <= entry["users_range"][1]
    for entry in record["tiers"]:
        aggregate = entry["aggregate_tok_s"]
        low, high = entry["aggregate_tok_s_ci95"]
        assert low < high and 0.9 * aggregate < low < high < 1.1 * aggregate
        assert low < aggregate < high  # the interval is the reported figure's
        # The slowest user's interval is that of the window the slowest user was in.
        slowest = min(
            (o for o in tiered.history if o.users == entry["users"] and o.phase != "coarse"),
            key=lambda obs: obs.min_user_tok_s,
        )
        assert slowest.min_user_tok_s == entry["min_user_tok_s"]
        assert entry["min_user_tok_s_ci95"] == [slowest.min_user_ci.low, slowest.min_user_ci.high]
        assert entry["ttft_p99_ms"] > 0
        assert entry["tok_s_per_gpu"] == pytest.approx(aggregate / 2)
        assert entry["usd_per_mtok"] == pytest.approx(
            h200x2.hw.usd_per_hour / (aggregate * 3600 / 1e6)
        )
        # More tokens an hour, cheaper tokens: the price interval turns the aggregate's round.
        assert entry["usd_per_mtok_ci95"][0] == pytest.approx(
            usd_per_mtok(entry["aggregate_tok_s_ci95"][1], h200x2.hw.usd_per_hour)
        )
    assert record["tiers"][1]["users"] < record["tiers"][2]["users"] < record["tiers"][3]["users"]


def test_a_cpu_run_has_no_cost_figures(tiered: Trace) -> None:
    """No GPU profile, no GPU count and no price: every cost figure is None, never 0,
    and none reaches MLflow."""
    config = compose_config()
    capacity = answer(tiered, TIERED, config)
    record = record_of(capacity, config)
    assert record["hw"] == "cpu" and record["gpus"] is None and record["usd_per_hour"] is None
    for entry in record["tiers"]:
        assert entry["tok_s_per_gpu"] is None and entry["usd_per_mtok"] is None
        assert entry["usd_per_mtok_ci95"] is None
    metrics = capacity_metrics(capacity)
    assert not any("per_gpu" in key or "usd" in key for key in metrics)
    assert metrics["tier.batch.users"] == record["tiers"][3]["users"]


def test_a_profile_without_a_price_has_tok_s_per_gpu_but_no_dollars(tiered: Trace) -> None:
    config = compose_config("+hw=dgx_spark")
    assert config.hw is not None and config.hw.usd_per_hour is None
    best = answer(tiered, TIERED, config).default
    assert best.tok_s_per_gpu == best.aggregate_tok_s and best.usd_per_mtok is None


def test_cost_arithmetic() -> None:
    """$3.60 an hour at 1,000 output tok/s (3.6 M tokens an hour) is $1 per million."""
    assert usd_per_mtok(1000.0, 3.6) == pytest.approx(1.0)
    assert usd_per_mtok(2000.0, 3.6) == pytest.approx(0.5)
    assert tok_s_per_gpu(1000.0, 4) == 250.0
    assert usd_per_mtok(1000.0, None) is None and usd_per_mtok(None, 3.6) is None
    assert usd_per_mtok(0.0, 3.6) is None  # nothing generated: no price per token
    assert tok_s_per_gpu(1000.0, None) is None


def test_without_tiers_the_default_floor_is_the_only_entry(h200x2: RunConfig) -> None:
    trace = search(UNTIERED)
    capacity = answer(trace, UNTIERED, h200x2)
    record = record_of(capacity, h200x2)
    assert [entry["name"] for entry in record["tiers"]] == ["default"]
    assert not any(key.startswith("tier.") for key in capacity_metrics(capacity))
    assert capacity_tags(capacity) == {"curve_flags": "; ".join(capacity.flags) or "none"}


def test_mlflow_names_every_figure_and_its_interval(tiered: Trace, h200x2: RunConfig) -> None:
    capacity = answer(tiered, TIERED, h200x2)
    metrics = capacity_metrics(capacity)
    assert metric_name("default", "users") == "best_users"
    low, high = capacity.users_range or (None, None)
    assert (metrics["best_users_low"], metrics["best_users_high"]) == (low, high)
    for name in ("interactive", "standard", "batch"):
        for figure in ("users", "aggregate_tok_s", "min_user_tok_s", "tok_s_per_gpu",
                       "usd_per_mtok", "ttft_p99_ms"):  # fmt: skip
            assert f"tier.{name}.{figure}" in metrics
        for figure in ("aggregate_tok_s", "min_user_tok_s", "users"):
            assert metrics[f"tier.{name}.{figure}_low"] <= metrics[f"tier.{name}.{figure}_high"]
    for figure in ("aggregate_tok_s", "min_user_tok_s", "usd_per_mtok"):
        assert metrics[f"best_{figure}_low"] < metrics[f"best_{figure}_high"]
    tags = capacity_tags(capacity)
    assert tags["tier.standard.binding"].startswith("ttft_p99_ms")
    assert (
        tags["tier.interactive.limits"] == "min_user_tok_s >= 30 tok/s and ttft_p99_ms <= 1000 ms"
    )


def test_the_report_has_a_tier_table_the_range_the_flags_and_the_cost(
    tiered: Trace, h200x2: RunConfig
) -> None:
    capacity = answer(tiered, TIERED, h200x2)
    report = render_report({**SUMMARY, "capacity": capacity}, ROWS, DETAILS)
    low, high = capacity.users_range or (0, 0)
    assert (
        f"- **Range of N at the boundary:** the boundary is between {low} and {high} users"
        in report
    )
    assert "- **Output throughput per GPU:** " in report and "(2 GPUs)" in report
    assert f"at ${h200x2.hw.usd_per_hour:g}/h" in report  # type: ignore[union-attr]
    table = report.split("## SLO tiers")[1].split("##")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    header, *tiers = rows
    assert "binding" in header and "range of N" in header and "$/Mtok" in header
    assert [row.split(" | ")[0].removeprefix("| ") for row in tiers] == [
        "interactive", "standard", "batch"
    ]  # fmt: skip
    standard = tiers[1]
    assert f"| {capacity.tiers[1].users} |" in standard and "ttft_p99_ms <= 900 ms" in standard


def test_a_report_without_tiers_stays_as_before_with_range_and_flags() -> None:
    """The CPU default: no tier table and no cost lines; the range and flags are added."""
    trace = search(UNTIERED)
    capacity = answer(trace, UNTIERED, compose_config())
    report = render_report({**SUMMARY, "capacity": capacity}, ROWS, DETAILS)
    before = render_report(SUMMARY, ROWS, DETAILS)
    assert "## SLO tiers" not in report and "per GPU" not in report and "Cost" not in report
    added = set(report.splitlines()) - set(before.splitlines())
    assert {line.split(":**")[0] for line in added} == {
        "- **Range of N at the boundary", "- **Flags"
    }  # fmt: skip


def console_text(config: RunConfig, capacity: Capacity, tmp_path: Path) -> list[str]:
    context = RunContext(
        config, config_id="cfg-a", family="fp8", run_id="run-a", results_dir=tmp_path
    )
    best = capacity.default
    summary = RunSummary(
        kind="search", run_id="run-a", config_id="cfg-a", family="fp8",
        results_dir=str(tmp_path), best_users=best.users,
        median_aggregate_tok_s=best.aggregate_tok_s, min_user_tok_s=best.min_user_tok_s,
        windows=12, engine_minutes=3.0, floor_tok_s=15.0, capacity=capacity,
    )  # fmt: skip
    console = Console(record=True, width=300, color_system=None)
    print_summary(console, context, summary)
    return console.export_text().splitlines()


def test_the_console_prints_one_line_per_tier_after_the_best_n(
    tiered: Trace, h200x2: RunConfig, tmp_path: Path
) -> None:
    capacity = answer(tiered, TIERED, h200x2)
    lines = console_text(h200x2, capacity, tmp_path)
    assert lines[0].startswith(f"best N={capacity.default.users} ")
    assert "tok_s_per_gpu=" in lines[0] and "usd_per_mtok=" in lines[0]
    tier_lines = [line for line in lines if line.startswith("tier ")]
    assert [line.split(":")[0] for line in tier_lines] == [
        "tier interactive", "tier standard", "tier batch"
    ]  # fmt: skip
    assert lines.index(tier_lines[0]) > 0
    assert f"N={capacity.tiers[1].users} " in tier_lines[1]
    assert tier_lines[1].endswith(f"bound by {capacity.tiers[1].binding}")
    low, high = capacity.users_range or (0, 0)
    assert f"the boundary is between {low} and {high} users" in lines


def test_the_console_without_tiers_adds_only_the_range_and_flags(tmp_path: Path) -> None:
    config = compose_config()
    trace = search(UNTIERED)
    capacity = answer(trace, UNTIERED, config)
    lines = console_text(config, capacity, tmp_path)
    assert lines[0].startswith("best N=") and "tok_s_per_gpu" not in lines[0]
    assert lines[0].split("(floor 15.0) ")[1].startswith("config_id=cfg-a ")
    assert not any(line.startswith("tier ") for line in lines)
    extra = lines[2:]  # after the best-N line and the results line
    assert extra[0].startswith("the boundary is ")
    assert all(line.startswith("flag: ") for line in extra[1:])


def test_the_hardware_price_is_overridable_and_may_be_null() -> None:
    """hw.usd_per_hour: a rental's price on the command line, or none at all."""
    assert compose_config("+hw=h200", "hw.usd_per_hour=2.5").hw.usd_per_hour == 2.5  # type: ignore[union-attr]
    assert compose_config("+hw=h200", "hw.usd_per_hour=null").hw.usd_per_hour is None  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="usd_per_hour"):
        compose_config("+hw=h200", "hw.usd_per_hour=0")


def test_a_tier_may_not_take_the_default_floors_name() -> None:
    with pytest.raises(ConfigError, match="'default' names the default floor"):
        compose_config("+slo.tiers=[{name:default,ttft_p99_ms:500}]")
