"""Searches against a baseline, and the Pareto front of per-user speed against tok/s
per GPU: pure functions over searches as MLflow holds them."""

from __future__ import annotations

import pytest

from runner.errors import ConfigError
from runner.output.baseline import FIGURES, change, changes, find_baseline, render_baseline
from runner.output.compare import SearchRun
from runner.output.pareto import ParetoPoint, pareto_front, pareto_points

FIGURE = {figure.name: figure for figure in FIGURES}


def run(
    run_id: str,
    family: str = "fp8",
    config_id: str | None = None,
    started_ms: int = 0,
    tiers: tuple[str, ...] = (),
    **metrics: float,
) -> SearchRun:
    tags = {f"tier.{tier}.limits": "min_user_tok_s >= 30 tok/s" for tier in tiers}
    return SearchRun(
        family, config_id or f"cfg-{run_id}", run_id, "FINISHED", f"mlflow-{run_id}",
        started_ms=started_ms, metrics=metrics, tags=tags,
    )  # fmt: skip


def with_interval(name: str, value: float, half: float) -> dict[str, float]:
    return {name: value, f"{name}_low": value - half, f"{name}_high": value + half}


BASE = run("base", **with_interval("best_aggregate_tok_s", 1000.0, 20.0))


def test_a_difference_outside_the_combined_interval_is_beyond_noise() -> None:
    """Half-widths 20 and 20 combine to 28.3: +100 tok/s is beyond it, +25 within."""
    faster = run("faster", **with_interval("best_aggregate_tok_s", 1100.0, 20.0))
    close = run("close", **with_interval("best_aggregate_tok_s", 1025.0, 20.0))
    slower = run("slower", **with_interval("best_aggregate_tok_s", 900.0, 20.0))
    aggregate = FIGURE["aggregate_tok_s"]
    up = change(BASE, faster, "default", aggregate)
    assert (up.verdict, up.difference, up.percent) == ("better", 100.0, 10.0)
    assert up.noise == pytest.approx(28.28, abs=0.01)
    assert change(BASE, close, "default", aggregate).verdict == "within noise"
    assert change(BASE, slower, "default", aggregate).verdict == "worse"


def test_lower_is_better_for_price_and_latency() -> None:
    base = run("b", **with_interval("best_usd_per_mtok", 1.0, 0.02))
    cheaper = run("c", **with_interval("best_usd_per_mtok", 0.8, 0.02))
    assert change(base, cheaper, "default", FIGURE["usd_per_mtok"]).verdict == "better"
    assert change(cheaper, base, "default", FIGURE["usd_per_mtok"]).verdict == "worse"


def test_without_intervals_the_noise_is_unknown_and_said_so() -> None:
    """TTFT p99 carries no interval, nor does any figure of a search logged before
    intervals were measured: the verdict says so instead of guessing."""
    old = run("old", best_aggregate_tok_s=1300.0, best_ttft_p99_ms=900.0)
    base = run(
        "base", best_ttft_p99_ms=800.0, **with_interval("best_aggregate_tok_s", 1000.0, 20.0)
    )
    aggregate = change(base, old, "default", FIGURE["aggregate_tok_s"])
    assert aggregate.verdict == "noise unknown" and aggregate.noise is None
    assert aggregate.why == "this search logged no 95% interval"
    ttft = change(base, old, "default", FIGURE["ttft_p99_ms"])
    assert ttft.verdict == "noise unknown" and ttft.why == "neither search logged a 95% interval"
    assert change(base, base, "default", FIGURE["ttft_p99_ms"]).verdict == "unchanged"


def test_a_figure_one_search_lacks_is_not_compared() -> None:
    """A CPU run has no cost figures: n/a, never a change from or to 0."""
    cpu = run("cpu", **with_interval("best_aggregate_tok_s", 1000.0, 20.0))
    gpu = run("gpu", best_usd_per_mtok=1.2, **with_interval("best_aggregate_tok_s", 1000.0, 20.0))
    price = change(cpu, gpu, "default", FIGURE["usd_per_mtok"])
    assert price.verdict == "n/a" and price.difference is None
    assert "the baseline logged no $/Mtok" == price.why


def test_user_counts_are_within_noise_when_their_ranges_overlap() -> None:
    base = run("b", best_users=95, best_users_low=95, best_users_high=98)
    near = run("n", best_users=97, best_users_low=97, best_users_high=101)
    far = run("f", best_users=120, best_users_low=120, best_users_high=125)
    # An answer below its range (the aggregate peaks before the boundary) widens it.
    peak = run("p", best_users=60, best_users_low=99, best_users_high=104)
    users = FIGURE["users"]
    assert change(base, near, "default", users).verdict == "within noise"
    assert change(base, far, "default", users).verdict == "better"
    assert change(base, peak, "default", users).verdict == "within noise"
    unranged = change(base, run("x", best_users=97), "default", users)
    assert (unranged.verdict, unranged.why) == ("noise unknown", "this search logged no range of N")


def test_tiers_both_searches_answered_are_compared_too() -> None:
    base = run("b", tiers=("interactive", "batch"), **{"tier.interactive.users": 25})
    other = run("o", tiers=("interactive",), **{"tier.interactive.users": 30})
    compared = changes(base, other)
    assert {item.tier for item in compared} == {"default", "interactive"}
    users = next(c for c in compared if c.tier == "interactive" and c.figure.name == "users")
    assert (users.baseline, users.value) == (25, 30)
    text = render_baseline(base, [other])
    assert "baseline: b (cfg-b)" in text and "o (cfg-o) against the baseline" in text
    assert "interactive" in text


def test_the_baseline_is_found_by_run_id_or_mlflow_id_and_never_guessed() -> None:
    runs = [BASE, run("twin", config_id="cfg-1"), run("twin", config_id="cfg-2")]
    assert find_baseline(runs, "base") is BASE
    assert find_baseline(runs, "mlflow-base") is BASE
    with pytest.raises(ConfigError, match="No search with run_id 'gone'"):
        find_baseline(runs, "gone")
    with pytest.raises(ConfigError, match="2 searches carry run_id 'twin'"):
        find_baseline(runs, "twin")


def point(family: str, config_id: str, x: float, y: float, tier: str = "default") -> ParetoPoint:
    return ParetoPoint(family, config_id, tier, f"run-{config_id}", x, y)


def test_the_pareto_front_keeps_what_nothing_beats_on_both_axes() -> None:
    fast = point("fp8", "a", 1000.0, 10.0)  # most tok/s per GPU
    quick = point("fp8", "b", 300.0, 40.0)  # fastest user
    middle = point("fp8", "c", 700.0, 20.0)
    beaten = point("fp8", "d", 600.0, 18.0)  # middle is better on both
    tie = point("fp8", "e", 700.0, 20.0)  # equal to middle: neither beats the other
    edge = point("fp8", "f", 1000.0, 8.0)  # as much per GPU as fast, slower users
    front = pareto_front([fast, quick, middle, beaten, tie, edge])
    assert front == [quick, middle, tie, fast]


def test_families_never_share_a_front() -> None:
    """seed 004 §10: an NVFP4 point does not push an FP8 point off its front."""
    fp8 = point("fp8", "a", 500.0, 20.0)
    nvfp4 = point("nvfp4", "b", 900.0, 30.0)
    assert pareto_front([fp8, nvfp4]) == [fp8, nvfp4]


def test_one_point_per_config_id_and_tier_from_its_latest_search() -> None:
    old = run("old", config_id="cfg", started_ms=1, best_tok_s_per_gpu=100.0,
              best_min_user_tok_s=20.0)  # fmt: skip
    new = run(
        "new", config_id="cfg", started_ms=2, tiers=("interactive",),
        best_tok_s_per_gpu=120.0, best_min_user_tok_s=19.0,
        **{"tier.interactive.tok_s_per_gpu": 60.0, "tier.interactive.min_user_tok_s": 31.0},
    )  # fmt: skip
    cpu = run("cpu", config_id="cpu", best_aggregate_tok_s=800.0, best_min_user_tok_s=20.0)
    points, lacking = pareto_points([old, new, cpu])
    assert [(p.config_id, p.tier, p.run_id) for p in points] == [
        ("cfg", "interactive", "new"), ("cfg", "default", "new")
    ]  # fmt: skip
    assert points[0].user_tok_s == 31.0 and points[1].tok_s_per_gpu == 120.0
    assert lacking == 1  # the CPU run has no tok/s per GPU
