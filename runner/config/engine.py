"""The engine side of the configuration: host, image, model, KV cache and engine flags
(the ``hw/``, ``image/``, ``model/``, ``kv/`` and ``engine/`` groups)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from runner.config.base import Precision, Strict, as_text
from runner.secret import is_env_name


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
    def _envas_text(cls, value: Any) -> Any:
        # YAML and the command line read `1` or `true` as numbers and booleans; an
        # environment value is text either way.
        if isinstance(value, dict):
            return {key: as_text(item) for key, item in value.items()}
        return value

    @field_validator("extra_args", mode="before")
    @classmethod
    def _argsas_text(cls, value: Any) -> Any:
        # `[--stream-interval,16]` is an argv: its 16 is the text "16".
        if isinstance(value, list):
            return [as_text(item) for item in value]
        return value
