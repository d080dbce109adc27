"""Multi-turn conversations at exact token counts: what chat-session users send (pure).

A conversation is a row of segments, each the token IDs the chat template adds for one
step of it::

    system | user 1 | answer 1 | user 2 | answer 2 | ... | user T

``system`` is the same for every conversation (the shared system prompt, template
markers and BOS included); ``user k`` is what turn k adds before its answer: for k = 1
the user message after the system prompt, for k > 1 the template's close of answer
k-1 and the user message (its markers and the assistant's opening included). Turn k's
prompt is the segments up to ``user k``, so it extends turn k-1's prompt token for
token and a prefix cache can reuse all of it.

Every segment was tokenized on its own and the IDs are what is sent, so counts are
exact by construction: turn k's prompt holds ``system_tokens + k * user_tokens +
(k - 1) * answer_tokens`` tokens. What a live user sends as answer k is the IDs the
engine streamed back for it (exactly ``answer_tokens``, forced); the seeded answers
here stand in for the answers of turns a user did not see, when it joins a
conversation half-way at the start of a window (:mod:`runner.measure.sessions`).

Conversation *instances*: the first user message opens with a code of single-token
characters spelled per instance, so instances share the system prompt and the user's
opening markers and no more (two instances whose numbers agree modulo the alphabet's
size, at least 16 apart, share a code token or two: never enough for a cache block of
their own), however many users and restarts a window holds. Instance i follows
conversation ``i % len(conversations)``; instance c < len(conversations) is conversation
c exactly as frozen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

from runner.workload.prompt import Prompt


@dataclass(frozen=True)
class Segment:
    """One step of a conversation: the template's text for it, and its token IDs."""

    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Conversation:
    """A seeded conversation: user turns, stand-in answers and the pauses between."""

    id: str
    user_turns: list[Segment]  # turn k's new tokens before its answer (index k-1)
    answers: list[Segment]  # seeded answers to turns 1..T-1, for users joining half-way
    think_s: list[float]  # pause before turn k (index k-1); [0] precedes a new conversation


@dataclass(frozen=True)
class InstanceCode:
    """Where the per-instance code sits in every first user turn, and how it is spelled."""

    at: int  # token index inside the first user turn
    text_at: int  # character index inside its text
    characters: str  # the alphabet, each character one token of its own
    token_ids: list[int]  # the alphabet's token IDs
    length: int

    def spell(self, instance: int) -> tuple[str, list[int]]:
        """Instance ``instance``'s code, as text and token IDs: its digits in base
        len(alphabet), the lowest first, so that instances close in number (the ones a
        window runs together) differ from the code's first token on."""
        base = len(self.token_ids)
        digits = []
        for _ in range(self.length):
            instance, digit = divmod(instance, base)
            digits.append(digit)
        return "".join(self.characters[d] for d in digits), [self.token_ids[d] for d in digits]


@dataclass(frozen=True)
class ChatSessions(Sequence[Prompt]):
    """The frozen chat-session workload.

    As a sequence it is the prompts of one whole conversation, turn 1 to the last,
    with the seeded answers as history: what a single-request check (the smoke checks,
    the reference client) sends; the session users walk :attr:`conversations`.
    """

    system: Segment
    conversations: list[Conversation]
    turns: int  # turns per conversation, after the served context's cap
    user_tokens: int
    answer_tokens: int
    code: InstanceCode
    _prompts: list[Prompt] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_prompts", [self.prompt(0, turn) for turn in range(1, self.turns + 1)]
        )

    @property
    def system_tokens(self) -> int:
        return len(self.system.token_ids)

    @property
    def session_total(self) -> int:
        """Prompt plus answer of a conversation's last turn: its longest request."""
        return self.total(self.turns)

    @property
    def shared_prefix_tokens(self) -> int:
        """Tokens every conversation instance shares: system prompt and user opening."""
        return self.system_tokens + self.code.at

    def prompt_tokens(self, turn: int) -> int:
        return self.system_tokens + turn * self.user_tokens + (turn - 1) * self.answer_tokens

    def total(self, turn: int) -> int:
        return self.prompt_tokens(turn) + self.answer_tokens

    def conversation(self, instance: int) -> Conversation:
        return self.conversations[instance % len(self.conversations)]

    def user_turn(self, instance: int, turn: int) -> list[int]:
        """The token IDs turn ``turn`` of instance ``instance`` adds before its answer."""
        ids = self.conversation(instance).user_turns[turn - 1].token_ids
        if turn > 1:
            return ids
        _, code = self.code.spell(instance)
        return [*ids[: self.code.at], *code, *ids[self.code.at + self.code.length :]]

    def history(self, instance: int, turn: int) -> list[list[int]]:
        """Turn ``turn``'s prompt of instance ``instance``, segment by segment, with the
        seeded answers for the turns before it."""
        conversation = self.conversation(instance)
        pieces = [self.system.token_ids, self.user_turn(instance, 1)]
        for earlier in range(1, turn):
            pieces += [
                conversation.answers[earlier - 1].token_ids,
                self.user_turn(instance, earlier + 1),
            ]
        return pieces

    def prompt(self, instance: int, turn: int) -> Prompt:
        conversation = self.conversation(instance)
        texts = [self.system.text, self._first_text(instance)]
        for earlier in range(1, turn):
            texts += [conversation.answers[earlier - 1].text, conversation.user_turns[earlier].text]
        ids = [token for piece in self.history(instance, turn) for token in piece]
        return Prompt(
            id=f"{conversation.id}-i{instance}-t{turn}",
            bucket_total=self.total(turn),
            prompt_tokens=len(ids),
            max_tokens=self.answer_tokens,
            token_ids=ids,
            text="".join(texts),
        )

    def _first_text(self, instance: int) -> str:
        """The first user turn's text with ``instance``'s code in place of the frozen one's."""
        text = self.conversation(instance).user_turns[0].text
        spelled, _ = self.code.spell(instance)
        return text[: self.code.text_at] + spelled + text[self.code.text_at + self.code.length :]

    def __len__(self) -> int:
        return len(self._prompts)

    @overload
    def __getitem__(self, index: int) -> Prompt: ...
    @overload
    def __getitem__(self, index: slice) -> list[Prompt]: ...
    def __getitem__(self, index: int | slice) -> Prompt | list[Prompt]:
        return self._prompts[index]
