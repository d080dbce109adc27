"""Per-stream ITL/TPOT and the burst flag from synthetic chunk series (seed 000)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import pytest

from runner.measure.streams import (
    BURST_LARGEST_CHUNK_SHARE,
    BURSTY_WINDOW_SHARE,
    MIN_JUDGED_TOKENS,
    stream_timing,
    summarize_streams,
)


@dataclass
class Stream:
    chunk_times: array = field(default_factory=lambda: array("d"))
    chunk_tokens: array = field(default_factory=lambda: array("I"))
    token_events: int = 0


def stream(chunks: list[tuple[float, int]]) -> Stream:
    return Stream(array("d", [t for t, _ in chunks]), array("I", [n for _, n in chunks]))


def steady(tokens: int, gap_s: float = 0.02, start: float = 1.0) -> Stream:
    """One token per chunk, evenly spaced: a healthy stream."""
    return stream([(start + i * gap_s, 1) for i in range(tokens)])


def burst_at_end(tokens: int = 512) -> Stream:
    """Seed 000: first token, a long silence, then everything at once."""
    return stream([(1.0, 1), (40.0, tokens - 1)])


def test_a_steady_stream_times_its_tokens_and_is_not_bursty() -> None:
    timing = stream_timing(steady(64, gap_s=0.02))
    assert timing.tokens == 64 and timing.chunks == 64
    assert timing.tpot_s == pytest.approx(0.02)
    assert timing.gaps_s == pytest.approx([0.02] * 63)
    assert timing.judged and not timing.bursty


def test_512_tokens_in_two_chunks_is_bursty_and_its_tpot_collapses() -> None:
    """seed 000: a queued stream delivered in one burst reads a near-zero TPOT."""
    timing = stream_timing(burst_at_end(512))
    assert timing.bursty
    assert timing.largest_chunk_share == pytest.approx(511 / 512)
    # 39 s over 511 tokens: what a TPOT-only report would call 76 ms, or ~0 when the
    # first token lands with the rest, as in the seed.
    assert timing.tpot_s == pytest.approx(39.0 / 511)
    everything_at_once = stream_timing(stream([(40.0, 512)]))
    assert everything_at_once.bursty and everything_at_once.tpot_s is None


def test_multi_token_chunks_are_bursty_from_four_tokens_per_chunk() -> None:
    """ITL is measured per chunk; four tokens a chunk overstate it fourfold."""
    three = stream([(1.0 + i * 0.06, 3) for i in range(20)])
    four = stream([(1.0 + i * 0.08, 4) for i in range(20)])
    assert not stream_timing(three).bursty
    assert stream_timing(four).bursty
    # TPOT still times the tokens after the first chunk.
    assert stream_timing(four).tpot_s == pytest.approx(19 * 0.08 / 76)


def test_more_than_half_the_tokens_in_one_chunk_is_bursty() -> None:
    half = 32
    just_half = stream([(1.0 + i * 0.02, 1) for i in range(half)] + [(2.0, half)])
    over_half = stream([(1.0 + i * 0.02, 1) for i in range(half - 1)] + [(2.0, half + 1)])
    assert stream_timing(just_half).largest_chunk_share == BURST_LARGEST_CHUNK_SHARE
    assert not stream_timing(just_half).bursty
    assert stream_timing(over_half).bursty


def test_short_streams_are_not_judged() -> None:
    short = stream([(1.0, MIN_JUDGED_TOKENS - 1)])
    timing = stream_timing(short)
    assert not timing.judged and not timing.bursty
    assert stream_timing(stream([(1.0, MIN_JUDGED_TOKENS)])).bursty


def test_an_empty_stream_has_no_figures() -> None:
    timing = stream_timing(Stream())
    assert (timing.tokens, timing.tpot_s, timing.largest_chunk_share) == (0, None, None)
    assert not timing.bursty


def test_a_window_of_steady_streams_is_not_bursty_and_reports_the_aggregate() -> None:
    summary = summarize_streams([steady(64, gap_s=0.05) for _ in range(10)], 123.4)
    assert summary.bursty is False and summary.burst_share == 0.0
    assert summary.tpot_p50_ms == pytest.approx(50.0)
    assert summary.itl_p50_ms == pytest.approx(50.0)
    assert summary.itl_p99_ms == pytest.approx(50.0)
    assert summary.tokens_per_chunk_mean == pytest.approx(1.0)
    assert summary.decode_tok_s_aggregate == 123.4


def test_the_window_flag_needs_more_than_its_share_of_bursty_streams() -> None:
    """seed 000: one odd stream does not flag a window; a share of them does."""
    healthy = [steady(64) for _ in range(100)]
    at_share = healthy[: 100 - round(BURSTY_WINDOW_SHARE * 100)] + [burst_at_end()] * round(
        BURSTY_WINDOW_SHARE * 100
    )
    above_share = [*at_share[1:], burst_at_end()]
    assert summarize_streams(at_share, 1.0).bursty is False
    flagged = summarize_streams(above_share, 1.0)
    assert flagged.bursty is True
    assert flagged.burst_share == pytest.approx(BURSTY_WINDOW_SHARE + 0.01)
    # The per-stream figures still look healthy: only the flag tells the reader.
    assert flagged.tpot_p50_ms == pytest.approx(20.0)
    assert flagged.itl_p50_ms == pytest.approx(20.0)


def test_a_window_without_streams_is_unavailable_not_zero() -> None:
    summary = summarize_streams([], 0.0)
    assert summary.tpot_p50_ms is None and summary.itl_p99_ms is None
    assert summary.burst_share is None and summary.bursty is False


def test_a_burst_of_merged_events_is_the_servers() -> None:
    """Four events of 16 tokens, one per read: the server packed them (seed 000)."""
    packed = stream([(1.0 + i * 0.3, 16) for i in range(4)])
    packed.token_events = 4
    timing = stream_timing(packed)
    assert timing.bursty and timing.events == 4 and timing.burst_source == "server"


def test_a_burst_of_one_token_events_read_together_is_the_clients() -> None:
    """64 one-token events taken in by two reads: the client woke late."""
    lumped = stream([(1.0, 1), (2.0, 63)])
    lumped.token_events = 64
    timing = stream_timing(lumped)
    assert timing.bursty and timing.burst_source == "client"


def test_uncounted_events_and_steady_streams_name_no_source() -> None:
    assert stream_timing(burst_at_end()).burst_source is None  # events not counted
    smooth = steady(64)
    smooth.token_events = 64
    assert stream_timing(smooth).burst_source is None  # not bursty


def test_the_window_names_the_source_of_most_bursty_streams() -> None:
    def counted(chunks: list[tuple[float, int]], events: int) -> Stream:
        s = stream(chunks)
        s.token_events = events
        return s

    server = counted([(1.0, 16), (2.0, 16)], 2)
    client = counted([(1.0, 1), (2.0, 31)], 32)
    healthy = counted([(1.0 + i * 0.02, 1) for i in range(32)], 32)
    summary = summarize_streams([server, server, client, healthy], 1.0)
    assert summary.burst_source == "server"
    assert summary.tokens_per_event_mean == pytest.approx(128 / 68)
    assert summary.events_per_read_mean == pytest.approx(68 / 38)
    assert summarize_streams([server, client], 1.0).burst_source == "server+client"
    assert summarize_streams([healthy], 1.0).burst_source is None
    assert summarize_streams([steady(64)], 1.0).tokens_per_event_mean is None
