"""The answers of one search as a file, ``capacity.json``, and as MLflow figures.

:func:`capacity_record` is pure: the :class:`~runner.output.answers.Capacity` of a
search, its config and its names in, a JSON-ready dict out. The run writes it to
``capacity.json`` in the results folder when the search ends (and again when a
finished run is rerun), beside ``report.md``.

``capacity.json`` keys (``null`` where a figure does not apply or is not known):

=====================  ================================================================
``schema``             1: the layout described here
``run_id``             the run, as in ``results.jsonl``
``config_id``          the served engine setup
``family``             the result family (results of two families never share a table)
``hw``                 the hardware profile's name, ``"cpu"`` without one
``gpus``               GPUs the engine uses (``hw.count``); ``null`` on the CPU
``usd_per_hour``       the price the cost figures use (``hw.usd_per_hour``)
``floor_tok_s``        the default per-user floor (``slo.min_user_tok_s``)
``users_range``        the default floor's boundary, ``[low, high]``: the user counts
                       the windows are consistent with ("between 126 and 137");
                       ``high`` is ``null`` where no count measured misses the floor
                       (the boundary is at or above ``low``)
``flags``              notes on the curve: a cliff in the slowest user's rate, a
                       non-monotonic curve; ``[]`` when there are none
``tiers``              one entry per answer: the default floor's first (``name``
                       ``"default"``), then each SLO tier in the order configured
=====================  ================================================================

Each entry of ``tiers``:

=======================  ==============================================================
``name``                 ``"default"`` or the tier's name
``limits``               ``{figure: limit}``, e.g. ``{"min_user_tok_s": 30.0,
                         "ttft_p99_ms": 1000.0}``; floors are minimums, the rest ceilings
``users``                the answer: the default floor's best N (largest aggregate), a
                         tier's most users that meet every limit; ``null``: none did
``aggregate_tok_s``      median aggregate output tok/s of the counted windows at N
``min_user_tok_s``       the slowest user over those windows
``ttft_p99_ms``          the worst TTFT p99 over those windows
``binding``              the limit that stops one user more (tiers only; ``null`` for
                         the default floor, whose N is the best aggregate)
``users_range``          ``[low, high]``: the boundary's range of N (``high`` ``null``:
                         no count measured misses the limits)
``windows``              counted windows at N
``tok_s_per_gpu``        ``aggregate_tok_s / gpus``
``usd_per_mtok``         $ per million output tokens: ``usd_per_hour`` over the output
                         tokens of one hour at ``aggregate_tok_s``
``*_ci95``               ``[low, high]``, the 95% interval of the figure named before
                         ``_ci95`` (aggregate, slowest user, tok/s per GPU, $/Mtok)
``reason``               the decision in a sentence
=======================  ==============================================================

MLflow names: :func:`metric_name` gives ``best_<figure>`` for the default floor
(``best_users``, ``best_aggregate_tok_s``, ...) and ``tier.<name>.<figure>`` for a
tier; an interval is ``<metric>_low`` and ``<metric>_high``, the boundary range
``best_users_low/high`` (``tier.<name>.users_low/high``). A tier's binding limit and
its limits are tags (``tier.<name>.binding``, ``tier.<name>.limits``), the curve's
flags the tag ``curve_flags``.
"""

from __future__ import annotations

from typing import Any

from runner.config import RunConfig
from runner.measure.uncertainty import Interval
from runner.output.answers import Capacity, TierAnswer
from runner.search.params import DEFAULT

CAPACITY_NAME = "capacity.json"
SCHEMA = 1
FLAGS_TAG = "curve_flags"

# The figures of an answer that carry a 95% interval, by their field names.
_WITH_INTERVAL = (
    ("aggregate_tok_s", "aggregate_ci"),
    ("min_user_tok_s", "min_user_ci"),
    ("tok_s_per_gpu", "tok_s_per_gpu_ci"),
    ("usd_per_mtok", "usd_per_mtok_ci"),
)


def metric_name(tier: str, figure: str) -> str:
    """The MLflow metric of ``figure`` in ``tier``'s answer (``"default"``: the floor's)."""
    return f"best_{figure}" if tier == DEFAULT else f"tier.{tier}.{figure}"


def capacity_record(
    capacity: Capacity, config: RunConfig, *, run_id: str, config_id: str, family: str
) -> dict[str, Any]:
    """The ``capacity.json`` record (keys in the module docstring)."""
    return {
        "schema": SCHEMA,
        "run_id": run_id,
        "config_id": config_id,
        "family": family,
        "hw": config.hw.name if config.hw else "cpu",
        "gpus": capacity.gpus,
        "usd_per_hour": capacity.usd_per_hour,
        "floor_tok_s": config.slo.min_user_tok_s,
        "users_range": _pair(capacity.users_range),
        "flags": list(capacity.flags),
        "tiers": [_entry(answer) for answer in capacity.answers],
    }


def capacity_metrics(capacity: Capacity) -> dict[str, float]:
    """Every answer's figures as MLflow metrics; figures not known are left out."""
    metrics: dict[str, float | int | None] = {}
    for answer in capacity.answers:
        name = answer.name
        metrics[metric_name(name, "users")] = answer.users
        if answer.users_range is not None:
            metrics[metric_name(name, "users_low")] = answer.users_range[0]
            if answer.users_range[1] is not None:
                metrics[metric_name(name, "users_high")] = answer.users_range[1]
        metrics[metric_name(name, "ttft_p99_ms")] = answer.ttft_p99_ms
        for figure, field in _WITH_INTERVAL:
            metrics[metric_name(name, figure)] = getattr(answer, figure)
            interval: Interval | None = getattr(answer, field)
            if interval is not None:
                metrics[metric_name(name, f"{figure}_low")] = interval.low
                metrics[metric_name(name, f"{figure}_high")] = interval.high
    return {key: float(value) for key, value in metrics.items() if value is not None}


def capacity_tags(capacity: Capacity) -> dict[str, str]:
    """Each tier's limits and binding limit, and the curve's flags, as MLflow tags."""
    tags = {FLAGS_TAG: "; ".join(capacity.flags) or "none"}
    for answer in capacity.tiers:
        tags[f"tier.{answer.name}.limits"] = answer.limit_labels
        if answer.binding is not None:
            tags[f"tier.{answer.name}.binding"] = answer.binding
    return tags


def _entry(answer: TierAnswer) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": answer.name,
        "limits": {limit.metric: limit.limit for limit in answer.limits},
        "users": answer.users,
        "aggregate_tok_s": answer.aggregate_tok_s,
        "min_user_tok_s": answer.min_user_tok_s,
        "ttft_p99_ms": answer.ttft_p99_ms,
        "binding": answer.binding,
        "users_range": _pair(answer.users_range),
        "windows": answer.windows,
        "tok_s_per_gpu": answer.tok_s_per_gpu,
        "usd_per_mtok": answer.usd_per_mtok,
    }
    for figure, field in _WITH_INTERVAL:
        interval: Interval | None = getattr(answer, field)
        entry[f"{figure}_ci95"] = None if interval is None else [interval.low, interval.high]
    entry["reason"] = answer.reason
    return entry


def _pair(pair: tuple[int, int | None] | None) -> list[int | None] | None:
    return None if pair is None else list(pair)
