"""Rules for chat-session workloads (``workload.kind=chat_sessions``), before anything starts.

Part of :func:`runner.prepare.validate.validate`: each rule yields what is broken, in one
sentence, and doubtful but runnable choices become warnings.
"""

from __future__ import annotations

from collections.abc import Iterator

from runner.config import RunConfig

# A pause may take at most this share of the shortest window, so every user has time
# outside think time in every window to be measured on.
MAX_THINK_SHARE = 0.5


def chat_sessions_rules(config: RunConfig, warnings: list[str]) -> Iterator[str]:
    """What a chat-session workload needs from the engine, the context and the search."""
    workload = config.workload
    if workload.kind != "chat_sessions":
        return
    if not config.engine.enable_prefix_caching:
        yield (
            f"workload {workload.name} (kind chat_sessions) needs "
            "engine.enable_prefix_caching=true: a chat server reuses each conversation's "
            "history from its prefix cache, and without it every turn prefills the whole "
            "conversation again, which measures a deployment nobody runs "
            "(workload.prefix_cache=cold still starts every window with nothing cached)"
        )
    if not workload.ignore_eos:
        yield (
            f"workload {workload.name} (kind chat_sessions) needs workload.ignore_eos=true: "
            "every answer is forced to max_tokens, so that each turn's prompt, which "
            "carries the answers before it, holds an exact number of tokens"
        )
    served = config.served_len
    fits = workload.turns_within(served)
    source = "engine.max_model_len" if config.engine.max_model_len else "the model's max_context"
    if fits < 1:
        yield (
            f"the first turn of workload {workload.name} totals {workload.total_at(1)} tokens "
            f"(system_tokens + user_tokens + max_tokens), more than {source} ({served})"
        )
    elif fits < workload.turns:
        warnings.append(
            f"workload {workload.name}'s conversations restart after {fits} of its "
            f"{workload.turns} turns: turn {fits + 1} would total "
            f"{workload.total_at(fits + 1)} tokens, more than {source} ({served})"
        )
    yield from _think_time(config)


def _think_time(config: RunConfig) -> Iterator[str]:
    workload, search = config.workload, config.search
    assert workload.kind == "chat_sessions"
    windows = [("search.window_s", search.window_s)]
    screening = getattr(search, "screening_window_s", None)
    if screening is not None:
        windows.append(("search.screening_window_s", screening))
    name, shortest = min(windows, key=lambda window: window[1])
    longest = workload.think_time.longest_s
    if longest > MAX_THINK_SHARE * shortest:
        yield (
            f"workload.think_time allows pauses of up to {longest:g} s, more than half of "
            f"{name}={shortest:g}: a user could spend most of a window thinking, leaving "
            "too little of it to measure its rate on; lower workload.think_time.max_s "
            "(or mean_s) or lengthen the windows"
        )
