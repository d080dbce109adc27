"""How the capacity is searched and judged: the ``search/`` and ``slo/`` groups."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, field_validator, model_validator

from runner.config.base import Strict


class SearchBase(Strict):
    """What every search kind has: the window protocol (seed 004 §7)."""

    window_s: float = Field(default=300.0, gt=0)
    warmup_s: float = Field(default=30.0, ge=0)
    drain_timeout_s: float = Field(default=600.0, gt=0)
    metrics_interval_s: float = Field(default=1.0, gt=0)


class BracketSearch(SearchBase):
    """Seed 004 §9's bracket-and-refine search for the best user count."""

    kind: Literal["bracket"]
    start_users: int = Field(default=7, ge=1)
    max_users: int = Field(default=1024, ge=1)
    screening_window_s: float | None = Field(default=None, gt=0)
    confirm_repeats: int = Field(default=3, ge=0)
    coarse_margin_tok_s: float = Field(default=0.5, ge=0)
    negligible_gain_pct: float = Field(default=2.0, ge=0)
    neighbourhood: int = Field(default=2, ge=0)


class FixedSearch(SearchBase):
    """One window per listed user count, in order: no search."""

    kind: Literal["fixed"]
    users: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)


# How concurrency is searched (``search/``), told apart by ``kind``.
Search = Annotated[BracketSearch | FixedSearch, Field(discriminator="kind")]


TierMetric = Literal[
    "min_user_tok_s", "ttft_p99_ms", "itl_p99_ms", "tpot_p99_ms", "request_latency_p99_ms"
]


class Tier(Strict):
    """One SLO tier (``slo.tiers``): a name and any of a per-user floor and latency
    ceilings, all of which a user count must meet to count for the tier."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    min_user_tok_s: float | None = Field(default=None, gt=0)
    ttft_p99_ms: float | None = Field(default=None, gt=0)
    itl_p99_ms: float | None = Field(default=None, gt=0)
    tpot_p99_ms: float | None = Field(default=None, gt=0)
    request_latency_p99_ms: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _has_a_limit(self) -> Tier:
        if not self.limits():
            raise ValueError(
                f"tier {self.name!r} sets no limit; give it at least one of "
                f"{', '.join(get_args(TierMetric))}"
            )
        return self

    def limits(self) -> list[tuple[TierMetric, float]]:
        """The tier's constraints, as (figure, limit), in schema order."""
        return [
            (metric, value)
            for metric in get_args(TierMetric)
            if (value := getattr(self, metric)) is not None
        ]


class SLO(Strict):
    """The service-level floor every user must meet, and optional tiers answered by
    the same search."""

    min_user_tok_s: float = Field(default=15.0, gt=0)
    audit_tolerance_pct: float = Field(default=1.0, gt=0)
    # Above this event-loop lag p99 the client stamped and dispatched late: invalid.
    # None: one token gap at the floor (1000 / min_user_tok_s, 67 ms at 15 tok/s).
    client_max_loop_lag_ms: float | None = Field(default=None, gt=0)
    # A window whose users had a request in flight less than this share of it (each
    # user, dispatch to last byte) measured less load than its N: invalid.
    min_in_flight_pct: float = Field(default=97.0, gt=0, le=100)
    tiers: list[Tier] = Field(default_factory=list)

    @field_validator("tiers")
    @classmethod
    def _unique_names(cls, tiers: list[Tier]) -> list[Tier]:
        names = [tier.name for tier in tiers]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"tier names must be unique; repeated: {', '.join(repeated)}")
        if "default" in names:
            # The default floor's answer goes by that name in capacity.json and MLflow.
            raise ValueError(
                "'default' names the default floor's answer; give the tier another name"
            )
        return tiers

    @property
    def max_loop_lag_ms(self) -> float:
        return self.client_max_loop_lag_ms or 1000.0 / self.min_user_tok_s
