"""The frozen chat-session workload: seeded conversations at exact templated token counts.

Built once per run from the model's own tokenizer and chat template
(:func:`build_sessions`) and frozen into ``workload.jsonl`` with its SHA-256, like the
context mix. The segments (:mod:`runner.workload.conversation`) are cut from the
template's own rendering of the growing conversation: turn k's user segment is what
rendering the conversation through user message k adds to the rendering through answer
k-1, so the template's markers land where the model expects them. Each segment's text
is fitted to its exact count with :func:`runner.workload.exact.fit_text`, on one line
of seeded text: a cut after any token then ends on a word, which templates that trim a
message (Llama 3's) render as it is. A template
that rewrites earlier messages when one is added cannot give a prompt that extends the
previous turn's, and is refused.

The first user message of conversation c opens with c's code (see
:class:`~runner.workload.conversation.InstanceCode`), tokenized apart from the text
around it so that any instance's code takes the same tokens.

``workload.jsonl`` holds one header line, the shared system prompt, then one line per
conversation::

    {"answer_tokens": 64, "code": {...}, "conversations": 32,
     "format": "runner-chat-sessions/1", "seed": 0, "session_total": 1024,
     "shared_prefix_tokens": 257, "system_tokens": 256, "think_time": {...},
     "turns": 6, "turns_configured": 6, "user_tokens": 64}
    {"id": "system", "text": "...", "token_ids": [...]}
    {"answers": [{"text": "...", "token_ids": [...]}, ...], "id": "c0000",
     "think_s": [0.412, ...], "user_turns": [{"text": "...", "token_ids": [...]}, ...]}
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from runner.config import ChatSessionsWorkload, ThinkTime
from runner.errors import WorkloadError
from runner.workload.conversation import ChatSessions, Conversation, InstanceCode, Segment
from runner.workload.exact import (
    PERSONAS,
    apply_template,
    chars_per_token,
    dumps_line,
    encode,
    fit_text,
    require_template,
    write_frozen,
)

log = logging.getLogger("runner")

FORMAT = "runner-chat-sessions/1"
CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
# Six characters of at least 16 each: millions of instances before a code repeats.
CODE_LENGTH = 6
MIN_CODE_CHARACTERS = 16
# Stands for the user's text while the template's markers around it are found.
_MARK = "\u2063runner-mark\u2063"

Message = dict[str, str]
Render = Callable[[list[Message], bool], str]


def build_sessions(tokenizer: Any, workload: ChatSessionsWorkload, context: int) -> ChatSessions:
    """``workload.conversations`` seeded conversations, each segment at its exact count;
    a conversation ends before a turn whose request would pass ``context`` tokens."""
    answer = workload.max_tokens
    if answer is None:
        raise WorkloadError(
            f"Workload {workload.name!r} has no max_tokens. Every answer in a chat session "
            "is forced to max_tokens, and the next turn's prompt counts it; set "
            "workload.max_tokens."
        )
    turns = workload.turns_within(context)
    if turns < 1:
        raise WorkloadError(
            f"The first turn of workload {workload.name!r} totals {workload.total_at(1)} tokens "
            f"(system {workload.system_tokens} + user {workload.user_tokens} + answer "
            f"{answer}), more than the served context of {context}. Lower the counts or "
            "raise engine.max_model_len."
        )
    require_template(tokenizer)
    render = _renderer(tokenizer)
    rng = random.Random(workload.seed)
    per_token = chars_per_token(tokenizer)
    persona = rng.choice(PERSONAS)
    system = fit_text(
        tokenizer,
        lambda text: render([_message("system", f"{persona} {text}")], False),
        random.Random(rng.getrandbits(64)),
        workload.system_tokens,
        per_token,
        what=f"The shared system prompt (workload.system_tokens={workload.system_tokens})",
        around="the chat template's system markers and a persona line",
        fix="Raise workload.system_tokens.",
        separator=" ",
    )
    system_message = _message("system", f"{persona} {system.content}")
    opened = render([system_message, _message("user", _MARK)], True)
    _extends(opened, system.text, "the first user message")
    head, mark, _ = opened[len(system.text) :].partition(_MARK)
    if not mark:
        raise WorkloadError(
            "The chat template changes the user's text as it renders it, so runner cannot "
            "find where a user message sits in the prompt; chat_sessions needs a template "
            "that renders message contents as they are."
        )
    head_ids = encode(tokenizer, head)
    code = _instance_code(tokenizer, len(head_ids), len(head))
    if workload.user_tokens <= len(head_ids) + code.length:
        raise WorkloadError(
            f"The first user turn (workload.user_tokens={workload.user_tokens}) must hold "
            f"more than the {len(head_ids)} tokens of the chat template's user markers and "
            f"the conversation's {code.length}-token code. Raise workload.user_tokens."
        )
    conversations = [
        _conversation(
            index, workload, turns, tokenizer, render, random.Random(rng.getrandbits(64)),
            per_token, system=(system_message, system.text), opening=(head, head_ids),
            code=code,
        )
        for index in range(workload.conversations)
    ]  # fmt: skip
    sessions = ChatSessions(
        system=Segment(system.text, system.token_ids),
        conversations=conversations,
        turns=turns,
        user_tokens=workload.user_tokens,
        answer_tokens=answer,
        code=code,
    )
    log.info(
        "built %d conversations of %d turns (seed %d; the longest request %d tokens)",
        len(conversations), turns, workload.seed, sessions.session_total,
    )  # fmt: skip
    return sessions


def draw_think_s(rng: random.Random, think: ThinkTime) -> float:
    """One pause, in seconds to the millisecond: fixed, or exponential cut at the cap."""
    if think.mean_s == 0:
        return 0.0
    if think.distribution == "fixed":
        return round(think.mean_s, 3)
    return round(min(rng.expovariate(1.0 / think.mean_s), think.longest_s), 3)


def encode_sessions(sessions: ChatSessions, workload: ChatSessionsWorkload) -> bytes:
    """The bytes of ``workload.jsonl``: a header, the system prompt, one line per conversation."""
    code = sessions.code
    header = {
        "format": FORMAT,
        "seed": workload.seed,
        "system_tokens": sessions.system_tokens,
        "user_tokens": sessions.user_tokens,
        "answer_tokens": sessions.answer_tokens,
        "turns": sessions.turns,
        "turns_configured": workload.turns,
        "conversations": len(sessions.conversations),
        "session_total": sessions.session_total,
        "shared_prefix_tokens": sessions.shared_prefix_tokens,
        "think_time": workload.think_time.model_dump(mode="json"),
        "code": {"at": code.at, "characters": code.characters, "length": code.length},
    }
    lines = [dumps_line(header), dumps_line({"id": "system", **asdict(sessions.system)})]
    lines += [dumps_line(asdict(conversation)) for conversation in sessions.conversations]
    return ("\n".join(lines) + "\n").encode("ascii")


def write_sessions(sessions: ChatSessions, workload: ChatSessionsWorkload, path: Path) -> str:
    """Write ``workload.jsonl`` (atomically) and return its SHA-256 hex digest."""
    return write_frozen(encode_sessions(sessions, workload), path)


def _conversation(
    index: int,
    workload: ChatSessionsWorkload,
    turns: int,
    tokenizer: Any,
    render: Render,
    rng: random.Random,
    per_token: float,
    *,
    system: tuple[Message, str],
    opening: tuple[str, list[int]],
    code: InstanceCode,
) -> Conversation:
    """Conversation ``index``: its user turns, the seeded answers between them, its pauses."""
    users, answer = workload.user_tokens, workload.max_tokens or 0
    system_message, system_text = system
    head, head_ids = opening
    spelled, code_ids = code.spell(index)
    opened = system_text + head + spelled

    def after_code(text: str) -> str:
        full = render([system_message, _message("user", f"{spelled} {text}")], True)
        _extends(full, opened, "the first user message")
        return full[len(opened) :]

    rest = fit_text(
        tokenizer,
        after_code,
        rng,
        users - len(head_ids) - code.length,
        per_token,
        what=f"The first user turn (workload.user_tokens={users})",
        around=f"the chat template's user and assistant markers after the {code.length}-token code",
        fix="Raise workload.user_tokens.",
        separator=" ",
    )
    messages = [system_message, _message("user", f"{spelled} {rest.content}")]
    first = Segment(head + spelled + rest.text, [*head_ids, *code_ids, *rest.token_ids])
    rendered = system_text + first.text
    # Another instance's code must change those characters and nothing else.
    other, _ = code.spell(index + 1)
    if render([system_message, _message("user", f"{other} {rest.content}")], True) != (
        system_text + head + other + rest.text
    ):
        raise WorkloadError(
            "The chat template renders a user message differently depending on its first "
            "characters, so a conversation's opening code cannot be changed token for "
            "token; chat_sessions needs a template that renders message contents as they are."
        )
    user_turns, answers = [first], []
    for turn in range(2, turns + 1):
        said = fit_text(
            tokenizer, _sentence, rng, answer, per_token,
            what=f"A seeded answer (workload.max_tokens={answer})", around="nothing",
            fix="Raise workload.max_tokens.", separator=" ",
        )  # fmt: skip
        before = rendered + said.text
        messages.append(_message("assistant", said.text))
        history = list(messages)

        def tail(
            text: str, history: list[Message] = history, before: str = before, turn: int = turn
        ) -> str:
            full = render([*history, _message("user", text)], True)
            _extends(full, before, f"user turn {turn}")
            return full[len(before) :]

        asked = fit_text(
            tokenizer, tail, rng, users, per_token,
            what=f"User turn {turn} (workload.user_tokens={users})",
            around="the chat template's close of the answer before it and its own markers",
            fix="Raise workload.user_tokens.", separator=" ",
        )  # fmt: skip
        answers.append(Segment(said.text, said.token_ids))
        user_turns.append(Segment(asked.text, asked.token_ids))
        messages.append(_message("user", asked.content))
        rendered = before + asked.text
    return Conversation(
        id=f"c{index:04d}",
        user_turns=user_turns,
        answers=answers,
        think_s=[draw_think_s(rng, workload.think_time) for _ in range(turns)],
    )


def _instance_code(tokenizer: Any, at: int, text_at: int) -> InstanceCode:
    """The code alphabet: the characters this tokenizer encodes as one token each."""
    characters, ids = [], []
    for character in CODE_ALPHABET:
        encoded = encode(tokenizer, character)
        if len(encoded) == 1 and encoded[0] not in ids:
            characters.append(character)
            ids.append(encoded[0])
    if len(ids) < MIN_CODE_CHARACTERS:
        raise WorkloadError(
            f"The tokenizer encodes only {len(ids)} of the characters {CODE_ALPHABET} as one "
            f"token each; chat_sessions needs {MIN_CODE_CHARACTERS} to give every "
            "conversation its own opening code."
        )
    return InstanceCode(
        at=at, text_at=text_at, characters="".join(characters), token_ids=ids, length=CODE_LENGTH
    )


def _renderer(tokenizer: Any) -> Render:
    def render(messages: list[Message], generation: bool) -> str:
        try:
            return apply_template(tokenizer, messages, generation)
        except TemplateError as exc:
            raise WorkloadError(
                f"The chat template refused a conversation ({exc}). chat_sessions renders a "
                "system message and alternating user and assistant messages; serve a chat "
                "model whose template takes them."
            ) from exc

    return render


def _extends(full: str, before: str, what: str) -> None:
    if not full.startswith(before):
        raise WorkloadError(
            f"The chat template does not render a conversation as a growing text: adding "
            f"{what} changes what came before it, so a turn's prompt could not extend the "
            "previous turn's token for token and the prefix cache could not reuse it. "
            "chat_sessions needs a template that appends each message as it comes (one that "
            "rewrites earlier turns, e.g. drops earlier reasoning, cannot be measured this way)."
        )


def _message(role: str, content: str) -> Message:
    return {"role": role, "content": content}


def _sentence(text: str) -> str:
    """A seeded answer's text: ended with a full stop, never with a space, which a
    template that trims messages (Llama 3's) would drop from the rendered history."""
    return text.rstrip() + "."
