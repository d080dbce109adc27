"""The typed run configuration: one object, built once from Hydra's composed config.

Every model rejects unknown keys so that YAML drift fails loudly. Nothing below the
entry point sees an OmegaConf ``DictConfig``; it sees a :class:`RunConfig`.
Cross-group rules live in :mod:`runner.validate`; this module only checks shapes.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from runner.errors import ConfigError

Precision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4", "nvfp4a16", "int4"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(Strict):
    """A GPU host profile (``hw/``). Absent means the local CPU, no GPU."""

    name: str
    gpu_name: str
    count: int = Field(ge=1)
    memory_gib: float = Field(gt=0)
    compute_capability: tuple[int, int]
    arch: str
    native_precisions: list[Precision]
    min_driver: str
    device_ids: list[int] | None = None


class Image(Strict):
    """The engine image (``image/``): pinned by digest, or explicitly allowed unpinned."""

    name: str
    repository: str
    tag: str
    digest: str | None = None
    build_commit: str | None = None
    vllm_version: str | None = None
    allow_unpinned: bool = False
    local_build: bool = False

    @field_validator("digest")
    @classmethod
    def _digest_shape(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("sha256:") and len(value) == 71):
            raise ValueError(f"digest must be 'sha256:' and 64 hex digits, got {value!r}")
        return value

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    @property
    def reference(self) -> str:
        """What a container is started from: repository@digest when pinned."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag}"


class Model(Strict):
    """A checkpoint (``model/``)."""

    name: str
    repo: str
    revision: str | None = None
    allow_unresolved_revision: bool = False
    weights: Precision
    quantization: str | None = None
    expected_quantization: str | None = None
    served_name: str
    max_context: int = Field(gt=0)
    trust_remote_code: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    mamba_ssm_cache_dtype: str | None = None
    generated: bool = False
    # The engine gets the user's HF_TOKEN (by name; the value never leaves their environment).
    needs_hf_token: bool = False


class KVCache(Strict):
    """The KV cache dtype (``kv/``)."""

    name: str
    cache_dtype: Literal["auto", "bfloat16", "fp8", "nvfp4"]
    precision: Literal["auto", "bf16", "fp8", "nvfp4"]


class Engine(Strict):
    """vLLM engine flags (``engine/``); ``None`` leaves vLLM's own default."""

    name: str
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, ge=1)
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool = False
    tensor_parallel_size: int = Field(default=1, ge=1)
    enable_expert_parallel: bool = False
    dtype: str = "auto"
    async_scheduling: bool = False
    generation_config: str | None = None
    long_prefill_token_threshold: int | None = None
    max_num_partial_prefills: int | None = None
    max_long_partial_prefills: int | None = None
    load_format: str | None = None
    port: int = Field(default=8000, ge=1, le=65535)
    api_key_env: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("env", mode="before")
    @classmethod
    def _env_as_text(cls, value: Any) -> Any:
        # YAML and the command line read `1` or `true` as numbers and booleans; an
        # environment value is text either way.
        if isinstance(value, dict):
            return {key: _as_text(item) for key, item in value.items()}
        return value

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args_as_text(cls, value: Any) -> Any:
        # `[--stream-interval,16]` is an argv: its 16 is the text "16".
        if isinstance(value, list):
            return [_as_text(item) for item in value]
        return value


class Bucket(Strict):
    """One context-length bucket: total = prompt + forced output tokens."""

    total_tokens: int = Field(gt=0)


class Workload(Strict):
    """What the simulated users send (``workload/``).

    ``context_mix`` is seed 004's bucketed mix, measured by the concurrency search;
    ``sharegpt`` is seed 000's fixed-concurrency benchmark over a local ShareGPT file
    (``num_prompts``, ``max_seconds`` and ``concurrency`` belong to it alone).
    """

    name: str
    kind: Literal["context_mix", "sharegpt"] = "context_mix"
    buckets: list[Bucket] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, gt=0)
    ignore_eos: bool = True
    prompts_per_bucket: int = Field(default=64, ge=1)
    seed: int = 0
    temperature: float = 0.0
    request_timeout_s: float = Field(default=600.0, gt=0)
    dataset_path: str | None = None
    num_prompts: int | None = Field(default=None, ge=1)
    max_seconds: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _kind_has_its_input(self) -> Workload:
        if self.kind == "context_mix" and not self.buckets:
            raise ValueError("a context_mix workload needs at least one bucket")
        if self.kind == "sharegpt" and not self.dataset_path:
            raise ValueError("a sharegpt workload needs dataset_path, a local ShareGPT JSON file")
        return self

    @property
    def largest_total(self) -> int:
        return max((bucket.total_tokens for bucket in self.buckets), default=0)


class Search(Strict):
    """How concurrency is searched (``search/``)."""

    kind: Literal["bracket", "fixed"]
    users: list[int] = Field(default_factory=list)
    start_users: int = Field(default=7, ge=1)
    max_users: int = Field(default=1024, ge=1)
    window_s: float = Field(default=300.0, gt=0)
    screening_window_s: float | None = Field(default=None, gt=0)
    warmup_s: float = Field(default=30.0, ge=0)
    drain_timeout_s: float = Field(default=600.0, gt=0)
    confirm_repeats: int = Field(default=3, ge=0)
    coarse_margin_tok_s: float = Field(default=0.5, ge=0)
    negligible_gain_pct: float = Field(default=2.0, ge=0)
    neighbourhood: int = Field(default=2, ge=0)
    metrics_interval_s: float = Field(default=1.0, gt=0)


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
    tiers: list[Tier] = Field(default_factory=list)

    @field_validator("tiers")
    @classmethod
    def _unique_names(cls, tiers: list[Tier]) -> list[Tier]:
        names = [tier.name for tier in tiers]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"tier names must be unique; repeated: {', '.join(repeated)}")
        return tiers

    @property
    def max_loop_lag_ms(self) -> float:
        return self.client_max_loop_lag_ms or 1000.0 / self.min_user_tok_s


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


class Results(Strict):
    dir: str


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
    tracking: Tracking = Tracking()
    results: Results
    run_id: str | None = None
    dry_run: bool = False
    cache_dir: str = "~/.cache/runner"


def _as_text(value: Any) -> Any:
    """A scalar as the text a command line or environment holds; anything else as is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def build_config(data: dict[str, Any]) -> RunConfig:
    """Turn the composed (plain) config into a :class:`RunConfig` or raise ConfigError."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
            + (did_you_mean(error["loc"]) if error["type"] == "extra_forbidden" else "")
            for error in exc.errors()
        )
        raise ConfigError(
            f"The configuration does not match runner's schema ({problems}). "
            "Check the spelling of the key in your YAML or override; unknown keys are "
            "refused so that a typo never silently falls back to a default."
        ) from exc


def known_keys(path: Sequence[str | int]) -> list[str]:
    """The keys runner's schema allows under ``path`` (e.g. ``("engine",)``); [] if none."""
    model: Any = RunConfig
    for part in path:
        if isinstance(part, int):
            continue  # an item of a list of models, e.g. workload.buckets[0]
        field = model.model_fields.get(part) if _is_model(model) else None
        if field is None:
            return []
        model = _model_in(field.annotation)
    return list(model.model_fields) if _is_model(model) else []


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _model_in(annotation: Any) -> Any:
    """The model class inside ``X``, ``X | None`` or ``list[X]``, if any."""
    if _is_model(annotation):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def did_you_mean(loc: Sequence[str | int]) -> str:
    """" (did you mean engine.max_num_seqs?)" for an unknown key ``loc``; "" if nothing is close."""
    close = difflib.get_close_matches(str(loc[-1]), known_keys(loc[:-1]), n=1)
    return f" (did you mean {'.'.join(map(str, [*loc[:-1], close[0]]))}?)" if close else ""
