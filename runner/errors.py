"""Every error runner raises on purpose.

    RunnerError                 anything a user can cause or fix
    +-- ConfigError             the composed config is invalid (before any engine starts)
    +-- PreflightError          the host, GPU or image is not what the config says
    +-- EngineError             the engine could not start, died, or misreports itself
    |   +-- EngineStartError    it never became ready
    |   +-- EngineFlagError     a flag the pinned image does not accept
    |   +-- PrecisionMismatch   it runs another precision than the one asked for
    |   +-- SmokeError          it failed a check run before any measured window
    +-- WorkloadError           prompts could not be built to the exact token counts
    +-- MeasurementError        a window could not be measured (metrics unreadable, ...)
    +-- ResultsError            the results folder could not be written or read
    +-- TrackingError           MLflow could not record the run

The entry point turns a RunnerError into one paragraph and a non-zero exit.
Library exceptions are translated at the boundary and re-raised ``from exc``.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error runner raises for a user to read."""

    exit_code = 2


class ConfigError(RunnerError):
    """The composed configuration breaks a rule; nothing has started."""


class PreflightError(RunnerError):
    """The machine, GPU or image does not match the configuration."""


class EngineError(RunnerError):
    """The engine failed to start, died, or reported something unexpected."""

    exit_code = 3


class EngineStartError(EngineError):
    """The engine exited or timed out before it answered /health."""


class EngineFlagError(EngineError):
    """An engine flag is unknown to (or rejected by) the pinned image."""


class PrecisionMismatch(EngineError):
    """The engine runs another KV dtype or quantization than the config asks for."""


class SmokeError(EngineError):
    """The engine failed a smoke check, so no window is measured (seed 004 §5)."""


class WorkloadError(RunnerError):
    """The workload could not be built as specified."""


class MeasurementError(RunnerError):
    """A measurement window could not be carried out."""

    exit_code = 3


class ResultsError(RunnerError):
    """The results folder (rows, details, benchmark row) could not be written or read."""


class TrackingError(RunnerError):
    """MLflow could not record the run (store unreachable, locked, or refusing a value)."""
