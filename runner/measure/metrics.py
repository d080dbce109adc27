"""vLLM's Prometheus ``/metrics`` text, turned into typed values.

Counters are summed over their label sets (one set per engine core or data-parallel
rank); running and waiting requests are summed the same way; KV-cache usage is the
largest rank's, because one full rank is what preempts. A metric the server does not
expose is ``None`` (unavailable), never zero.

``cache_config`` holds the labels of ``vllm:cache_config_info``. vLLM 0.32 (CPU
backend included) puts there, among others, ``block_size``, ``cache_dtype``,
``num_gpu_blocks``, ``kv_cache_size_tokens`` and ``kv_cache_max_concurrency``,
``enable_prefix_caching`` and ``gpu_memory_utilization``, all as strings; the
helpers below read the two KV figures as numbers. (It also carries an ``engine``
label; the labels of the first engine are kept.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
CACHE_CONFIG = "vllm:cache_config_info"
# Prompt tokens looked up in the prefix cache, and those found there.
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"

_SUMMED = (
    GENERATION_TOKENS, PROMPT_TOKENS, REQUESTS_RUNNING, REQUESTS_WAITING, PREEMPTIONS,
    PREFIX_QUERIES, PREFIX_HITS,
)  # fmt: skip
_WANTED = frozenset((*_SUMMED, KV_CACHE_USAGE, CACHE_CONFIG))
# The families as the TYPE/HELP lines name them: counters drop their "_total".
_FAMILIES = frozenset(name.removesuffix("_total") for name in _WANTED) | _WANTED


@dataclass(frozen=True)
class EngineMetrics:
    """One read of ``/metrics``; ``None`` means the server does not expose it."""

    generation_tokens_total: float | None
    prompt_tokens_total: float | None
    requests_running: float | None
    requests_waiting: float | None
    kv_cache_usage: float | None  # 0..1, as vLLM reports it
    preemptions_total: float | None
    cache_config: dict[str, str] = field(default_factory=dict)
    prefix_cache_queries_total: float | None = None
    prefix_cache_hits_total: float | None = None

    @property
    def idle(self) -> bool:
        """True only when both queues are known and empty."""
        return self.requests_running == 0 and self.requests_waiting == 0

    @property
    def kv_cache_size_tokens(self) -> int | None:
        return _int_label(self.cache_config, "kv_cache_size_tokens")

    @property
    def kv_cache_max_concurrency(self) -> float | None:
        value = self.cache_config.get("kv_cache_max_concurrency")
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key)
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def _relevant_lines(text: str) -> str:
    """Keep only the families read here: a full vLLM page is mostly histogram buckets,
    and the pure-Python parser's cost grows with every line it sees."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2] in _FAMILIES:
                kept.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in _WANTED:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_metrics(text: str) -> EngineMetrics:
    """Parse vLLM's ``/metrics`` text; families it lacks come back as ``None``.

    Raises ValueError when a line of a family read here is not valid Prometheus text.
    """
    sums: dict[str, float] = {}
    kv_usage: float | None = None
    cache_config: dict[str, str] = {}
    for family in text_string_to_metric_families(_relevant_lines(text)):
        for sample in family.samples:
            if sample.name in _SUMMED:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            elif sample.name == KV_CACHE_USAGE:
                kv_usage = sample.value if kv_usage is None else max(kv_usage, sample.value)
            elif sample.name == CACHE_CONFIG and not cache_config:
                cache_config = dict(sample.labels)
    return EngineMetrics(
        generation_tokens_total=sums.get(GENERATION_TOKENS),
        prompt_tokens_total=sums.get(PROMPT_TOKENS),
        requests_running=sums.get(REQUESTS_RUNNING),
        requests_waiting=sums.get(REQUESTS_WAITING),
        kv_cache_usage=kv_usage,
        preemptions_total=sums.get(PREEMPTIONS),
        cache_config=cache_config,
        prefix_cache_queries_total=sums.get(PREFIX_QUERIES),
        prefix_cache_hits_total=sums.get(PREFIX_HITS),
    )
