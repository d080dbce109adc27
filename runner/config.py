"""The typed run configuration: one object, built once from Hydra's composed config.

Every model rejects unknown keys so that YAML drift fails loudly. Nothing below the
entry point sees an OmegaConf ``DictConfig``; it sees a :class:`RunConfig`.
Cross-group rules live in :mod:`runner.validate`; this module only checks shapes.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from runner.errors import ConfigError
from runner.secret import is_env_name, redact

Precision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4", "nvfp4a16", "int4"]


class Strict(BaseModel):
    # inf and nan are refused everywhere: `search.window_s=inf` would never end a window.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    # What an hour of the profile's ``count`` GPUs costs, in US dollars (a rental's price):
    # gives $ per million output tokens. None: no cost figures.
    usd_per_hour: float | None = Field(default=None, gt=0)


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
    # A generated model's Hugging Face config.json: the architecture vLLM builds with random
    # weights. None: runner's built-in tiny Llama. ``hf_config`` names a file that replaces it.
    architecture: dict[str, Any] | None = None
    hf_config: str | None = None
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
    # A fixed KV cache size (--kv-cache-memory-bytes); the CPU profile's choice, since
    # a fraction of node memory moves with the machine (ENVIRONMENT.md, pitfalls).
    kv_cache_memory_gib: float | None = Field(default=None, gt=0)
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

    @field_validator("api_key_env")
    @classmethod
    def _api_key_env_is_a_name(cls, value: str | None) -> str | None:
        # The value is deliberately left out of the message: it may be the key itself.
        if value is not None and not is_env_name(value):
            raise ValueError(
                "must be the NAME of the environment variable that holds the API key "
                "(letters, digits and _, e.g. VLLM_API_KEY), never the key itself; the "
                "value given is not shown"
            )
        return value

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


class WorkloadBase(Strict):
    """What every workload kind has: its name and how each request is sent."""

    name: str
    max_tokens: int | None = Field(default=None, gt=0)
    ignore_eos: bool = True
    seed: int = 0
    temperature: float = Field(default=0.0, ge=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    # With engine.enable_prefix_caching: "cold" salts each window's requests
    # (vLLM's cache_salt), so no window reuses what an earlier one cached; "warm" lets
    # it. The window records the cache hit rate either way.
    prefix_cache: Literal["cold", "warm"] = "cold"


class ContextMixWorkload(WorkloadBase):
    """Seed 004's bucketed mix, measured by the concurrency search (``workload/``)."""

    kind: Literal["context_mix"] = "context_mix"
    buckets: list[Bucket] = Field(min_length=1)
    prompts_per_bucket: int = Field(default=64, ge=1)

    @property
    def largest_total(self) -> int:
        return max(bucket.total_tokens for bucket in self.buckets)

    @property
    def distribution(self) -> str:
        """The mix in one line, as the report states it."""
        totals = "/".join(f"{bucket.total_tokens}" for bucket in self.buckets)
        return f"equal {totals} total tokens, {self.max_tokens} output"


class ShareGPTWorkload(WorkloadBase):
    """Seed 000's fixed-concurrency benchmark over a local ShareGPT file; no search."""

    kind: Literal["sharegpt"]
    ignore_eos: bool = False
    dataset_path: str
    num_prompts: int | None = Field(default=None, ge=1)
    max_seconds: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, ge=1)


class ThinkTime(Strict):
    """How long a chat user reads and types between an answer and its next turn: seeded
    draws, frozen into ``workload.jsonl`` with the conversations."""

    distribution: Literal["fixed", "exponential"] = "exponential"
    # fixed: every pause; exponential: the mean of the draws before the cap. 0: no pause.
    mean_s: float = Field(default=0.0, ge=0)
    # The longest pause; an exponential's long tail is cut here. None: 5 x mean_s.
    max_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _cap_above_mean(self) -> ThinkTime:
        if self.max_s is not None and self.max_s < self.mean_s:
            raise ValueError(f"max_s={self.max_s} is below mean_s={self.mean_s}")
        return self

    @property
    def longest_s(self) -> float:
        """The longest pause any draw can give."""
        if self.distribution == "fixed":
            return self.mean_s
        return self.max_s if self.max_s is not None else 5.0 * self.mean_s


class ChatSessionsWorkload(WorkloadBase):
    """Persistent users in multi-turn conversations: a shared system prompt, a growing
    history, think time between turns (``workload/chat_sessions*``).

    Every count is exact after the chat template: turn k's prompt holds
    ``system_tokens + k * user_tokens + (k - 1) * max_tokens`` tokens, and each answer is
    forced to ``max_tokens``.
    """

    kind: Literal["chat_sessions"]
    system_tokens: int = Field(gt=0)
    user_tokens: int = Field(gt=0)
    turns: int = Field(ge=1)
    conversations: int = Field(default=32, ge=1)
    think_time: ThinkTime = ThinkTime()

    def total_at(self, turn: int) -> int:
        """Prompt plus forced answer of ``turn`` (1-based)."""
        return self.system_tokens + turn * (self.user_tokens + (self.max_tokens or 0))

    @property
    def distribution(self) -> str:
        """The conversations in one line, as the report states it."""
        think = self.think_time
        pause = (
            "no think time"
            if think.mean_s == 0
            else f"{think.distribution} think time of {think.mean_s:g} s"
            + (f" (at most {think.longest_s:g} s)" if think.distribution == "exponential" else "")
        )
        return (
            f"chat sessions of up to {self.turns} turns: a shared {self.system_tokens}-token "
            f"system prompt, {self.user_tokens}-token user turns, {self.max_tokens}-token "
            f"answers, {pause}"
        )

    def turns_within(self, context: int) -> int:
        """Turns a conversation holds before its next turn would pass ``context`` tokens."""
        per_turn = self.user_tokens + (self.max_tokens or 0)
        return max(0, min(self.turns, (context - self.system_tokens) // per_turn))


def _workload_kind(value: Any) -> str:
    # A workload file written before kinds existed is a context mix.
    if isinstance(value, dict):
        return value.get("kind", "context_mix")
    return getattr(value, "kind", "context_mix")


# What the simulated users send, told apart by ``kind``: a YAML carries only its kind's keys.
Workload = Annotated[
    Annotated[ContextMixWorkload, Tag("context_mix")]
    | Annotated[ShareGPTWorkload, Tag("sharegpt")]
    | Annotated[ChatSessionsWorkload, Tag("chat_sessions")],
    Discriminator(_workload_kind),
]


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
            raise ValueError("'default' names the default floor's answer; give the tier another name")
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


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be parsed (an unclosed IPv6 bracket, a port that is no number), or None."""
    try:
        _ = urlsplit(url).port  # reading the port is what checks it
    except ValueError:
        return (
            "is not a URL runner can read: check the brackets around an IPv6 address "
            "(http://[::1]:8000) and that the port is a number"
        )
    return None


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
            f"{'.'.join(_where(error))}: {error['msg']}"
            + (did_you_mean(error["loc"]) if error["type"] == "extra_forbidden" else "")
            for error in exc.errors()
        )
        raise ConfigError(
            f"The configuration does not match runner's schema ({problems}). "
            "Check the spelling of the key in your YAML or override; unknown keys are "
            "refused so that a typo never silently falls back to a default."
        ) from exc


def _where(error: Any) -> list[str]:
    """The key a validation error is about, as a user writes it; a union's unknown or
    missing ``kind`` is about its ``kind`` key."""
    path = user_path(error["loc"])
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        path.append("kind")
    return path


def known_keys(path: Sequence[str | int]) -> list[str]:
    """The keys runner's schema allows under ``path`` (e.g. ``("engine",)``); [] if none.

    Under a union told apart by ``kind`` (``search``, ``workload``) the keys of every kind
    count, unless the path names the kind, as pydantic's error locations do.
    """
    models: list[Any] = [RunConfig]
    for part in user_path(path):
        if part.isdigit():
            continue  # an item of a list of models, e.g. workload.buckets.0
        models = [
            found
            for model in models
            if (field := model.model_fields.get(part)) is not None
            for found in _models_in(field.annotation)
        ]
        if not models:
            return []
    return list(dict.fromkeys(key for model in models for key in model.model_fields))


def user_path(loc: Sequence[str | int]) -> list[str]:
    """A validation error's location as a user writes the key: list indices and the
    ``kind`` tags pydantic inserts for a union (``search.bracket.window_s``) dropped."""
    models: list[Any] = [RunConfig]
    path: list[str] = []
    for part in loc:
        if isinstance(part, int):
            path.append(str(part))  # an item of a list, e.g. search.users.0
            continue
        fields = [model.model_fields.get(part) for model in models]
        found = [field for field in fields if field is not None]
        if not found:
            tagged = [model for model in models if part in _kinds(model)]
            if tagged:
                models = tagged
                continue
            path.append(str(part))
            models = []
            continue
        path.append(str(part))
        models = [model for field in found for model in _models_in(field.annotation)]
    return path


def _kinds(model: Any) -> tuple[Any, ...]:
    field = model.model_fields.get("kind") if _is_model(model) else None
    return get_args(field.annotation) if field is not None else ()


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _models_in(annotation: Any) -> list[Any]:
    """The model classes inside ``X``, ``X | None``, ``list[X]`` or a union of models."""
    if _is_model(annotation):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def did_you_mean(loc: Sequence[str | int]) -> str:
    """" (did you mean engine.max_num_seqs?)" for an unknown key ``loc``; "" if nothing is close."""
    path = user_path(loc)
    if not path:
        return ""
    keys = known_keys(path[:-1])
    if path[-1] in keys:
        # A key of another kind of the same union: the kind given does not take it.
        tags = [str(part) for part in loc if isinstance(part, str) and part not in path]
        kind = f" {path[-2]}.kind={tags[-1]}" if tags and len(path) > 1 else " this kind"
        return f" ({'.'.join(path)} belongs to another kind; with{kind} it does not apply)"
    close = difflib.get_close_matches(path[-1], keys, n=1)
    return f" (did you mean {'.'.join([*path[:-1], close[0]])}?)" if close else ""
