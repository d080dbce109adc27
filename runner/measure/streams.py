"""Per-request decode timing from streamed chunks, and the burst flag (seed 000).

A streamed request is a series of chunks: when each arrived on the client's clock
and how many token IDs it carried. From it come

* the inter-token latency (ITL): the gap between consecutive chunks, one sample per
  chunk, as vLLM's own benchmark client measures it;
* the time per output token (TPOT): first chunk to last chunk, divided by the tokens
  that arrived after the first chunk (those generated before it arrived are not
  timed by that span);
* the tokens per chunk, which says whether those two figures time tokens at all;
* where a burst came from: a chunk is one read, so its tokens are the tokens per SSE
  event (the server merged deltas it had not sent yet, or buffered them with
  ``--stream-interval``) times the events per read (the client took several events in
  at once because it woke late). The larger factor names the source, ``server`` or
  ``client``: a server burst is the engine's behaviour, a client burst is runner's own
  measurement falling behind.

Seed 000 reports "TPOT reads 0.0 ms" under overload: a queued stream's tokens
arrived in one burst right before it finished, so its first token landed about when
its last did. Such a stream's ITL and TPOT time the burst, not the decode. A window
where that happens to a fair share of the streams is flagged ``bursty``, and its
TPOT/ITL figures are never reported without that flag; the aggregate decode rate
(tokens delivered over the window) stays honest either way and is reported beside
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# Streams this short have too few chunks to tell a burst from an ordinary first lump
# (a 3-token answer that arrives in one chunk is not evidence of anything).
MIN_JUDGED_TOKENS = 8

# A stream is bursty when one chunk holds more than half its tokens: then most of its
# decode is hidden inside one gap, and its TPOT divides that gap by many tokens and
# reads near zero. The seed 000 artefact is the extreme, all tokens in about one chunk.
BURST_LARGEST_CHUNK_SHARE = 0.5

# ...or when its typical chunk carries this many tokens or more: every ITL sample
# then spans at least four tokens, so ITL overstates the per-token gap fourfold while
# the stream still looks smooth. A healthy stream carries one token per chunk; vLLM's
# frontend merges the deltas of a request its event loop has not yet sent, so a
# loaded server shows 2-3, which still times decode to within a small factor.
BURST_MEDIAN_TOKENS_PER_CHUNK = 4.0

# A window is bursty when more than this share of its judged streams are. TPOT is one
# figure per stream, so at 5% bursty streams its lower percentiles are theirs and the
# median has moved five points while still looking healthy; an odd stream coalesced
# at a scheduling hiccup stays well under 1 in 20.
BURSTY_WINDOW_SHARE = 0.05


class Chunked(Protocol):
    """What a streamed request offers: chunk arrival times and tokens per chunk."""

    chunk_times: Sequence[float]
    chunk_tokens: Sequence[int]
    # Optional: the SSE events that carried token IDs (0 or absent when not counted).
    # token_events: int


@dataclass(frozen=True)
class StreamTiming:
    """Decode timing of one streamed request; ``None`` where it cannot be measured."""

    tokens: int
    chunks: int
    tpot_s: float | None
    gaps_s: np.ndarray
    largest_chunk_share: float | None
    median_tokens_per_chunk: float | None
    judged: bool
    bursty: bool
    events: int | None = None  # SSE events with token IDs; None when not counted
    burst_source: str | None = None  # "server" or "client" for a bursty stream


def _burst_source(tokens: int, events: int, chunks: int) -> str:
    """Which merged more: the server (tokens per event) or the client (events per read)."""
    return "server" if tokens / events >= events / chunks else "client"


def _as_arrays(stream: Chunked) -> tuple[np.ndarray, np.ndarray]:
    # array('d')/array('I') reach numpy through the buffer protocol: one memcpy each.
    return (
        np.asarray(stream.chunk_times, dtype=np.float64),
        np.asarray(stream.chunk_tokens, dtype=np.int64),
    )


def stream_timing(stream: Chunked) -> StreamTiming:
    """ITL gaps, TPOT, tokens per chunk and the burst verdict of one stream."""
    times, tokens = _as_arrays(stream)
    total = int(tokens.sum())
    chunks = len(tokens)
    if chunks == 0 or total == 0:
        return StreamTiming(0, chunks, None, np.empty(0), None, None, False, False)
    after_first = total - int(tokens[0])
    tpot = float(times[-1] - times[0]) / after_first if after_first > 0 else None
    largest_share = float(tokens.max()) / total
    median_per_chunk = float(np.median(tokens))
    judged = total >= MIN_JUDGED_TOKENS
    bursty = judged and (
        largest_share > BURST_LARGEST_CHUNK_SHARE
        or median_per_chunk >= BURST_MEDIAN_TOKENS_PER_CHUNK
    )
    events = getattr(stream, "token_events", 0) or None
    return StreamTiming(
        tokens=total,
        chunks=chunks,
        tpot_s=tpot,
        gaps_s=np.diff(times),
        largest_chunk_share=largest_share,
        median_tokens_per_chunk=median_per_chunk,
        judged=judged,
        bursty=bursty,
        events=events,
        burst_source=_burst_source(total, events, chunks) if bursty and events else None,
    )


def _window_burst_source(timings: Sequence[StreamTiming]) -> str | None:
    """The source of most bursty streams; "server+client" on a tie, None if unknown."""
    server = sum(1 for t in timings if t.burst_source == "server")
    client = sum(1 for t in timings if t.burst_source == "client")
    if server == client:
        return "server+client" if server else None
    return "server" if server > client else "client"


def _ms(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q) * 1000.0) if values.size else None


@dataclass(frozen=True)
class StreamSummary:
    """A window's (or benchmark's) stream figures: TPOT/ITL, chunking and the burst flag.

    ``None`` figures are unavailable (no stream long enough to judge), never zero.
    """

    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    bursty: bool
    burst_share: float | None
    bursty_requests: int
    judged_requests: int
    burst_source: str | None
    tokens_per_chunk_mean: float | None
    tokens_per_event_mean: float | None
    events_per_read_mean: float | None
    largest_chunk_share_p50: float | None
    decode_tok_s_aggregate: float


def summarize_streams(streams: Sequence[Chunked], decode_tok_s_aggregate: float) -> StreamSummary:
    """TPOT/ITL, tokens per chunk and the burst flag over ``streams``.

    ``streams`` are the completed requests; ``decode_tok_s_aggregate`` is the tokens the
    client received over the measured span, reported beside the per-stream figures
    because it stays honest when they do not (seed 000).
    """
    timings = [stream_timing(stream) for stream in streams]
    judged = [t for t in timings if t.judged]
    bursty = sum(1 for t in judged if t.bursty)
    burst_share = bursty / len(judged) if judged else None
    tpots = np.array([t.tpot_s for t in timings if t.tpot_s is not None])
    gaps = np.concatenate([t.gaps_s for t in timings]) if timings else np.empty(0)
    tokens = sum(t.tokens for t in timings)
    chunks = sum(t.chunks for t in timings)
    counted = [t for t in timings if t.events]
    counted_events = sum(t.events or 0 for t in counted)
    return StreamSummary(
        tpot_p50_ms=_ms(tpots, 50),
        tpot_p99_ms=_ms(tpots, 99),
        itl_p50_ms=_ms(gaps, 50),
        itl_p99_ms=_ms(gaps, 99),
        bursty=burst_share is not None and burst_share > BURSTY_WINDOW_SHARE,
        burst_share=burst_share,
        bursty_requests=bursty,
        judged_requests=len(judged),
        burst_source=_window_burst_source(judged),
        tokens_per_chunk_mean=tokens / chunks if chunks else None,
        tokens_per_event_mean=(
            sum(t.tokens for t in counted) / counted_events if counted_events else None
        ),
        events_per_read_mean=(
            counted_events / sum(t.chunks for t in counted) if counted_events else None
        ),
        largest_chunk_share_p50=(
            float(np.median([t.largest_chunk_share for t in judged])) if judged else None
        ),
        decode_tok_s_aggregate=decode_tok_s_aggregate,
    )
