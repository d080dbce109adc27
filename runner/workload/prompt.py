"""One request of the frozen workload, and how users map onto the workload's buckets."""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import WorkloadError


@dataclass(frozen=True)
class Prompt:
    """One request of the frozen workload: exact token IDs after the chat template."""

    id: str
    bucket_total: int
    prompt_tokens: int
    max_tokens: int
    token_ids: list[int]
    text: str


def assign_buckets(users: int, buckets: list[int]) -> list[int]:
    """Bucket total of each user: round-robin, so any N >= len(buckets) covers them all."""
    if users < 0 or not buckets:
        raise WorkloadError(
            f"Cannot assign {users} users to buckets {buckets}: the user count must not "
            "be negative and the workload needs at least one bucket."
        )
    return [buckets[user % len(buckets)] for user in range(users)]


def prompts_by_bucket(prompts: list[Prompt]) -> dict[int, list[Prompt]]:
    """The prompts of each bucket total, in workload order."""
    grouped: dict[int, list[Prompt]] = {}
    for prompt in prompts:
        grouped.setdefault(prompt.bucket_total, []).append(prompt)
    return grouped
