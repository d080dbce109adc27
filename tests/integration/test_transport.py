"""The lean HTTP/1.1 transport against a loopback server that controls every byte.

vLLM's server (uvicorn) answers in chunked transfer encoding, nginx and proxies
often with Content-Length or read-to-close; whatever the split of the bytes into
reads, the record must carry every token, the usage and the right error.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from runner.measure.records import RequestRecord
from runner.measure.transport import ConnectError, Endpoint, StreamConnection

pytestmark = pytest.mark.integration

TOKENS = 40


def sse_events(tokens: int, done: bool = True) -> bytes:
    """Compact JSON as vLLM writes it; texts with quotes and blank lines inside."""
    chunks = [
        {"choices": [{"text": f'"t{i}\\n\\n', "token_ids": [i, i + 1]}]} for i in range(tokens)
    ]
    usage = {"choices": [], "usage": {"completion_tokens": 2 * tokens}}
    events = ["data: " + json.dumps(event, separators=(",", ":")) for event in [*chunks, usage]]
    if done:
        events.append("data: [DONE]")
    return "".join(event + "\n\n" for event in events).encode()


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def serve(responses: list[bytes], write_size: int, requests_seen: list[bytes]):
    """A server answering its connections' requests with ``responses`` in order."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while responses:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            requests_seen.append(head + await reader.readexactly(length))
            response = responses.pop(0)
            for i in range(0, len(response), write_size):
                writer.write(response[i : i + write_size])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def on_event(record: RequestRecord, event: dict) -> None:
    if event.get("usage"):
        record.usage_completion_tokens = event["usage"]["completion_tokens"]


async def exchange(responses: list[bytes], write_size: int, requests: int = 1):
    seen: list[bytes] = []
    server = await serve(list(responses), write_size, seen)
    port = server.sockets[0].getsockname()[1]
    endpoint = Endpoint(f"http://127.0.0.1:{port}/base", "/v1/completions", {"X-Key": "k"})
    connection = StreamConnection(endpoint, on_event)
    records = []
    for i in range(requests):
        record = RequestRecord(user=0, bucket_total=1, prompt_id=f"p{i}", dispatched_at=0.0)
        await connection.stream(record, endpoint.request(b'{"n":1}'))
        records.append(record)
    connection.close()
    server.close()
    return records, seen


@pytest.mark.parametrize("write_size", [1, 7, 64, 100_000])
def test_chunked_stream_any_split_every_token_and_reused_connection(write_size: int) -> None:
    body = sse_events(TOKENS)
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(body, 50)
    records, seen = asyncio.run(exchange([response, response], write_size, requests=2))
    for record in records:
        assert record.error is None
        assert record.tokens == 2 * TOKENS == record.usage_completion_tokens
        assert record.token_events == TOKENS  # two token IDs per event
        assert record.first_token_at == record.chunk_times[0]
    assert seen[0].startswith(b"POST /base/v1/completions HTTP/1.1\r\n")
    assert b"\r\nX-Key: k\r\n" in seen[0] and seen[0].endswith(b'\r\n\r\n{"n":1}')


def test_content_length_and_read_to_close_bodies() -> None:
    body = sse_events(TOKENS)
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    closing = b"HTTP/1.0 200 OK\r\n\r\n" + body
    records, _ = asyncio.run(exchange([sized], 13))
    assert records[0].error is None and records[0].tokens == 2 * TOKENS
    records, _ = asyncio.run(exchange([closing], 13))
    assert records[0].error is None and records[0].tokens == 2 * TOKENS


def test_http_error_body_is_recorded() -> None:
    """A refused request (e.g. a prompt over max-model-len) keeps the server's reason."""
    text = b'{"error":{"message":"prompt too long","code":400}}'
    response = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text)
    records, _ = asyncio.run(exchange([response], 5))
    assert records[0].error == f"HTTP 400: {text.decode()}"
    assert records[0].tokens == 0


def test_stream_without_done_is_an_error() -> None:
    body = sse_events(3, done=False)
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(body, 64)
    records, _ = asyncio.run(exchange([response], 64))
    assert records[0].error == "stream ended without [DONE]"
    assert records[0].tokens == 6


def test_connection_closed_mid_stream_raises() -> None:
    body = sse_events(3)
    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body) + 10, body)
    with pytest.raises(Exception, match="closed the connection mid-response"):
        asyncio.run(exchange([response], 64))


def test_refused_connection_raises_connect_error() -> None:
    async def refused() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        endpoint = Endpoint(f"http://127.0.0.1:{port}", "/v1/completions", {})
        record = RequestRecord(user=0, bucket_total=1, prompt_id="p", dispatched_at=0.0)
        await StreamConnection(endpoint, on_event).stream(record, endpoint.request(b"{}"))

    with pytest.raises(ConnectError, match="cannot connect"):
        asyncio.run(refused())
