"""What runner's concurrency search costs and how close it lands, against seed 004 §9
followed to the letter.

Every procedure runs on the same simulated curves with the same seeds and is charged
engine time per window: warm-up plus the window itself (drain time, the same for all,
is left out). Two sets of curves:

shapes   :mod:`runner.search.simulator`'s four shapes, drawn to exercise the search's
         rules (saturating, kv_cliff, interior_peak, low_capacity); window noise 1.5%
         at 300 s, growing as 1/sqrt(window).
serving  :mod:`runner.search.serving`'s engine model, which knows nothing of the
         search (decode step growing with the batch, long-context users slower, a
         KV-cache limit); 1.5% noise on full windows, 3.5% on screening windows;
         with ``--drift-pct``, an engine whose pace moves between windows by more
         than their intervals show.

literal     every window 300 s; doubling or halving; bisection between the last pass
            and the first fail; every integer within 2 of the peak and of the
            boundary, each measured once more even if measured before; the
            provisional best and its two neighbours three times each; the highest
            median whose windows all meet the floor. Where all three fail, the next
            best is confirmed the same way (the seed says nothing there; this is the
            kinder reading).
no-ci       :func:`runner.search.policy.next_step` on windows without intervals (rows
            written before runner measured them), with 60 s screening windows for
            the doubling: the fixed 2% tolerance, every confirmation window at the
            floor.
runner      the same with each window's 95% intervals.

Columns: mean windows and engine-minutes per search, engine time over the literal's,
how often the answer truly meets the floor and lies within 3% and 5% of the best
aggregate that does (the curve's optimum), and how often the range of boundaries the
decision states (``users_range``) holds the true boundary (the literal procedure states
none), and that range's median width as a share of the true boundary (closed ranges).

    python benchmarks/search_cost.py [--seeds 200] [--serving-seeds 100] [--noise-pct 1.5]
                                     [--drift-pct 0]
    python benchmarks/search_cost.py --cpu [--cpu-noise-pct 11] [--drift-pct 0]

``--cpu`` costs the embedded default (``python -m runner``: tiny model, 2 cores) instead:
saturating curves shaped like the ones measured there (2,200-6,400 tok/s at capacity
across days, the floor binding past 100 users or beyond the 256-user ceiling), window
noise given at a 20 s window, with ``--drift-pct`` an engine whose pace moves between
windows, each window
charged warm-up, window and one second of drain, for ``conf/search/bracket_cpu.yaml``
as it was and as it is.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from runner.search.policy import Observation, SearchParams
from runner.search.serving import FAMILIES, draw_serving_curve
from runner.search.simulator import (
    SHAPES,
    Curve,
    Measurable,
    draw_curve,
    run_policy,
    true_boundary,
)

WINDOW_S = 300.0
SCREENING_WINDOW_S = 60.0
WARMUP_S = 30.0


@dataclass(frozen=True)
class Outcome:
    best_users: int | None
    windows: int
    engine_s: float
    users_range: tuple[int, int | None] | None = None  # the boundary's range, as stated


def literal_search(curve: Measurable, params: SearchParams, seed: int) -> Outcome:
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


def runner_search(
    curve: Measurable, params: SearchParams, seed: int, intervals: bool = True
) -> Outcome:
    trace = run_policy(
        curve,
        params,
        seed,
        window_s=WINDOW_S,
        screening_window_s=SCREENING_WINDOW_S,
        intervals=intervals,
    )
    engine_s = sum(
        WARMUP_S + (SCREENING_WINDOW_S if step.screening else WINDOW_S) for step in trace.steps
    )
    assert trace.decision is not None
    return Outcome(
        trace.decision.best_users, len(trace.steps), engine_s, trace.decision.users_range
    )


PROCEDURES: dict[str, Callable[[Measurable, SearchParams, int], Outcome]] = {
    "literal": literal_search,
    "no-ci": lambda curve, params, seed: runner_search(curve, params, seed, intervals=False),
    "runner": runner_search,
}


@dataclass
class Tally:
    windows: int = 0
    engine_s: float = 0.0
    within_3: int = 0
    within_5: int = 0
    searches: int = 0
    ranges: int = 0
    ranges_held: int = 0
    widths: list[float] = field(default_factory=list)

    def add(self, outcome: Outcome, share: float | None, boundary: int | None) -> None:
        self.windows += outcome.windows
        self.engine_s += outcome.engine_s
        self.within_3 += share is not None and share >= 0.97
        self.within_5 += share is not None and share >= 0.95
        self.searches += 1
        if outcome.users_range is not None and boundary is not None:
            low, high = outcome.users_range
            self.ranges += 1
            self.ranges_held += low <= boundary and (high is None or boundary <= high)
            if high is not None and boundary > 0:
                self.widths.append((high - low) / boundary)

    def row(self, label: str, name: str, literal: Tally) -> str:
        held = f"{self.ranges_held / self.ranges:.0%}" if self.ranges else "n/a"
        width = f"{statistics.median(self.widths):.0%}" if self.widths else "n/a"
        return (
            f"| {label} | {name} | {self.windows / self.searches:.1f} "
            f"| {self.engine_s / 60 / self.searches:.0f} | {self.engine_s / literal.engine_s:.3f} "
            f"| {self.within_3 / self.searches:.0%} | {self.within_5 / self.searches:.0%} "
            f"| {held} | {width} |"
        )


def _share(
    curve: Curve | object, best: int | None, floor: float, optimum: int | None
) -> float | None:
    """The chosen count's true aggregate over the optimum's, if it truly meets the floor."""
    if best is None or optimum is None:
        return 1.0 if best == optimum else None
    if curve.min_user_tok_s(best) < floor:  # type: ignore[attr-defined]
        return None
    return curve.aggregate_tok_s(best) / curve.aggregate_tok_s(optimum)  # type: ignore[attr-defined]


def run_suite(
    label: str, kinds: tuple[str, ...], draw: Callable[[str, int], Measurable], seeds: int
) -> None:
    params = SearchParams(screening=True)
    totals = {name: Tally() for name in PROCEDURES}
    for kind in kinds:
        tallies = {name: Tally() for name in PROCEDURES}
        for seed in range(seeds):
            curve = draw(kind, seed)
            optimum = curve.optimum(params.floor_tok_s, params.max_users)  # type: ignore[attr-defined]
            boundary = true_boundary(curve, params.floor_tok_s, params.max_users)
            for name, procedure in PROCEDURES.items():
                outcome = procedure(curve, params, seed)
                share = _share(curve, outcome.best_users, params.floor_tok_s, optimum)
                tallies[name].add(outcome, share, boundary)
                totals[name].add(outcome, share, boundary)
        for name, tally in tallies.items():
            print(tally.row(kind, name, tallies["literal"]))
    for name, tally in totals.items():
        print(tally.row(f"**all {label}**", name, totals["literal"]))


@dataclass(frozen=True)
class CpuSearch:
    start_users: int
    window_s: float
    screening_window_s: float | None
    warmup_s: float
    confirm_repeats: int
    intervals: bool


CPU_SEARCHES = {
    "before: 20 s windows, no screening, 5 s warm-up, no intervals": CpuSearch(
        7, 20, None, 5, 2, False
    ),
    "before, with intervals": CpuSearch(7, 20, None, 5, 2, True),
    "22 s windows, 6 s screening, 2 s warm-up": CpuSearch(7, 22, 6, 2, 2, True),
    "22 s windows without intervals (what they got near the floor)": CpuSearch(
        7, 22, 6, 2, 2, False
    ),
    "now: 30 s windows, 6 s screening, 2 s warm-up": CpuSearch(7, 30, 6, 2, 2, True),
}
CPU_MAX_USERS = 256  # engine.max_num_seqs in conf/engine/cpu.yaml
CPU_DRAIN_S = 1.0


CPU_CAPACITY_TOK_S = (2200.0, 6400.0)  # the CPU engine's aggregate at capacity, across days


def cpu_curve(seed: int, noise_at_20_s: float, drift_pct: float = 0.0) -> Curve:
    rng = np.random.default_rng([seed, 77])
    return Curve(
        "saturating",
        capacity_tok_s=rng.uniform(*CPU_CAPACITY_TOK_S),
        half_users=rng.uniform(15, 40),
        fairness=rng.uniform(0.8, 1.0),
        noise_pct=noise_at_20_s * (20 / WINDOW_S) ** 0.5,
        drift_pct=drift_pct,
    )


def run_cpu(seeds: int, noise_at_20_s: float, drift_pct: float = 0.0) -> None:
    low, high = CPU_CAPACITY_TOK_S
    print(
        f"{seeds} CPU-like curves ({low:,.0f}-{high:,.0f} tok/s at capacity), window noise "
        f"{noise_at_20_s}% at 20 s, drift {drift_pct}% between windows"
    )
    print(
        "| search config | windows | window seconds, mean | 90th percentile | feasible, within 5% |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name, cpu in CPU_SEARCHES.items():
        params = SearchParams(
            screening=cpu.screening_window_s is not None,
            start_users=cpu.start_users,
            confirm_repeats=cpu.confirm_repeats,
            max_users=CPU_MAX_USERS,
        )
        seconds, windows, close = [], [], 0
        for seed in range(seeds):
            curve = cpu_curve(seed, noise_at_20_s, drift_pct)
            trace = run_policy(
                curve,
                params,
                seed,
                window_s=cpu.window_s,
                screening_window_s=cpu.screening_window_s or cpu.window_s,
                intervals=cpu.intervals,
            )
            spent = sum(
                cpu.warmup_s
                + CPU_DRAIN_S
                + (cpu.screening_window_s if step.screening else cpu.window_s)  # type: ignore[operator]
                for step in trace.steps
            )
            seconds.append(spent)
            windows.append(len(trace.steps))
            optimum = curve.optimum(params.floor_tok_s, CPU_MAX_USERS)
            share = _share(
                curve,
                trace.decision.best_users if trace.decision else None,
                params.floor_tok_s,
                optimum,
            )
            close += share is not None and share >= 0.95
        print(
            f"| {name} | {statistics.fmean(windows):.1f} | {statistics.fmean(seconds):.0f} "
            f"| {np.percentile(seconds, 90):.0f} | {close / seeds:.0%} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="searches per shape")
    parser.add_argument("--serving-seeds", type=int, default=100, help="searches per family")
    parser.add_argument("--noise-pct", type=float, default=1.5)
    parser.add_argument(
        "--drift-pct",
        type=float,
        default=0.0,
        help="serving curves (with --cpu, the CPU curves): the engine's pace moves this much "
        "between windows, unseen by their intervals",
    )
    parser.add_argument("--cpu", action="store_true", help="cost the embedded CPU default")
    parser.add_argument(
        "--cpu-noise-pct", type=float, default=11.0, help="noise of a 20 s CPU window"
    )
    args = parser.parse_args()
    if args.cpu:
        run_cpu(args.seeds, args.cpu_noise_pct, args.drift_pct)
        return
    print(
        f"{args.seeds} seeds per shape, {args.serving_seeds} per serving family; window noise "
        f"{args.noise_pct}% at {WINDOW_S:g} s; serving engines drift {args.drift_pct}% between "
        "windows"
    )
    print(
        "| curves | procedure | windows | engine-min | engine time / literal | within 3% | within 5% "
        "| range holds the boundary | range width |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    run_suite(
        "shapes",
        SHAPES,
        lambda shape, seed: draw_curve(shape, seed, noise_pct=args.noise_pct),
        args.seeds,
    )
    run_suite(
        "serving",
        FAMILIES,
        lambda family, seed: replace(
            draw_serving_curve(family, seed, noise_pct=args.noise_pct), drift_pct=args.drift_pct
        ),
        args.serving_seeds,
    )


if __name__ == "__main__":
    main()
