"""N persistent streaming users against vLLM's ``/v1/completions`` (seed 004 sections 6-7).

Each user is a coroutine (:class:`StreamingUsers` holds them, their connections and
their records). A :class:`LoadGenerator` user sends its next request the moment the
last one ends (zero think time); chat-session users, which pause between turns, are
:class:`runner.measure.sessions.SessionUsers`. User ``i`` belongs to context bucket ``i % n_buckets`` (buckets
in workload order), so every bucket stays represented at any N, and the users of
a bucket take that bucket's prompts in order from one shared cursor, so no two
requests in flight carry the same prompt.

Per-event work is kept to a byte search for the token IDs and a comma count (JSON
is parsed only for the usage summary and errors), and per read to two array
appends: at 1,000+ streams on a couple of cores the client, not the server, would
otherwise set the pace (``benchmarks/loadgen.py`` measures it). For the same reason
plain-HTTP engines are driven through :mod:`runner.transport` (one keep-alive
connection per user, parsed on bytes in asyncio's protocol callbacks); HTTPS, or
``transport="httpx"``, goes through httpx with the same parsing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from itertools import count
from typing import Any, Required, Self, TypedDict, Unpack

import httpx

from runner.measure import transport as lean
from runner.measure.records import RequestRecord
from runner.workload.prompt import Prompt, assign_buckets, prompts_by_bucket

log = logging.getLogger("runner")

# After a failed request a user waits this long before the next one, so that a dead
# server yields a handful of error records instead of a hot loop of thousands.
ERROR_BACKOFF_S = 0.5
COMPLETIONS_PATH = "/v1/completions"


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# Users per HTTP client. httpcore's pool scans every connection on each request, so
# one pool of 1,000 connections costs O(users) per request and starves the event
# loop; many small pools keep that scan short. Each pool holds one connection per
# user, so httpx's default cap of 100 connections never limits concurrency.
USERS_PER_CLIENT = 16


class UserSettings(TypedDict, total=False):
    """How every request is sent: the keyword arguments of :class:`StreamingUsers`."""

    served_name: Required[str]
    ignore_eos: Required[bool]
    temperature: Required[float]
    request_timeout_s: Required[float]
    headers: dict[str, str] | None
    transport: str
    cache_salt: str | None


class StreamingUsers(ABC):
    """``users`` persistent streams over one transport, until :meth:`stop_dispatch` is
    called; a subclass says what each user sends (its ``_user`` coroutine)."""

    user_buckets: list[int]  # the bucket total of each user, set by the subclass

    def __init__(
        self,
        base_url: str,
        users: int,
        *,
        served_name: str,
        ignore_eos: bool,
        temperature: float,
        request_timeout_s: float,
        headers: dict[str, str] | None = None,
        transport: str = "lean",
        cache_salt: str | None = None,
    ) -> None:
        if users < 1:
            raise ValueError(f"users must be at least 1, got {users}")
        self.users = users
        self._served_name = served_name
        self._ignore_eos = ignore_eos
        self._temperature = temperature
        self._request_timeout_s = request_timeout_s
        # Keeps this load's prompts apart in the engine's prefix cache (vLLM cache_salt).
        self._cache_salt = cache_salt
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.records: list[RequestRecord] = []
        # The lean transport (runner.transport) for plain HTTP; httpx for HTTPS, or
        # when asked for ("httpx"), e.g. to compare the two.
        self._endpoint: lean.Endpoint | None = None
        self._connections: list[lean.StreamConnection] = []
        self._clients: list[httpx.AsyncClient] = []
        if transport == "lean" and lean.supports(base_url):
            self._endpoint = lean.Endpoint(base_url, COMPLETIONS_PATH, headers or {})
            self._connections = [
                lean.StreamConnection(self._endpoint, self._other_event) for _ in range(users)
            ]
            return
        if transport not in ("lean", "httpx"):
            raise ValueError(f"transport must be 'lean' or 'httpx', got {transport!r}")
        ssl_context = httpx.create_ssl_context()  # once: building one per client is slow
        per_client = httpx.Limits(
            max_connections=USERS_PER_CLIENT, max_keepalive_connections=USERS_PER_CLIENT
        )
        self._clients = [
            httpx.AsyncClient(
                base_url=base_url,
                headers={**(headers or {}), "Content-Type": "application/json"},
                limits=per_client,
                timeout=httpx.Timeout(request_timeout_s, connect=30.0),
                verify=ssl_context,
            )
            for _ in range(-(-users // USERS_PER_CLIENT))
        ]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.stop_dispatch()
        await self.drain(0)
        await asyncio.gather(*(client.aclose() for client in self._clients))
        for connection in self._connections:
            connection.close()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._user(i), name=f"user-{i}") for i in range(self.users)
        ]

    async def wait_users(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` (None: no limit) for every user to stop on its own,
        which only ``max_requests`` makes them do; nothing is cancelled. True if they did."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        return not pending

    def stop_dispatch(self) -> None:
        """No user sends another request; requests in flight continue."""
        self._stopping.set()

    async def drain(self, timeout_s: float) -> int:
        """Wait for the requests in flight; cancel what is left after ``timeout_s``.

        Returns how many requests had to be cancelled (each is an error record).
        """
        if not self._tasks:
            return 0
        _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            if timeout_s > 0:
                log.warning(
                    "%d request(s) still streaming after the %g s drain timeout were cancelled",
                    len(pending),
                    timeout_s,
                )
            await asyncio.wait(pending)
        return len(pending)

    def _request(self, max_tokens: int) -> dict[str, Any]:
        """The fields of every request but its prompt."""
        request: dict[str, Any] = {
            "model": self._served_name,
            # Always explicit: without it vLLM silently stops at 16 tokens (seed 004 §12).
            "max_tokens": max_tokens,
            # Forced length without min_tokens: its logits processor costs every decode
            # step (15-30% of the tiny CPU engine's rate at one user, against vLLM's own
            # benchmark client, which sends ignore_eos alone). The smoke checks keep it,
            # and a short answer still shows in each request's usage count.
            "ignore_eos": self._ignore_eos,
            "temperature": self._temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if self._cache_salt is not None:
            request["cache_salt"] = self._cache_salt
        return request

    def _wire(self, body: bytes) -> bytes:
        """What :meth:`_send` takes: the whole HTTP request on the lean transport."""
        return self._endpoint.request(body) if self._endpoint is not None else body

    @abstractmethod
    async def _user(self, user: int) -> None:
        """User ``user``'s requests, one after the other, until dispatch stops."""

    async def _send(self, user: int, record: RequestRecord, body: bytes) -> None:
        """``body`` is the full HTTP request on the lean transport, the JSON on httpx."""
        try:
            async with asyncio.timeout(self._request_timeout_s):
                if self._endpoint is not None:
                    await self._connections[user].stream(record, body)
                else:
                    await self._stream(self._clients[user // USERS_PER_CLIENT], record, body)
        except asyncio.CancelledError:
            record.error = "cancelled: still running when the drain timeout ran out"
            raise
        except TimeoutError:
            record.error = f"timeout: no completion within {self._request_timeout_s:g} s"
        except (httpx.HTTPError, lean.ConnectError, lean.ProtocolError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # a data: line that is not JSON
            record.error = f"unreadable stream event: {exc}"
        finally:
            record.finished_at = time.monotonic()

    async def _stream(self, client: httpx.AsyncClient, record: RequestRecord, body: bytes) -> None:
        async with client.stream("POST", COMPLETIONS_PATH, content=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:300]}"
                return
            pending = b""
            done = False
            async for data in response.aiter_bytes():
                arrived = time.monotonic()
                lines = (pending + data).split(b"\n") if pending else data.split(b"\n")
                pending = lines.pop()
                received, saw_done = lean.scan_events(lines, record, self._other_event)
                done = done or saw_done
                lean.add_read(record, arrived, received)
            if not done and record.error is None:
                record.error = "stream ended without [DONE]"

    @staticmethod
    def _other_event(record: RequestRecord, event: dict) -> None:
        """A ``data:`` event without token IDs: the usage summary or an error."""
        if event.get("choices"):
            return  # e.g. a final chunk with only a finish reason
        usage = event.get("usage")
        if usage:
            record.usage_completion_tokens = usage.get("completion_tokens")
        elif "error" in event:
            record.error = f"stream error: {str(event['error'])[:300]}"


class LoadGenerator(StreamingUsers):
    """Users that each send their bucket's next prompt the moment the last one ends."""

    def __init__(
        self,
        base_url: str,
        prompts: Sequence[Prompt],
        users: int,
        *,
        max_requests: int | None = None,
        **settings: Unpack[UserSettings],
    ) -> None:
        if not prompts:
            raise ValueError("the workload has no prompts")
        super().__init__(base_url, users, **settings)
        self._buckets = prompts_by_bucket(list(prompts))
        self.user_buckets = assign_buckets(users, list(self._buckets))
        self._cursors = {total: count() for total in self._buckets}
        # A fixed-size benchmark (seed 000's --num-prompts) ends once the users
        # together have sent this many requests; None keeps them going until stopped.
        self._max_requests = max_requests
        self._bodies: dict[str, bytes] = {}

    def _body(self, prompt: Prompt) -> bytes:
        body = self._bodies.get(prompt.id)
        if body is None:
            request = {**self._request(prompt.max_tokens), "prompt": prompt.token_ids}
            body = self._wire(json.dumps(request, separators=(",", ":")).encode())
            self._bodies[prompt.id] = body
        return body

    def _next_prompt(self, bucket_total: int) -> Prompt:
        prompts = self._buckets[bucket_total]
        return prompts[next(self._cursors[bucket_total]) % len(prompts)]

    async def _user(self, user: int) -> None:
        bucket_total = self.user_buckets[user]
        while not self._stopping.is_set():
            if self._max_requests is not None and len(self.records) >= self._max_requests:
                return
            prompt = self._next_prompt(bucket_total)
            record = RequestRecord(
                user=user,
                bucket_total=bucket_total,
                prompt_id=prompt.id,
                dispatched_at=time.monotonic(),
            )
            self.records.append(record)
            await self._send(user, record, self._body(prompt))
            if record.error is not None and not self._stopping.is_set():
                await asyncio.sleep(ERROR_BACKOFF_S)
