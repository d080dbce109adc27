"""What runner's concurrency search costs, against seed 004 §9 followed to the letter.

Both searches run on the same simulated curves with the same seeds
(:mod:`runner.search.simulator`) and are charged engine time per window: warm-up plus the
window itself (drain time, the same for both, is left out).

literal  every window 300 s; doubling or halving; bisection between the last pass and
         the first fail; every integer within 2 of the peak and of the boundary, each
         measured once more even if measured before; the provisional best and its
         two neighbours three times each; the highest median whose windows all meet
         the floor. Where all three fail, the next best is confirmed the same way (the
         seed says nothing there; this is the kinder reading).
runner   :func:`runner.search.policy.next_step` with 60 s screening windows for the doubling.

Columns: mean windows and engine-minutes per search, runner's engine time over the
literal's (over all seeds, and over the seeds where both chose the same user count),
how often both chose the same count or counts at most one apart, and how often each
landed within one user of the curve's true optimum.

    python benchmarks/search_cost.py [--seeds 200] [--noise-pct 1.5]
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import numpy as np

from runner.search.policy import Observation, SearchParams
from runner.search.simulator import SHAPES, Curve, draw_curve, run_policy

WINDOW_S = 300.0
SCREENING_WINDOW_S = 60.0
WARMUP_S = 30.0


@dataclass(frozen=True)
class Outcome:
    best_users: int | None
    windows: int
    engine_s: float


def literal_search(curve: Curve, params: SearchParams, seed: int) -> Outcome:
    """Seed 004 §9 steps 1-8, every window 300 s, nothing reused or skipped."""
    rng = np.random.default_rng(seed)
    history: list[Observation] = []

    def measure(users: int, phase: str) -> Observation:
        history.append(curve.measure(users, WINDOW_S, phase, rng))
        return history[-1]

    def passes(obs: Observation, floor: float) -> bool:
        return obs.valid and not obs.oom and obs.min_user_tok_s >= floor

    margin_floor = params.coarse_floor_tok_s
    users = min(params.start_users, params.max_users)
    first = measure(users, "coarse")
    hi: int | None
    if passes(first, margin_floor):
        aggregates, negligible = [first.aggregate_tok_s], 0
        while True:
            if users >= params.max_users:
                lo, hi = users, None
                break
            obs = measure(min(2 * users, params.max_users), "coarse")
            if not passes(obs, margin_floor):
                lo, hi = users, obs.users
                break
            gain = (obs.aggregate_tok_s - max(aggregates)) / max(aggregates) * 100
            negligible = negligible + 1 if gain < params.negligible_gain_pct else 0
            aggregates.append(obs.aggregate_tok_s)
            users = obs.users
            if negligible >= 2:
                lo, hi = users, None
                break
    else:
        while True:
            if users == 1:
                return _outcome(None, history)
            obs = measure(max(1, users // 2), "coarse")
            if passes(obs, margin_floor):
                lo, hi = obs.users, users
                break
            users = obs.users
    while hi is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(measure(mid, "refine"), margin_floor):
            lo = mid
        else:
            hi = mid

    def passing_means() -> dict[int, float]:
        by_users: dict[int, list[Observation]] = {}
        for obs in history:
            by_users.setdefault(obs.users, []).append(obs)
        return {
            n: statistics.fmean(o.aggregate_tok_s for o in windows)
            for n, windows in by_users.items()
            if all(passes(o, margin_floor) for o in windows)
        }

    means = passing_means()
    peak = max(means, key=means.__getitem__)
    radius = params.neighbourhood
    scan = set(range(peak - radius, peak + radius + 1))
    if hi is not None:
        scan |= set(range(lo - radius, lo + radius + 1))
    for n in sorted(scan):
        if 1 <= n <= params.max_users:
            measure(n, "refine")
    tried: set[int] = set()
    while True:
        means = {n: a for n, a in passing_means().items() if n not in tried}
        if not means:
            return _outcome(None, history)
        best = max(means, key=means.__getitem__)
        trio = [n for n in (best - 1, best, best + 1) if 1 <= n <= params.max_users]
        confirmed = {
            n: [measure(n, "confirm") for _ in range(params.confirm_repeats)] for n in trio
        }
        tried |= set(trio)
        medians = {
            n: statistics.median(o.aggregate_tok_s for o in windows)
            for n, windows in confirmed.items()
            if all(passes(o, params.floor_tok_s) for o in windows)
        }
        if medians:
            return _outcome(max(medians, key=medians.__getitem__), history)


def _outcome(best_users: int | None, history: list[Observation]) -> Outcome:
    return Outcome(best_users, len(history), len(history) * (WINDOW_S + WARMUP_S))


def runner_search(curve: Curve, params: SearchParams, seed: int) -> Outcome:
    trace = run_policy(
        curve, params, seed, window_s=WINDOW_S, screening_window_s=SCREENING_WINDOW_S
    )
    engine_s = sum(
        WARMUP_S + (SCREENING_WINDOW_S if step.screening else WINDOW_S) for step in trace.steps
    )
    assert trace.decision is not None
    return Outcome(trace.decision.best_users, len(trace.steps), engine_s)


def _near(best: int | None, optimum: int | None) -> bool:
    if best is None or optimum is None:
        return best == optimum
    return abs(best - optimum) <= 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--noise-pct", type=float, default=1.5)
    args = parser.parse_args()
    params = SearchParams(screening=True)
    header = (
        f"{'shape':<14}{'windows lit/run':>17}{'engine-min lit/run':>21}{'ratio':>7}"
        f"{'ratio same':>12}{'same answer':>13}{'±1 apart':>10}{'±1 lit':>8}{'±1 run':>8}"
    )
    print(f"{args.seeds} seeds per shape, window noise {args.noise_pct}% at {WINDOW_S:g} s")
    print(header)
    totals = {"lit": 0.0, "run": 0.0, "lit_same": 0.0, "run_same": 0.0}
    for shape in SHAPES:
        lit_runs, run_runs, optima = [], [], []
        for seed in range(args.seeds):
            curve = draw_curve(shape, seed, noise_pct=args.noise_pct)
            optima.append(curve.optimum(params.floor_tok_s, params.max_users))
            lit_runs.append(literal_search(curve, params, seed))
            run_runs.append(runner_search(curve, params, seed))
        same = [lit.best_users == run.best_users for lit, run in zip(lit_runs, run_runs)]
        lit_s = sum(o.engine_s for o in lit_runs)
        run_s = sum(o.engine_s for o in run_runs)
        lit_same = sum(o.engine_s for o, s in zip(lit_runs, same) if s)
        run_same = sum(o.engine_s for o, s in zip(run_runs, same) if s)
        totals["lit"] += lit_s
        totals["run"] += run_s
        totals["lit_same"] += lit_same
        totals["run_same"] += run_same
        close = statistics.fmean(
            _near(run.best_users, lit.best_users) for lit, run in zip(lit_runs, run_runs)
        )
        near_lit = statistics.fmean(_near(o.best_users, opt) for o, opt in zip(lit_runs, optima))
        near_run = statistics.fmean(_near(o.best_users, opt) for o, opt in zip(run_runs, optima))
        windows = f"{statistics.fmean(o.windows for o in lit_runs):.1f}/"
        windows += f"{statistics.fmean(o.windows for o in run_runs):.1f}"
        minutes = f"{lit_s / 60 / args.seeds:.0f}/{run_s / 60 / args.seeds:.0f}"
        print(
            f"{shape:<14}{windows:>17}{minutes:>21}{run_s / lit_s:>7.2f}"
            f"{run_same / lit_same if lit_same else float('nan'):>12.2f}"
            f"{statistics.fmean(same):>13.0%}{close:>10.0%}{near_lit:>8.0%}{near_run:>8.0%}"
        )
    print(
        f"{'all':<14}{'':>17}{'':>21}{totals['run'] / totals['lit']:>7.2f}"
        f"{totals['run_same'] / totals['lit_same']:>12.2f}"
    )


if __name__ == "__main__":
    main()
