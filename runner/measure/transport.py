"""A lean HTTP/1.1 streaming transport for the load generator, on asyncio's protocols.

At 1,000+ streams on a couple of cores, a general HTTP client spends most of the
event loop's time parsing (``benchmarks/loadgen.py`` profiles it), so the loop
wakes late and stamps chunks late. This transport does only what a completions
stream needs: one keep-alive connection per user, the request bytes built once
per prompt, the response parsed on bytes (status line and headers, then chunked
transfer decoding, ``Content-Length`` or read-to-close), SSE events split on
``\\n\\n`` and token IDs found by a byte search, all inside ``data_received``, so a
read costs one callback and no coroutine switch. Plain ``http://`` only: anything
else stays on httpx (:func:`supports`).

:func:`run` runs a coroutine on uvloop when it is importable (it ships with vLLM),
else on asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit

from runner import shutdown
from runner.measure.records import RequestRecord

T = TypeVar("T")

TOKEN_IDS_KEY = b'"token_ids":['
CONNECT_TIMEOUT_S = 30.0
# Largest response head accepted; a server sending more is not an engine.
MAX_HEAD_BYTES = 64 * 1024
# Chunk-decoder states besides "bytes left in this chunk" (>= 1).
_SIZE_LINE, _CHUNK_END, _TRAILER = 0, -1, -2


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when available: its loop costs less per read. A signal
    that ends runner cancels the coroutine and is raised once it has unwound
    (:func:`runner.shutdown.interruptible`), never inside a read callback."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(shutdown.interruptible(coro))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(shutdown.interruptible(coro))


def supports(base_url: str) -> bool:
    """Whether this transport can talk to ``base_url`` (plain HTTP with a host)."""
    parts = urlsplit(base_url)
    return parts.scheme == "http" and bool(parts.hostname)


class ProtocolError(Exception):
    """The server broke HTTP/1.1 or closed the connection mid-response."""


class ConnectError(Exception):
    """No connection to the server could be opened."""


class Endpoint:
    """Where requests go and how their bytes start, from the base URL (see :func:`supports`)."""

    def __init__(self, base_url: str, path: str, headers: dict[str, str]) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        host_header = parts.netloc.rpartition("@")[2]
        head = [
            f"POST {parts.path.rstrip('/')}{path} HTTP/1.1",
            f"Host: {host_header}",
            "Accept: */*",
            "Content-Type: application/json",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        self._head = ("\r\n".join(head) + "\r\nContent-Length: ").encode("latin-1")

    def request(self, body: bytes) -> bytes:
        """The full request for a JSON ``body``: built once per prompt, sent as is."""
        return b"%s%d\r\n\r\n%s" % (self._head, len(body), body)


class _StreamProtocol(asyncio.Protocol):
    """One connection; parses each response into the current :class:`RequestRecord`."""

    def __init__(self, on_event: Callable[[RequestRecord, dict], None]) -> None:
        self._on_event = on_event
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._record: RequestRecord | None = None
        self._done: asyncio.Future[None] | None = None

    # ---- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._done is None or self._done.done():
            return
        if self._head is None and self._mode == "close":
            self._finish()  # read-to-close: the close is the end of the body
        else:
            reason = f": {exc}" if exc else ""
            self._fail(ProtocolError(f"server closed the connection mid-response{reason}"))

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            return  # bytes after a complete response: nothing waits for them
        try:
            self._receive(data, time.monotonic())
        except (ValueError, ProtocolError) as exc:  # a malformed response ends this request only
            self._fail(exc)

    # ---- one exchange

    def begin(self, record: RequestRecord, request: bytes) -> asyncio.Future[None]:
        self._record = record
        self._done = asyncio.get_running_loop().create_future()
        self._head: bytes | None = b""
        self.status = 0
        self.keep_alive = True
        self._mode = "close"
        self._left = 0  # Content-Length left, or the chunk decoder's state
        self._chunk_buf = b""
        self._pending = b""
        self._error_body: list[bytes] = []
        self.saw_done = False
        self.transport.write(request)  # type: ignore[union-attr]
        return self._done

    def _finish(self) -> None:
        if self.status != 200:
            text = b"".join(self._error_body).decode(errors="replace")
            self._record.error = f"HTTP {self.status}: {text[:300]}"  # type: ignore[union-attr]
        self._done.set_result(None)  # type: ignore[union-attr]

    def _fail(self, exc: Exception) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()
        if not self._done.done():  # type: ignore[union-attr]
            self._done.set_exception(exc)  # type: ignore[union-attr]

    def _receive(self, data: bytes, arrived: float) -> None:
        if self._head is not None:
            data = self._read_head(data)
            if not data and self._head is not None:
                return
            if self._mode == "length" and self._left == 0:
                self._finish()
                return
        if self._mode == "chunked":
            data = self._dechunk(data)
        elif self._mode == "length":
            data = data[: self._left]
            self._left -= len(data)
        if data:
            if self.status == 200:
                self._events(data, arrived)
            else:
                self._error_body.append(data)
        if (self._mode == "chunked" and self._left == _TRAILER and self._chunk_buf is None) or (
            self._mode == "length" and self._left == 0
        ):
            self._finish()

    def _read_head(self, data: bytes) -> bytes:
        """Collects the status line and headers; returns the body bytes after them."""
        buf = self._head + data if self._head else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                raise ProtocolError("response head larger than 64 KiB")
            self._head = buf
            return b""
        self._head = None
        lines = buf[:end].split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        if not version.startswith(b"HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        self.status = int(rest[:3])
        self.keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding" and value.endswith(b"chunked"):
                self._mode = "chunked"
            elif name == b"content-length" and self._mode != "chunked":
                self._mode, self._left = "length", int(value)
            elif name == b"connection":
                self.keep_alive = value == b"keep-alive" or (self.keep_alive and value != b"close")
        if self._mode == "close":
            self.keep_alive = False
        elif self._mode == "chunked":
            self._left = _SIZE_LINE
        return buf[end + 4 :]

    def _dechunk(self, data: bytes) -> bytes:
        """Chunked transfer decoding; ``_chunk_buf`` becomes None after the last chunk."""
        buf = self._chunk_buf + data if self._chunk_buf else data
        out = []
        pos, size = 0, len(buf)
        while pos < size:
            left = self._left
            if left > 0:
                piece = buf[pos : pos + left]
                out.append(piece)
                pos += len(piece)
                self._left = left - len(piece) or _CHUNK_END
            elif left == _CHUNK_END:
                if size - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._left = _SIZE_LINE
            else:  # a size line, or a trailer line after the last chunk
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = buf[pos:eol]
                pos = eol + 2
                if left == _TRAILER:
                    if not line:
                        self._chunk_buf = None
                        return b"".join(out)
                    continue
                chunk = int(line.partition(b";")[0], 16)
                self._left = chunk if chunk else _TRAILER
        self._chunk_buf = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]

    def _events(self, data: bytes, arrived: float) -> None:
        """SSE events of one read: token IDs counted, the rest handed to ``on_event``."""
        record = self._record
        events = (self._pending + data).split(b"\n\n") if self._pending else data.split(b"\n\n")
        self._pending = events.pop()
        received, done = scan_events(events, record, self._on_event)  # type: ignore[arg-type]
        self.saw_done = self.saw_done or done
        add_read(record, arrived, received)  # type: ignore[arg-type]


def scan_events(
    pieces: list[bytes], record: RequestRecord, on_event: Callable[[RequestRecord, dict], None]
) -> tuple[int, bool]:
    """Count the token IDs in SSE events (or their lines); hand other ``data:`` events on.

    Returns the tokens counted and whether ``[DONE]`` was seen. Both transports parse
    with it, on the hot path: nearly every event is a token chunk, found by a byte
    search (JSON escapes every quote inside a string, so the key cannot be matched
    inside "text") instead of a JSON parse.
    """
    received = 0
    done = False
    for piece in pieces:
        at = piece.find(TOKEN_IDS_KEY)
        if at >= 0:
            ids = piece[at + len(TOKEN_IDS_KEY) : piece.index(b"]", at)]
            if ids.strip():
                received += ids.count(b",") + 1
                record.token_events += 1
                if record.returned_ids is not None:
                    record.returned_ids += ids + b","
            continue
        for line in piece.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                done = True
            else:
                on_event(record, json.loads(payload))
    return received, done


def add_read(record: RequestRecord, arrived: float, received: int) -> None:
    """One chunk per read: the tokens that reached the client together.

    Events a lagging server or client batched into one read share one arrival,
    which is how bursts show (seed 000).
    """
    if received:
        if record.first_token_at is None:
            record.first_token_at = arrived
        record.chunk_times.append(arrived)
        record.chunk_tokens.append(received)


class StreamConnection:
    """One user's keep-alive connection, reopened when the server closed it."""

    def __init__(self, endpoint: Endpoint, on_event: Callable[[RequestRecord, dict], None]):
        self._endpoint = endpoint
        self._on_event = on_event
        self._protocol: _StreamProtocol | None = None

    async def stream(self, record: RequestRecord, request: bytes) -> None:
        """Sends ``request`` and fills ``record`` from the streamed response.

        Raises :class:`ConnectError`, :class:`ProtocolError` or ``ValueError`` (an
        event that is not JSON); an HTTP error status is recorded, not raised.
        """
        protocol = self._protocol
        if protocol is None or protocol.lost or protocol.transport.is_closing():  # type: ignore[union-attr]
            protocol = await self._connect()
        done = protocol.begin(record, request)
        try:
            await done
        except BaseException:
            # Cancelled, timed out or broken mid-response: the connection is
            # mid-stream and cannot carry another request.
            self.close()
            raise
        if not protocol.keep_alive:
            self.close()
        if protocol.status == 200 and not protocol.saw_done and record.error is None:
            record.error = "stream ended without [DONE]"

    async def _connect(self) -> _StreamProtocol:
        self.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, protocol = await loop.create_connection(
                    lambda: _StreamProtocol(self._on_event),
                    self._endpoint.host,
                    self._endpoint.port,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectError(
                f"cannot connect to {self._endpoint.host}:{self._endpoint.port}: {exc}"
            ) from exc
        self._protocol = protocol
        return protocol

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.abort()
        self._protocol = None
