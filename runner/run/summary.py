"""What a run ends with: the answer it found, or the benchmark row it measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from runner.measure.benchmark import BenchmarkRow


@dataclass(frozen=True)
class RunSummary:
    """One run's outcome, written to ``manifest.json`` and returned by
    :func:`runner.run.pipeline.execute`. Figures that do not apply are ``None``."""

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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def objective(self) -> float | None:
        """The figure a sweep or tuner maximises: the decision's median aggregate tok/s."""
        return self.median_aggregate_tok_s
