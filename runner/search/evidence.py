"""What several windows say together: pooled figures, draws, local curve fits, cliffs.

Each window may carry 95% intervals (:class:`~runner.search.types.Interval`) for its
aggregate and its slowest user's rate. Where they are there, windows are pooled by
inverse variance, two user counts are a draw when their intervals overlap, and a
figure at a user count is read off a local fit of log(figure) on log(users) through
every nearby window: past saturation the per-user rate falls about as c/N, so the
fit is close to a line there, and it lets the windows at 30 and 32 users speak
about 31. Without intervals (rows written before runner measured them) the fixed
``negligible_gain_pct`` tolerance decides draws, as it always did.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from runner.measure.uncertainty import Z95
from runner.search.types import Interval, Metric, Observation

Z_ONE_SIDED = 1.644854  # one-sided 95%: "meets the floor" is a one-sided claim
# Windows this far away (a factor in users) still inform a fit, with falling weight.
FIT_SPAN = 1.5
# No interval is narrower than this share of its figure: a noiseless simulated window
# would otherwise get an infinite weight.
MIN_RELATIVE_SE = 1e-4
# A cliff: the slowest user's rate falls faster than N^-CLIFF_POWER between two
# adjacent user counts (1/N is saturation, 1/N^2 a falling aggregate), beyond noise.
CLIFF_POWER = 3.0


@dataclass(frozen=True)
class Pooled:
    """One user count's windows taken together (for one figure)."""

    users: int
    estimate: float
    interval: Interval | None
    windows: int


@dataclass(frozen=True)
class Fit:
    """log(figure) at one user count, from a local fit, and its standard error."""

    users: int
    log_value: float
    se: float
    slope: float = 0.0  # d log(figure) / d log(users); 0 where there is no slope
    slope_se: float = math.inf
    scatter: float = 1.0  # weighted residual variance over what the intervals allow

    @property
    def value(self) -> float:
        return math.exp(self.log_value)

    def bound(self, z: float) -> float:
        """``value`` moved ``z`` standard errors (negative: down)."""
        return math.exp(min(700.0, max(-700.0, self.log_value + z * self.se)))


@dataclass(frozen=True)
class Cliff:
    """The slowest user's rate collapses between two adjacent measured counts."""

    below: int
    above: int
    below_tok_s: float
    above_tok_s: float


def relative_se(value: float, interval: Interval | None) -> float | None:
    """The standard error of log(value) a 95% interval implies."""
    if interval is None or value <= 0:
        return None
    return max(interval.half_width / (Z95 * value), MIN_RELATIVE_SE)


def has_intervals(windows: Iterable[Observation], metric: Metric) -> bool:
    """Whether there are windows and every one carries an interval for ``metric``."""
    seen = False
    for obs in windows:
        if obs.interval(metric) is None:
            return False
        seen = True
    return seen


def pool_aggregate(users: int, windows: Sequence[Observation], median: bool = True) -> Pooled:
    """The count's aggregate: the median of its windows (seed 004 §9.8; the mean when
    ``median`` is false), with the inverse-variance pooled interval when every
    window has one."""
    values = [obs.aggregate_tok_s for obs in windows]
    centre_value = float(np.median(values) if median else np.mean(values))
    ses = [relative_se(obs.aggregate_tok_s, obs.aggregate_ci) for obs in windows]
    if not windows or any(se is None for se in ses):
        return Pooled(users, centre_value, None, len(windows))
    return Pooled(users, centre_value, _pooled_interval(values, ses), len(windows))


def _pooled_interval(values: Sequence[float], ses: Sequence[float | None]) -> Interval:
    """The inverse-variance pooled 95% interval of windows at one count (in log terms),
    widened when the windows disagree beyond their own intervals.

    Windows minutes apart on one engine can differ by more than each window's
    interval says (the engine's pace drifts): two 30 s windows at 322 users on the
    CPU engine read the slowest user at 16.65 and 16.16 tok/s, with intervals 0.21
    and 0.33 tok/s wide. Where the windows' scatter is beyond chance (their
    chi-square above its 95th percentile), the interval is scaled by the square root
    of the reduced chi-square and states the spread the windows show; scatter within
    chance leaves it as pooled.
    """
    centre, half, scale = _pooled_log(values, ses)
    return _log_interval(centre, half * scale)


def median_interval(windows: Sequence[Observation]) -> Interval | None:
    """A 95% interval for the median of the windows' aggregates, the figure an answer
    reports (seed 004 §9.8), centred on it.

    The pooled interval is centred on the inverse-variance mean, which leans to the
    narrower window: at 240 users two windows read 5,521 (+-4.6%) and 5,269 tok/s
    (+-1.6%), and the pooled 5,215-5,378 left out their median, 5,395. This one has
    the spread of the plain mean of the windows (the median's, about 1.25 times it,
    from three windows on), widened like the pooled one by scatter beyond chance.
    """
    values = [obs.aggregate_tok_s for obs in windows]
    ses = [relative_se(obs.aggregate_tok_s, obs.aggregate_ci) for obs in windows]
    if not windows or any(se is None for se in ses) or min(values) <= 0:
        return None
    if len(windows) == 1:
        return windows[0].aggregate_ci
    known = [se for se in ses if se is not None]
    half = Z95 * math.sqrt(sum(se**2 for se in known)) / len(known)
    if len(known) >= 3:
        half *= math.sqrt(math.pi / 2)
    half *= _pooled_log(values, ses)[2]  # the scatter's widening, if any
    return _log_interval(math.log(float(np.median(values))), half)


def _log_interval(centre: float, half: float) -> Interval:
    return Interval(math.exp(centre - half), math.exp(centre + half))


def _pooled_log(values: Sequence[float], ses: Sequence[float | None]) -> tuple[float, float, float]:
    """In log terms: the inverse-variance centre, the pooled 95% half-width, and the
    factor by which the windows' scatter beyond chance widens it (1 within chance)."""
    weights = np.array([1 / se**2 for se in ses if se is not None])
    logs = np.log(np.maximum(np.asarray(values, dtype=float), 1e-12))
    centre, chi_square = _chi_square(logs, weights)
    half = Z95 / math.sqrt(weights.sum())
    dof = len(logs) - 1
    scale = 1.0
    if dof >= 1:
        excess = chi_square / dof
        if excess > _chi2_95(dof) / dof:
            scale = math.sqrt(excess)
    return centre, half, scale


def _chi_square(logs: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """The inverse-variance centre of ``logs`` and their weighted squared deviations
    from it (chi-square with one degree of freedom fewer than there are values)."""
    centre = float(np.sum(weights * logs) / weights.sum())
    return centre, float(np.sum(weights * (logs - centre) ** 2))


def drift(groups: Iterable[Sequence[Observation]], metric: Metric) -> float:
    """How far windows at one count scatter beyond their own intervals, as a standard
    deviation in log terms (0 when they do not, beyond chance).

    A window's interval speaks for its own seconds; the engine's pace can move
    between windows minutes apart by more than that (two 30 s windows at 56 users on
    the CPU engine read 5,619 and 4,805 tok/s, each within 5% of its figure). Over
    every count measured more than once, the between-window variance is estimated
    by the method of moments (DerSimonian-Laird), and only where the windows'
    chi-square about their counts' means is beyond its 95th percentile: windows
    that scatter as their intervals say leave every interval as it is.
    """
    q = dof = spread = 0.0
    for windows in groups:
        points = [
            (math.log(value), se)
            for obs in windows
            if (value := obs.value(metric))
            and (se := relative_se(value, obs.interval(metric))) is not None
        ]
        if len(points) < 2:
            continue
        w = np.array([1 / p[1] ** 2 for p in points])
        q += _chi_square(np.array([p[0] for p in points]), w)[1]
        dof += len(points) - 1
        spread += float(w.sum() - np.sum(w**2) / w.sum())
    if dof == 0 or spread <= 0 or q <= _chi2_95(int(dof)):
        return 0.0
    return math.sqrt((q - dof) / spread)


def widen(obs: Observation, metric: Metric, tau: float) -> Interval | None:
    """``obs``'s interval for ``metric`` with the between-window scatter ``tau`` (log
    terms) added to each side in quadrature. The drift moves a window either way, so
    it widens both sides alike: the slowest user's interval, which starts at the
    window's figure (its truth lies above a minimum that reads low), gains a low side."""
    interval, value = obs.interval(metric), obs.value(metric)
    if interval is None or not value or tau <= 0:
        return interval
    spread = Z95 * tau * value
    return Interval(
        max(0.0, value - math.hypot(value - interval.low, spread)),
        value + math.hypot(interval.high - value, spread),
    )


def draw(a: Pooled, b: Pooled, tolerance_pct: float) -> bool:
    """Two counts' aggregates are a draw: their intervals are too wide to tell them
    apart, or without intervals they lie within ``tolerance_pct`` of the higher one.

    "Too wide" is the 95% interval of their difference holding zero. That is the
    overlap of intervals sized for it (84% each when the two are equally sure);
    two 95% intervals overlap up to a difference of about 2.8 standard errors, and
    a draw that wide would hand the larger count throughput it does not have.
    """
    if a.interval is not None and b.interval is not None:
        se_a, se_b = (relative_se(p.estimate, p.interval) for p in (a, b))
        if se_a is not None and se_b is not None:
            difference = abs(math.log(a.estimate / b.estimate))
            return difference <= Z95 * math.sqrt(se_a**2 + se_b**2)
        return a.interval.overlaps(b.interval)
    top = max(a.estimate, b.estimate)
    return min(a.estimate, b.estimate) >= top * (1 - tolerance_pct / 100)


def clearly_below(a: Pooled, b: Pooled, tolerance_pct: float) -> bool:
    """``a`` trails ``b`` beyond noise: a's interval lies wholly under b's, or without
    intervals a trails by more than twice the tolerance."""
    if a.interval is not None and b.interval is not None:
        return a.estimate < b.estimate and not draw(a, b, tolerance_pct)
    return a.estimate < b.estimate * (1 - 2 * tolerance_pct / 100)


def local_fit(windows: Sequence[Observation], metric: Metric, users: int) -> Fit | None:
    """log(metric) at ``users`` from a kernel-weighted local line in log(users).

    Only windows with an interval and a positive figure inform it, weighted by
    inverse variance times a tricube kernel of their distance in log(users) (nothing
    beyond a factor of :data:`FIT_SPAN`). With a single user count in reach there is
    no slope: the fit is that count's pooled figure, and only at that count. The
    standard error is inflated when the windows scatter more than their intervals
    say (a curve that is not locally a power law, intervals too narrow).
    """
    x0 = math.log(users)
    xs, ys, variances, kernel = [], [], [], []
    for obs in windows:
        value = obs.value(metric)
        se = relative_se(value, obs.interval(metric)) if value else None
        if value is None or se is None:
            continue
        distance = abs(math.log(obs.users) - x0) / math.log(FIT_SPAN)
        if distance >= 0.95:
            continue
        xs.append(math.log(obs.users) - x0)
        ys.append(math.log(value))
        variances.append(se**2)
        kernel.append((1 - distance**3) ** 3)
    if not xs:
        return None
    x, y, var, k = map(np.asarray, (xs, ys, variances, kernel))
    w = k / var
    design = np.column_stack([np.ones_like(x), x])
    normal = design.T @ (design * w[:, None])
    if np.ptp(x) == 0 or np.linalg.cond(normal) > 1e12:
        here = x == 0
        if not here.any():
            return None
        return Fit(
            users,
            float(np.sum(y[here] / var[here]) / np.sum(1 / var[here])),
            float(1 / math.sqrt(np.sum(1 / var[here]))),
        )
    inverse = np.linalg.inv(normal)
    beta = inverse @ (design.T @ (w * y))
    # Sandwich: the kernel weights are not the inverse variances.
    middle = design.T @ (design * (w**2 * var)[:, None])
    se = math.sqrt(float((inverse @ middle @ inverse)[0, 0]))
    slope_se = math.sqrt(float((inverse @ middle @ inverse)[1, 1]))
    residual = y - design @ beta
    dof = len(x) - 2
    scatter = 1.0
    if dof >= 2:
        scatter = float(np.sum(k * residual**2 / var) / np.sum(k) * len(x) / dof)
        se *= math.sqrt(max(1.0, scatter))
        slope_se *= math.sqrt(max(1.0, scatter))
    return Fit(users, float(beta[0]), se, float(beta[1]), slope_se, scatter)


def pooled_rates(windows: Iterable[Observation]) -> dict[int, Pooled]:
    """The slowest user's rate per count, over valid windows: inverse-variance
    pooled when every window has an interval, the mean otherwise."""
    grouped: dict[int, list[Observation]] = {}
    for obs in windows:
        if obs.valid and not obs.oom:
            grouped.setdefault(obs.users, []).append(obs)
    pooled = {}
    for users, group in grouped.items():
        rates = [obs.min_user_tok_s for obs in group]
        ses = [relative_se(obs.min_user_tok_s, obs.min_user_ci) for obs in group]
        if any(se is None for se in ses) or min(rates) <= 0:
            pooled[users] = Pooled(users, float(np.mean(rates)), None, len(group))
            continue
        centre, half, scale = _pooled_log(rates, ses)
        interval = _log_interval(centre, half * scale)
        pooled[users] = Pooled(users, math.exp(centre), interval, len(group))
    return pooled


def _chi2_95(dof: int) -> float:
    """The 95th percentile of chi-square with ``dof`` degrees of freedom
    (Wilson-Hilferty; 3.75 for one, where the exact figure is 3.84)."""
    a = 2 / (9 * dof)
    return dof * (1 - a + Z_ONE_SIDED * math.sqrt(a)) ** 3


def find_cliffs(rates: dict[int, Pooled]) -> list[Cliff]:
    """Adjacent measured counts between which the slowest user collapses: the rate
    falls faster than N^-CLIFF_POWER, beyond noise."""
    cliffs = []
    counts = sorted(rates)
    for low, high in pairwise(counts):
        a, b = rates[low], rates[high]
        steepest = (low / high) ** CLIFF_POWER
        if a.interval is not None and b.interval is not None:
            collapsed = b.interval.high < a.interval.low * steepest
        else:
            collapsed = b.estimate < 0.9 * a.estimate * steepest
        if collapsed:
            cliffs.append(Cliff(low, high, a.estimate, b.estimate))
    return cliffs


def merge_cliffs(cliffs: Sequence[Cliff]) -> list[Cliff]:
    """Cliffs that follow one another (36 to 37 to 38) as one (36 to 38)."""
    merged: list[Cliff] = []
    for cliff in cliffs:
        if merged and merged[-1].above == cliff.below:
            merged[-1] = Cliff(
                merged[-1].below, cliff.above, merged[-1].below_tok_s, cliff.above_tok_s
            )
        else:
            merged.append(cliff)
    return merged


def non_monotonic(
    aggregates: dict[int, Pooled], rates: dict[int, Pooled], tolerance_pct: float
) -> list[str]:
    """What bends the wrong way: the aggregate falling and then rising again, or the
    slowest user getting faster with more users, beyond noise."""
    notes = []
    counts = sorted(aggregates)
    for i, middle in enumerate(counts[1:-1], 1):
        before = max(counts[:i], key=lambda n: aggregates[n].estimate)
        after = max(counts[i + 1 :], key=lambda n: aggregates[n].estimate)
        if clearly_below(aggregates[middle], aggregates[before], tolerance_pct) and clearly_below(
            aggregates[middle], aggregates[after], tolerance_pct
        ):
            notes.append(
                f"the aggregate dips at {middle} users ({aggregates[middle].estimate:.1f} tok/s) "
                f"between {before} and {after} users"
            )
            break
    ordered = sorted(rates)
    for low, high in pairwise(ordered):
        if clearly_below(rates[low], rates[high], tolerance_pct):
            notes.append(
                f"the slowest user is faster at {high} users ({rates[high].estimate:.2f} tok/s) "
                f"than at {low} ({rates[low].estimate:.2f} tok/s)"
            )
            break
    return notes
