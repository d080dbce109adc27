"""What the simulated users send (the ``workload/`` group), told apart by ``kind``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from runner.config.base import Strict


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
