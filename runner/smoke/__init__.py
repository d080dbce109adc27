"""Smoke checks against the started engine, before any measured window.

Seed 004 section 5 asks for unscored checks before benchmarking:

1. ``/health``, ``/v1/models`` and ``/metrics`` respond;
2. a short chat completion produces output;
3. a request with prompt + output equal to the largest bucket total succeeds;
4. streamed token IDs and usage counts agree;
5. repeated requests at concurrency one neither grow the engine's memory nor
   trigger preemptions.

Seed 003's checks form an optional second suite (``smoke.seed003``): a reasoning
field when a reasoning parser is configured, a tool call when tools are given and a
tool-call parser is configured, a multi-turn history answered, and the API key
enforced (401 without a key and with a wrong one, 200 with the right one).

"Coherent output" cannot be judged by a program, and a model with random weights
(the generated tiny model) never produces any: the chat check asks only for non-empty
text and a normal finish reason. Every request states ``max_tokens``: vLLM's hidden
default of 16 once made a whole result set invalid (seed 004 §12).

Every check runs even after another fails, so the report names all problems at
once; only a failed /health or /v1/models leaves the rest unrun, since every request
depends on them. A failed check stops the run before the search with
:class:`SmokeError`. Engine memory is the host memory of the engine's process tree
(process backend) or container (docker backend); where runner cannot see it
(backend=external) the growth figure is ``None`` and the check says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx

from runner.config import RunConfig
from runner.engines.base import RunningEngine
from runner.measure.load import auth_headers
from runner.smoke.probe import CheckFailed, CheckFunction, Probe, Skipped, SmokeCheck, SmokeReport
from runner.smoke.seed003 import SEED003_CHECKS
from runner.smoke.seed004 import (
    MEMORY_GROWTH_FLOOR_MIB,
    SEED004_CHECKS,
    StreamTally,
    memory_tolerance_mib,
    tally_stream,
)
from runner.workload.prompt import Prompt

__all__ = [
    "MEMORY_GROWTH_FLOOR_MIB", "SEED003", "SEED004", "SmokeCheck", "SmokeReport",
    "StreamTally", "memory_tolerance_mib", "run_smoke", "tally_stream",
]  # fmt: skip

log = logging.getLogger("runner")

SEED004 = "seed004"
SEED003 = "seed003"
# Every request depends on these: once one fails, the checks after it are not run.
GATES = frozenset({"health", "models"})


def run_smoke(
    engine: RunningEngine,
    config: RunConfig,
    prompts: Sequence[Prompt],
    api_key: str | None,
    *,
    raise_on_failure: bool = True,
) -> SmokeReport:
    """Run seed 004's smoke checks (and seed 003's when ``smoke.seed003``) against ``engine``.

    Raises :class:`SmokeError` naming every failed check unless ``raise_on_failure`` is
    false; then the caller records the report and calls :meth:`SmokeReport.raise_for_failure`.
    """
    if not config.smoke.enabled:
        log.warning("smoke checks disabled (smoke.enabled=false)")
        return SmokeReport(checks=[], enabled=False)
    suites = [(SEED004, SEED004_CHECKS)]
    if config.smoke.seed003:
        suites.append((SEED003, SEED003_CHECKS))
    timeout = httpx.Timeout(config.workload.request_timeout_s, connect=30.0)
    checks: list[SmokeCheck] = []
    with httpx.Client(
        base_url=engine.base_url, headers=auth_headers(api_key), timeout=timeout
    ) as client:
        probe = Probe(engine, config, prompts, client)
        for suite, suite_checks in suites:
            for name, run_check in suite_checks:
                blocker = next((c.name for c in checks if c.name in GATES and not c.passed), None)
                if blocker is not None:
                    detail = f"not run: the {blocker} check failed first"
                    checks.append(SmokeCheck(name, suite, False, detail, 0.0, skipped=True))
                    continue
                checks.append(_timed(name, suite, run_check, probe, api_key))
    report = SmokeReport(checks=checks)
    for check in checks:
        log.info(
            "smoke %s: %s (%.1f s) %s",
            check.name,
            "skipped" if check.skipped else "passed" if check.passed else "FAILED",
            check.seconds,
            check.detail,
        )
    if raise_on_failure:
        report.raise_for_failure()
    return report


def _timed(
    name: str, suite: str, run_check: CheckFunction, probe: Probe, api_key: str | None
) -> SmokeCheck:
    started = time.monotonic()
    passed, skipped, figures = True, False, {}
    try:
        detail, figures = run_check(probe, api_key)
    except Skipped as exc:
        detail, skipped = f"skipped: {exc}", True
    except CheckFailed as exc:
        passed, detail, figures = False, exc.detail, exc.figures
    except httpx.HTTPError as exc:
        passed, detail = False, f"the request failed ({type(exc).__name__}: {exc})"
    except (ValueError, KeyError, IndexError, TypeError) as exc:  # not the JSON vLLM documents
        passed, detail = False, f"the answer could not be read ({type(exc).__name__}: {exc})"
    return SmokeCheck(
        name=name,
        suite=suite,
        passed=passed,
        detail=detail,
        seconds=round(time.monotonic() - started, 3),
        figures=figures,
        skipped=skipped,
    )

