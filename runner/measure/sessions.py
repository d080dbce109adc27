"""Chat-session users: each walks a conversation turn by turn, pausing between turns.

A user sends turn k's prompt (:mod:`runner.workload.conversation`: the shared system
prompt and the history so far), reads the answer as it streams, then pauses for the
conversation's think time before turn k+1, whose prompt is turn k's prompt, the token
IDs the engine streamed back for answer k (``return_token_ids``), and user turn k+1. So
every prompt extends the one before it token for token, as a chat client's does, and a
prefix cache can reuse all of it, the engine's own answer included. Every answer is
forced to the workload's length (``ignore_eos``), so counts stay
exact whatever the engine answers.

After the last turn, or after a request that failed or came back short (its history
cannot be extended), the user pauses and starts the next conversation instance from a
cursor shared by all users: instance i is conversation ``i % conversations`` with its
own opening code, so no two instances share more than the system prompt.

At the start of a load every user would otherwise be at turn 1 together; instead user
u joins its first conversation at turn ``1 + u % turns`` with the seeded answers as the
history it did not see, so a window meets the mix of turns of a steady state. Joining
takes one cold prefill of that history, in the warm-up.

Each request's record carries the pause its user takes after it (``think_after_s``),
so the window's offered-load gate counts only the rest of the window as time the user
should have had a request in flight (:func:`runner.measure.gates.offered_load`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from itertools import count
from typing import Unpack

from runner.measure.load import ERROR_BACKOFF_S, StreamingUsers, UserSettings
from runner.measure.records import RequestRecord
from runner.workload.conversation import ChatSessions

log = logging.getLogger("runner")


class SessionUsers(StreamingUsers):
    """``users`` chat users over ``sessions`` until :meth:`stop_dispatch` is called."""

    def __init__(
        self,
        base_url: str,
        sessions: ChatSessions,
        users: int,
        **settings: Unpack[UserSettings],
    ) -> None:
        super().__init__(base_url, users, **settings)
        self.sessions = sessions
        # Every user's requests fall in one "bucket": the conversation's longest request.
        self.user_buckets = [sessions.session_total] * users
        self._instances = count()
        # The request's JSON up to its prompt (the last key), which each turn completes.
        self._opening = json.dumps(
            {**self._request(sessions.answer_tokens), "prompt": []}, separators=(",", ":")
        ).encode()[: -len(b"[]}")]

    async def _user(self, user: int) -> None:
        sessions = self.sessions
        instance = next(self._instances)
        turn = 1 + user % sessions.turns
        history = [_csv(piece) for piece in sessions.history(instance, turn)]
        while not self._stopping.is_set():
            record = RequestRecord(
                user=user,
                bucket_total=sessions.session_total,
                prompt_id=f"{sessions.conversation(instance).id}-i{instance}-t{turn}",
                dispatched_at=time.monotonic(),
                returned_ids=bytearray(),
            )
            self.records.append(record)
            await self._send(user, record, self._body(history))
            answer, record.returned_ids = bytes(record.returned_ids or b"").rstrip(b","), None
            if (
                record.error is None
                and record.tokens == sessions.answer_tokens
                and turn < sessions.turns
            ):
                turn += 1
                history += [answer, _csv(sessions.user_turn(instance, turn))]
            else:
                if record.error is None and record.tokens != sessions.answer_tokens:
                    log.warning(
                        "user %d: answer of %d tokens, not %d; starting a new conversation",
                        user, record.tokens, sessions.answer_tokens,
                    )  # fmt: skip
                instance, turn = next(self._instances), 1
                history = [_csv(piece) for piece in sessions.history(instance, turn)]
            if record.error is not None:
                await self._pause(time.monotonic() + ERROR_BACKOFF_S)
                continue
            record.think_after_s = sessions.conversation(instance).think_s[turn - 1]
            assert record.finished_at is not None  # _send always stamps it
            await self._pause(record.finished_at + record.think_after_s)

    def _body(self, history: list[bytes]) -> bytes:
        return self._wire(b"%s[%s]}" % (self._opening, b",".join(history)))

    async def _pause(self, until: float) -> None:
        """Wait until the monotonic ``until``, or less if dispatch stops meanwhile."""
        delay = until - time.monotonic()
        if delay <= 0 or self._stopping.is_set():
            return
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
        except TimeoutError:
            pass


def _csv(token_ids: list[int]) -> bytes:
    """Token IDs as the JSON text between a list's brackets."""
    return ",".join(map(str, token_ids)).encode()
