"""The concurrency search policy (seed 004 §9): which user count to measure next.

The run loop calls :func:`next_step` with every window measured so far, measures the
:class:`Step` it returns, and stops at ``None``; :func:`decide` then names the best
user count, and with SLO tiers the most users each tier allows. Every choice is
derived from the history alone (no hidden state), so a resumed run that replays its
JSONL rows gets exactly the step it would have got.

One search serves every objective: the default floor (``slo.min_user_tok_s``) and
each tier of ``slo.tiers``. The doubling is shared and runs until every objective
has its bracket; then each objective in turn, the default first, refines and
confirms its own boundary, reading the windows measured for the others too
(:mod:`runner.search.steps` has the phases, :mod:`runner.search.view` the rules of
evidence, :mod:`runner.search.decision` the answers).

Coarse and refine steps pass at ``floor + coarse_margin_tok_s`` (a ceiling lowered
by the same share); a window under a limit, not valid, or out of memory fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from runner.search.decision import Decision, TierDecision, decide
from runner.search.params import SearchParams
from runner.search.steps import coarse_step, objective_step
from runner.search.types import Observation, Phase, Step

__all__ = [
    "Decision",
    "Observation",
    "Phase",
    "SearchParams",
    "Step",
    "TierDecision",
    "decide",
    "next_step",
]


def next_step(history: Sequence[Observation], params: SearchParams) -> Step | None:
    """The next window to measure, or ``None`` when the search is over."""
    if params.kind == "fixed":
        # Counting windows rather than user counts lets a list repeat a user count.
        if len(history) < len(params.users):
            return Step(params.users[len(history)], "coarse", screening=False)
        return None
    step = coarse_step(history, params)
    if step is not None:
        return step
    for objective in params.objectives:
        step = objective_step(history, params, objective)
        if step is not None:
            return step
    return None
