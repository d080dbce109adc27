"""The knobs of the search, resolved from the run configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from runner.config import SLO, FixedSearch, Search
from runner.search.types import Constraint, Objective

DEFAULT = "default"


@dataclass(frozen=True)
class SearchParams:
    """The knobs of the search, with the floors already resolved.

    ``tiers`` are the SLO tiers the same windows answer besides the default floor;
    empty (the default) is the single-floor search of seed 004 §9.
    """

    kind: Literal["bracket", "fixed"] = "bracket"
    users: tuple[int, ...] = ()
    start_users: int = 7
    max_users: int = 1024
    floor_tok_s: float = 15.0
    coarse_margin_tok_s: float = 0.5
    negligible_gain_pct: float = 2.0
    confirm_repeats: int = 3
    neighbourhood: int = 2
    screening: bool = False
    tiers: tuple[Objective, ...] = ()

    @property
    def coarse_floor_tok_s(self) -> float:
        return self.floor_tok_s + self.coarse_margin_tok_s

    @property
    def default(self) -> Objective:
        return Objective(
            DEFAULT, (Constraint("min_user_tok_s", self.floor_tok_s),), goal="throughput"
        )

    @property
    def objectives(self) -> tuple[Objective, ...]:
        """The default floor first, then every tier in the order configured."""
        return (self.default, *self.tiers)

    def coarse_limit(self, constraint: Constraint) -> float:
        """A coarse window must clear each limit by the same share as the default
        floor's margin (15.5 against 15.0: 3.3%); a ceiling is lowered by it."""
        share = self.coarse_margin_tok_s * (constraint.limit / self.floor_tok_s)
        if constraint.is_floor:
            return constraint.limit + share
        return constraint.limit / (1 + self.coarse_margin_tok_s / self.floor_tok_s)

    @classmethod
    def from_config(cls, search: Search, slo: SLO) -> SearchParams:
        tiers = tuple(
            Objective(tier.name, tuple(Constraint(metric, limit) for metric, limit in tier.limits()))
            for tier in slo.tiers
        )
        if isinstance(search, FixedSearch):
            return cls(
                kind="fixed", users=tuple(search.users), floor_tok_s=slo.min_user_tok_s,
                tiers=tiers,
            )  # fmt: skip
        return cls(
            kind="bracket",
            start_users=search.start_users,
            max_users=search.max_users,
            floor_tok_s=slo.min_user_tok_s,
            coarse_margin_tok_s=search.coarse_margin_tok_s,
            negligible_gain_pct=search.negligible_gain_pct,
            confirm_repeats=search.confirm_repeats,
            neighbourhood=search.neighbourhood,
            screening=search.screening_window_s is not None,
            tiers=tiers,
        )
