"""SLO tiers: the configuration, and one search that answers every tier.

The curves are :mod:`runner.search.serving`'s engine model, which also gives each
window's TTFT, ITL and request latency, so tiers can be bound by a latency ceiling.
"""

from __future__ import annotations

import pytest

from runner.config import SLO, BracketSearch, build_config
from runner.errors import ConfigError
from runner.search.params import SearchParams
from runner.search.peak import provisional_best
from runner.search.policy import decide, next_step
from runner.search.serving import ServingCurve, draw_serving_curve
from runner.search.simulator import draw_curve, run_policy
from runner.search.types import Constraint, Objective, Observation, Step
from runner.search.view import View
from tests.unit.test_config import compose_config
from tests.unit.test_search_decision import DEFAULT_RUN, real

INTERACTIVE = Objective(
    "interactive", (Constraint("min_user_tok_s", 30.0), Constraint("ttft_p99_ms", 1000.0))
)
STANDARD = Objective(
    "standard", (Constraint("min_user_tok_s", 15.0), Constraint("ttft_p99_ms", 900.0))
)
BATCH = Objective("batch", (Constraint("min_user_tok_s", 5.0),))
TIERED = SearchParams(screening=True, tiers=(INTERACTIVE, STANDARD, BATCH))


def true_max_users(curve: ServingCurve, tier: Objective) -> tuple[int, str]:
    """The most users whose true figures meet every constraint, and the constraint
    the next user breaks."""
    users = 0
    while True:
        state = curve.state(users + 1)
        broken = [c for c in tier.constraints if not c.met(getattr(state, c.metric))]
        if broken:
            return users, broken[0].label
        users += 1


def test_one_search_answers_every_tier_with_the_constraint_that_binds() -> None:
    """Three tiers from one search: each tier's answer truly meets all of its limits
    (to within 0.5%: a 95% claim from windows with 1.5% noise cannot tell a slowest
    user at 4.999 tok/s from one at 5.0), lies close under the true maximum, and
    names the limit that stops one user more; the standard tier's TTFT ceiling binds
    before its floor does."""
    curve = draw_serving_curve("decode_bound", 4)
    trace = run_policy(curve, TIERED, seed=4)
    assert trace.decision is not None
    answers = {tier.name: tier for tier in trace.decision.tiers}
    assert list(answers) == ["interactive", "standard", "batch"]
    for tier in TIERED.tiers:
        answer = answers[tier.name]
        most, binding = true_max_users(curve, tier)
        assert answer.max_users is not None, answer.reason
        state = curve.state(answer.max_users)
        assert all(c.met(getattr(state, c.metric), -0.005) for c in tier.constraints), tier.name
        assert answer.max_users >= 0.85 * most, (tier.name, answer.max_users, most)
        assert answer.binding == binding, (tier.name, answer.binding)
        assert answer.median_aggregate_tok_s is not None
        assert answer.users_range is not None
    assert answers["standard"].binding.startswith("ttft_p99_ms")
    # The default floor is still answered, from the same windows.
    assert trace.decision.best_users is not None
    assert curve.min_user_tok_s(trace.decision.best_users) >= 15.0 * 0.97


def test_a_tier_nothing_meets_has_no_answer_and_says_why() -> None:
    impossible = Objective("instant", (Constraint("ttft_p99_ms", 1.0),))
    params = SearchParams(screening=True, tiers=(impossible,))
    trace = run_policy(draw_serving_curve("decode_bound", 4), params, seed=0)
    assert trace.decision is not None
    (answer,) = trace.decision.tiers
    assert answer.max_users is None
    assert "ttft_p99_ms <= 1 ms" in answer.reason
    assert trace.decision.best_users is not None


def test_replaying_a_tiered_history_gives_the_same_steps() -> None:
    """A resumed run replays its rows: with tiers too, every prefix leads to the
    window that was measured next, and the whole history to the same answers."""
    trace = run_policy(draw_serving_curve("decode_bound", 4), TIERED, seed=7)
    for index, step in enumerate(trace.steps):
        assert next_step(trace.history[:index], TIERED) == step
    assert next_step(trace.history, TIERED) is None
    assert decide(list(trace.history), TIERED) == trace.decision


def test_a_tier_window_without_intervals_leaves_the_other_tiers_theirs() -> None:
    """In a real `slo=tiers` run the batch tier's window at 256 users (slowest user
    12.2 tok/s, requests too long for an interval) switched every tier to the rules
    without intervals, and the default floor was answered at 101 users where 211
    met it. A window without an interval that misses a tier's floor rules its count
    out for that tier under either reading; only the tier it passes (batch) has to
    read it without one."""
    params = SearchParams(
        start_users=7, max_users=256, confirm_repeats=2, screening=True, tiers=(BATCH,)
    )
    batch_window = real(256, "confirm", (3120.0,), (12.2,))
    history = [*DEFAULT_RUN, batch_window]
    assert View(history, params, params.default).statistical
    assert 256 in View(history, params, params.default).ruled_out
    assert not View(history, params, BATCH).statistical
    decision = decide(history, params)
    assert "one-sided 95%" in decision.reason  # the default floor, read with intervals
    assert decision.best_users == 199


@pytest.mark.parametrize("noise_pct", [3.0, 5.0])
def test_without_intervals_the_search_stops_where_the_decision_answers(noise_pct: float) -> None:
    """Without intervals (rows written before runner measured them) one window under
    the floor rules its count out and caps the answer below it (seed 004 §9.8: every
    window at the count meets the floor). The search must confirm under that cap
    too: steering by counts above it, it once confirmed a count the decision then
    refused, and stopped with no answer."""
    params = SearchParams(screening=True)
    for seed in range(60):
        curve = draw_curve("saturating", seed, noise_pct=noise_pct)
        trace = run_policy(curve, params, seed, intervals=False)
        confirmed = provisional_best(View(trace.history, params, params.default))
        assert trace.decision is not None and confirmed is not None
        answer = trace.decision.best_users
        assert answer is not None, (seed, confirmed, trace.decision.reason)
        assert answer >= confirmed[0] - params.neighbourhood, (seed, answer, confirmed)


def test_a_flat_aggregate_does_not_end_the_doubling_for_a_tier() -> None:
    """Seed 004 §9.4 ends the doubling after two windows in a row with negligible
    aggregate gain: past saturation more users add no throughput, which is all the
    default floor asks about. A tier asks for the most users. In a real
    `slo=tiers engine.max_num_seqs=512` run the CPU engine's aggregate was flat from
    56 to 224 users (5,436, 5,328, 5,507 tok/s) with the slowest user still at 24
    tok/s; the doubling stopped there and every tier above 224 users would have been
    answered at 224."""
    standard = Objective("standard", (Constraint("min_user_tok_s", 15.0),))
    params = SearchParams(
        start_users=7, max_users=512, confirm_repeats=2, screening=True, tiers=(standard, BATCH)
    )
    coarse = [
        real(users, "coarse", (aggregate,), (rate,), screening=True)
        for users, aggregate, rate in (
            (7, 3269.05, 466.96),
            (14, 4379.73, 312.78),
            (28, 5069.58, 180.85),
            (56, 5436.46, 96.99),
            (112, 5328.14, 47.41),
            (224, 5507.21, 24.14),
        )
    ]
    assert next_step(coarse, SearchParams(start_users=7, max_users=512, screening=True)) != Step(
        448, "coarse", screening=True
    )  # the default floor alone: saturated
    assert next_step(coarse, params) == Step(448, "coarse", screening=True)


def test_without_tiers_the_decision_has_none() -> None:
    params = SearchParams.from_config(BracketSearch(kind="bracket"), SLO())
    assert params.tiers == ()
    trace = run_policy(draw_serving_curve("prefill_bound", 2), SearchParams(), seed=2)
    assert trace.decision is not None and trace.decision.tiers == ()


def test_tiers_come_from_the_configuration_in_order() -> None:
    config = compose_config("slo=tiers", "dry_run=true")
    params = SearchParams.from_config(config.search, config.slo)
    assert [tier.name for tier in params.tiers] == ["interactive", "standard", "batch"]
    interactive = params.tiers[0]
    assert [c.label for c in interactive.constraints] == [
        "min_user_tok_s >= 30 tok/s",
        "ttft_p99_ms <= 1000 ms",
    ]
    assert config.slo.min_user_tok_s == 15.0  # the default floor stays


def test_a_tier_on_the_command_line() -> None:
    config = compose_config("slo.tiers=[{name:fast,itl_p99_ms:50,request_latency_p99_ms:20000}]")
    (tier,) = config.slo.tiers
    assert tier.limits() == [("itl_p99_ms", 50.0), ("request_latency_p99_ms", 20000.0)]


@pytest.mark.parametrize(
    ("tiers", "words"),
    [
        ([{"name": "empty"}], ["tier 'empty' sets no limit", "ttft_p99_ms"]),
        (
            [{"name": "a", "min_user_tok_s": 5}, {"name": "a", "ttft_p99_ms": 100}],
            ["unique", "a"],
        ),
        ([{"name": "two words", "min_user_tok_s": 5}], ["slo.tiers.0.name"]),
        ([{"name": "x", "ttft_p95_ms": 100}], ["ttft_p95_ms", "did you mean"]),
        ([{"name": "x", "min_user_tok_s": -1}], ["greater than 0"]),
    ],
)
def test_bad_tiers_are_refused_in_one_paragraph(tiers: list[dict], words: list[str]) -> None:
    data = compose_config().model_dump()
    data["slo"]["tiers"] = tiers
    with pytest.raises(ConfigError) as refused:
        build_config(data)
    for word in words:
        assert word in str(refused.value)


def test_a_fixed_search_names_its_largest_count_as_what_stops_a_tier() -> None:
    """Nothing above the largest count was measured, so no limit can be said to stop
    one user more; and a fixed search gives no boundary range."""
    params = SearchParams(kind="fixed", users=(4, 8), tiers=(BATCH,))
    history = [Observation(n, 100.0 * n, 40.0, True, "coarse") for n in (4, 8)]
    (batch,) = decide(history, params).tiers
    assert batch.max_users == 8 and batch.users_range is None
    assert batch.binding == "the largest user count measured (a fixed search tries nothing above it)"
