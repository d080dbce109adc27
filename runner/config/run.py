"""Where the engine runs and where results go, and :class:`RunConfig`, which holds every
group of one run."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from runner.config.base import Strict, url_problem
from runner.config.engine import Engine, Hardware, Image, KVCache, Model
from runner.config.search import SLO, Search
from runner.config.workload import Workload
from runner.secret import redact


class Backend(Strict):
    """Where the engine runs (``backend/``)."""

    kind: Literal["process", "docker", "external"]
    url: str | None = None
    startup_timeout_s: float = Field(default=900.0, gt=0)
    shm_size: str | None = "8g"
    ipc_host: bool = False
    hf_cache: str | None = None
    on_engine_fault: Literal["stop", "relaunch"] = "stop"
    python: str | None = None
    # An API key sent over plain http to another host can be read on the way.
    allow_insecure_key: bool = False
    # "raised": runner's session group gets a larger CPU weight while it measures, so
    # an engine in another session cannot hold its load loop off (runner.measure.priority).
    client_priority: Literal["raised", "normal"] = "raised"

    @field_validator("url")
    @classmethod
    def _url_parses(cls, value: str | None) -> str | None:
        if value is not None:
            problem = url_problem(value)
            if problem is None and urlsplit(value).scheme not in ("http", "https"):
                problem = "needs http:// or https://"
            if problem is None and not urlsplit(value).hostname:
                problem = "names no host"
            if problem:
                raise ValueError(f"{redact(value)!r} {problem}")
        return value


class Smoke(Strict):
    """Checks that run before any measured window (seed 004 §5; seed 003 as an option)."""

    enabled: bool = True
    seed003: bool = False
    memory_repeats: int = Field(default=8, ge=2)


class Tracking(Strict):
    """Where runs are logged (``tracking/``)."""

    enabled: bool = True
    uri: str = "sqlite:///mlruns/mlflow.db"
    experiment: str = "runner"
    artifact_root: str | None = "mlruns/artifacts"
    # How long a busy store (a locked sqlite file, a dropped connection) is retried
    # before what could not be logged waits for the end of the run.
    retry_s: float = Field(default=30.0, ge=0)

    @field_validator("uri")
    @classmethod
    def _uri_parses(cls, value: str) -> str:
        if "://" in value and (problem := url_problem(value)):
            raise ValueError(f"{redact(value)!r} {problem}")
        return value


class Results(Strict):
    dir: str


class Reference(Strict):
    """vLLM's own benchmark client at the search's answer, on the same engine before it
    stops (:mod:`runner.measure.reference`): an agreement check beside the decision."""

    enabled: bool = False
    # 50 prompts per user keep vLLM's ramp-up and drain near 2% of its run.
    prompts_per_user: int = Field(default=50, ge=1)
    input_len: int | None = Field(default=None, ge=1)  # None: the workload's mean prompt
    output_len: int | None = Field(default=None, ge=1)  # None: workload.max_tokens


class RunConfig(Strict):
    """Everything one run needs, validated."""

    hw: Hardware | None = None
    image: Image
    model: Model
    kv: KVCache
    engine: Engine
    workload: Workload
    search: Search
    slo: SLO = SLO()
    backend: Backend
    smoke: Smoke = Smoke()
    reference: Reference = Reference()
    tracking: Tracking = Tracking()
    results: Results
    run_id: str | None = None
    dry_run: bool = False
    cache_dir: str = "~/.cache/runner"

    @property
    def served_len(self) -> int:
        """The context the engine serves: ``engine.max_model_len``, else the model's."""
        return self.engine.max_model_len or self.model.max_context

    @property
    def largest_total(self) -> int | None:
        """The longest request the search's workload sends, prompt plus forced answer; a
        conversation ends before its next turn would pass the served context."""
        workload = self.workload
        if workload.kind == "context_mix":
            return workload.largest_total
        if workload.kind == "chat_sessions":
            return workload.total_at(workload.turns_within(self.served_len))
        return None
