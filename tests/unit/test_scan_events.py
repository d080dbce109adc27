"""Both transports count streamed token IDs with one parser (seed 004 §7: per-user counts)."""

from __future__ import annotations

import json

from runner.measure.records import RequestRecord
from runner.measure.transport import add_read, scan_events

STREAM = (
    b'data: {"choices":[{"text":"a \\"token_ids\\":[9]","token_ids":[5,6]}]}\n\n'
    b'data: {"choices":[{"text":"b","token_ids":[7]}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}}\n\n'
    b"data: [DONE]\n\n"
)


def record() -> RequestRecord:
    return RequestRecord(user=0, bucket_total=128, prompt_id="p", dispatched_at=0.0)


def test_events_and_lines_count_the_same_tokens_and_see_done() -> None:
    seen: list[dict] = []
    by_event = scan_events(STREAM.split(b"\n\n"), record(), lambda r, e: seen.append(e))
    by_line = scan_events(STREAM.split(b"\n"), record(), lambda r, e: seen.append(e))
    assert by_event == by_line == (3, True)
    assert [e["usage"]["completion_tokens"] for e in seen] == [3, 3]


def test_a_read_with_tokens_is_one_chunk_and_the_first_sets_ttft() -> None:
    r = record()
    add_read(r, 1.5, 0)
    add_read(r, 2.0, 2)
    add_read(r, 2.5, 1)
    assert r.first_token_at == 2.0
    assert list(r.chunk_times) == [2.0, 2.5] and list(r.chunk_tokens) == [2, 1]


def test_the_streamed_token_ids_are_kept_when_a_chat_user_asks_for_them() -> None:
    """A chat user sends the engine's own answer back as history: the IDs as streamed."""
    kept = record()
    kept.returned_ids = bytearray()
    assert scan_events(STREAM.split(b"\n\n"), kept, lambda r, e: None) == (3, True)
    assert json.loads(b"[" + bytes(kept.returned_ids).rstrip(b",") + b"]") == [5, 6, 7]
    plain = record()
    scan_events(STREAM.split(b"\n\n"), plain, lambda r, e: None)
    assert plain.returned_ids is None
