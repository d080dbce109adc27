"""Throughput curves modelled on how a serving engine behaves, to try the search on
shapes it was not written against.

:mod:`runner.search.simulator`'s shapes are drawn to exercise the search's rules;
these are drawn from an engine model instead and know nothing of the search. N
persistent users (seed 004 §6: zero think time, seven context buckets round-robin,
512 output tokens) share one engine in steady state:

* a decode step takes ``step_ms`` plus ``kv_ms_per_ktok`` per thousand tokens of
  context in the running batch, so it grows with the batch;
* every prompt is prefilled at ``prefill_ktok_s`` thousand tokens a second, and
  prefill chunks share the steps with decoding (chunked prefill): the busier the
  prefill, the longer each step and the longer each prompt waits. A user's request
  is its prefill plus 512 steps, so a 30,000-token user is slower than a 1,000-token
  one and is the slowest user;
* past ``kv_capacity_ktok`` of KV cache the scheduler preempts: the slowest user
  collapses and the extra users add nothing.

Three families, drawn from parameter ranges of 8B-120B models on one or two
datacentre GPUs, each stressing one of the three:

decode_bound   a large model and small prefill load: step time decides, and the
               aggregate still rises where the floor binds.
prefill_bound  fast decoding, slow prefill: long-context users starve first and
               the aggregate saturates.
kv_limited     either of the above with a KV cache that fills before the floor
               binds: a cliff.

Window noise is gaussian on the aggregate and on the slowest user's rate
(``noise_pct`` on full windows, ``screening_noise_pct`` on screening windows).
``drift_pct`` (0 unless set) moves the engine's pace between windows: both figures by
one gaussian factor that the windows' intervals do not show, as the CPU engine's
windows minutes apart disagree beyond theirs.
The true figures are the steady-state ones, so a search's answer can be scored
against the best aggregate whose slowest user truly meets the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runner.search.types import Interval, Observation

FAMILIES = ("decode_bound", "prefill_bound", "kv_limited")
BUCKETS = (1000, 2000, 4000, 8000, 16000, 24000, 30000)
OUTPUT_TOKENS = 512
_PROMPTS = np.array(BUCKETS) - OUTPUT_TOKENS


@dataclass(frozen=True)
class SteadyState:
    """What N users get from the engine, without noise."""

    aggregate_tok_s: float
    min_user_tok_s: float
    ttft_p99_ms: float
    itl_p99_ms: float
    request_latency_p99_ms: float
    step_ms: float  # a decode step, prefill chunks included
    prefill_ms: tuple[float, ...]  # each user's wait for its prompt's prefill


@dataclass(frozen=True)
class ServingCurve:
    """One engine and workload; :meth:`state` gives the truth at any user count."""

    family: str
    step_ms: float
    kv_ms_per_ktok: float
    prefill_ktok_s: float
    kv_capacity_ktok: float | None
    chunk_tokens: int = 2048
    noise_pct: float = 1.5
    screening_noise_pct: float = 3.5
    oom_users: int | None = None
    drift_pct: float = 0.0

    def state(self, users: int) -> SteadyState:
        prompts = _PROMPTS[np.arange(users) % len(BUCKETS)]
        held = prompts + OUTPUT_TOKENS / 2  # KV held on average while a request runs
        prefill_tok_ms = self.prefill_ktok_s  # thousand tokens/s is tokens per ms
        decode_ms = self.step_ms + self.kv_ms_per_ktok * float(held.sum()) / 1000
        # Prefill chunks take a share ``busy`` of the engine's time, stretching every
        # step and every prompt's wait by 1 / (1 - busy); the prefill load that
        # results is (1 - busy) * idle_load, so busy = idle_load / (1 + idle_load).
        unstretched_ms = prompts / prefill_tok_ms + OUTPUT_TOKENS * decode_ms
        idle_load = float((prompts / unstretched_ms).sum() / prefill_tok_ms)
        busy = idle_load / (1 + idle_load)
        step = decode_ms / (1 - busy)
        prefill_ms = prompts / prefill_tok_ms / (1 - busy)
        cycle_ms = unstretched_ms / (1 - busy)
        rates = OUTPUT_TOKENS / cycle_ms * 1000
        aggregate = float(rates.sum())
        slowest = float(rates.min())
        overflow = 0.0
        if self.kv_capacity_ktok is not None:
            overflow = max(0.0, float(held.sum()) / 1000 / self.kv_capacity_ktok - 1)
        if overflow > 0:
            # Preempted requests are recomputed: work done twice, the longest evicted first.
            aggregate /= 1 + 3 * overflow
            slowest *= max(0.05, 1 - 12 * overflow)
        chunk_ms = self.chunk_tokens / prefill_tok_ms
        return SteadyState(
            aggregate_tok_s=aggregate,
            min_user_tok_s=slowest,
            ttft_p99_ms=float(prefill_ms.max() * 1.2),
            itl_p99_ms=float(step + chunk_ms * min(1.0, 4 * busy)),
            request_latency_p99_ms=float(cycle_ms.max() * 1.05),
            step_ms=float(step),
            prefill_ms=tuple(float(ms) for ms in prefill_ms),
        )

    def aggregate_tok_s(self, users: int) -> float:
        return self.state(users).aggregate_tok_s

    def min_user_tok_s(self, users: int) -> float:
        return self.state(users).min_user_tok_s

    def optimum(self, floor_tok_s: float, max_users: int) -> int | None:
        """The count with the highest true aggregate whose slowest user meets the
        floor. Below seven users the long-context buckets are missing and the
        workload is another one (seed 004 §9.1), so those counts compete only when
        seven users miss the floor."""
        meeting = []
        for users in range(1, max_users + 1):
            rate = self.min_user_tok_s(users)
            if rate >= floor_tok_s and (self.oom_users is None or users < self.oom_users):
                meeting.append(users)
            elif users > len(BUCKETS) and rate < floor_tok_s / 2:
                break  # the slowest user only slows down from here
        whole = [users for users in meeting if users >= len(BUCKETS)]
        if len(BUCKETS) in meeting:
            meeting = whole
        return max(meeting, key=self.aggregate_tok_s, default=None)

    def measure(
        self,
        users: int,
        window_s: float,
        phase: str,
        rng: np.random.Generator,
        screening: bool = False,
    ) -> Observation:
        truth = self.state(users)
        spread = (self.screening_noise_pct if screening else self.noise_pct) / 100
        aggregate, slowest = truth.aggregate_tok_s, truth.min_user_tok_s
        noise = 1 + spread * rng.standard_normal(2)
        if self.drift_pct:
            # The engine's pace drifts between windows by more than any one window
            # can see: both figures move together, their intervals with them.
            noise *= 1 + self.drift_pct / 100 * rng.standard_normal()
        return Observation(
            users=users,
            aggregate_tok_s=float(aggregate * noise[0]),
            min_user_tok_s=float(slowest * noise[1]),
            valid=True,
            phase=phase,
            ttft_p99_ms=truth.ttft_p99_ms,
            itl_p99_ms=truth.itl_p99_ms,
            request_latency_p99_ms=truth.request_latency_p99_ms,
            aggregate_ci=Interval.around(aggregate * noise[0], spread),
            min_user_ci=Interval.around(slowest * noise[1], spread),
            screening=screening,
        )


def draw_serving_curve(family: str, seed: int, noise_pct: float = 1.5) -> ServingCurve:
    """A curve of ``family`` with engine parameters drawn from ``seed``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
    rng = np.random.default_rng([seed, 1000 + FAMILIES.index(family)])
    log_uniform = lambda low, high: float(math.exp(rng.uniform(math.log(low), math.log(high))))
    screening = noise_pct * 3.5 / 1.5
    if family == "decode_bound":
        curve = ServingCurve(
            family,
            step_ms=rng.uniform(15, 40),
            kv_ms_per_ktok=log_uniform(0.01, 0.05),
            prefill_ktok_s=log_uniform(40, 150),
            kv_capacity_ktok=None,
        )
    elif family == "prefill_bound":
        curve = ServingCurve(
            family,
            step_ms=rng.uniform(5, 15),
            kv_ms_per_ktok=log_uniform(0.002, 0.01),
            prefill_ktok_s=log_uniform(5, 30),
            kv_capacity_ktok=None,
        )
    else:
        base = draw_serving_curve(FAMILIES[int(rng.integers(2))], seed + 7919, noise_pct)
        boundary = base.optimum(15.0, 1024) or 1
        held = sum(BUCKETS[i % len(BUCKETS)] - OUTPUT_TOKENS / 2 for i in range(boundary))
        curve = ServingCurve(
            family,
            step_ms=base.step_ms,
            kv_ms_per_ktok=base.kv_ms_per_ktok,
            prefill_ktok_s=base.prefill_ktok_s,
            kv_capacity_ktok=held / 1000 * rng.uniform(0.4, 0.95),
        )
    return ServingCurve(
        **{**curve.__dict__, "noise_pct": noise_pct, "screening_noise_pct": screening}
    )
