"""What a run ends with: the answers it found, or the benchmark row it measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from runner.measure.benchmark import BenchmarkRow
from runner.output.answers import Capacity, TierAnswer


@dataclass(frozen=True)
class RunSummary:
    """One run's outcome, written to ``manifest.json`` and returned by
    :func:`runner.run.pipeline.execute`. Figures that do not apply are ``None``.

    A search's ``best_*`` figures are the default floor's answer; ``capacity`` holds
    every answer (the default floor's and each SLO tier's) with its range of N, its
    95% intervals and its cost, and the flags on the curve."""

    kind: Literal["search", "benchmark", "dry_run"]
    run_id: str
    config_id: str
    family: str
    results_dir: str
    best_users: int | None = None
    median_aggregate_tok_s: float | None = None
    min_user_tok_s: float | None = None
    mean_user_tok_s: float | None = None
    decision: str | None = None
    windows: int = 0
    engine_minutes: float | None = None
    wall_minutes: float | None = None
    floor_tok_s: float | None = None
    finished_utc: str | None = None
    flags: str | None = None  # a dry run: what the engine's flags were checked against
    benchmark: BenchmarkRow | None = None
    capacity: Capacity | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def users_range(self) -> tuple[int, int | None] | None:
        """The default floor's boundary range of N; None where the windows give none."""
        return self.capacity.users_range if self.capacity is not None else None

    @property
    def curve_flags(self) -> tuple[str, ...]:
        """A cliff or a non-monotonic curve the search saw; empty when none."""
        return self.capacity.flags if self.capacity is not None else ()

    @property
    def tiers(self) -> tuple[TierAnswer, ...]:
        """Each SLO tier's answer, in the order configured; empty without tiers."""
        return self.capacity.tiers if self.capacity is not None else ()

    @property
    def objective(self) -> float | None:
        """The figure a sweep or tuner maximises: the decision's median aggregate tok/s."""
        return self.median_aggregate_tok_s
