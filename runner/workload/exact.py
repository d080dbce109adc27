"""Seeded chat text cut to an exact token count, and frozen workload files.

What both frozen workloads share (:mod:`runner.workload.context_mix`,
:mod:`runner.workload.chat_sessions`): chat-like paragraphs from a seed, a text that can
be cut after any token, and :func:`fit_text`, which moves the cut until a rendered text
(a whole templated prompt, or one message's part of it) holds exactly the target count.
The cut is found from one tokenization of the text; the rendered text is tokenized
again and the cut moves by the difference until the count is exact (a merge across the
cut can skip a count; then the cut is tried between characters). The ids returned are
always the tokenization of the returned text with ``add_special_tokens=False``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from runner.errors import WorkloadError

log = logging.getLogger("runner")

# Templates that print a date (Llama 3.x) would otherwise change the text, and the
# hash, from one day to the next.
TEMPLATE_DATE = "26 Jul 2024"
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
# Cuts tried per text: first on token boundaries, then between characters.
_BOUNDARY_ATTEMPTS = 24
_CHARACTER_ATTEMPTS = 24
# Seeded texts tried before a count is declared out of reach.
_TEXT_ATTEMPTS = 4
_SLOT = re.compile(r"\{(\w+)\}")

_NAMES = (
    "Ada Bruno Chen Dalia Emeka Farah Goran Hana Ivo Jun Kemal Lena Mateo Nia Omar "
    "Priya Quinn Rosa Sami Tomas Uma Viktor Wen Yara Zoltan Ines Kofi Mirela Arjun Elif"
).split()
PERSONAS = (
    "You are a patient assistant who explains things step by step.",
    "You help with everyday planning and keep answers practical.",
    "You are a careful reviewer who points out risks and trade-offs.",
    "You answer like a friendly teacher and give short examples.",
    "You are a concise technical writer; prefer lists over long prose.",
    "You act as a travel and logistics helper with an eye for detail.",
    "You are a thoughtful editor who suggests clearer wording.",
    "You help small businesses reason about costs and customers.",
)
_TOPICS = (
    "a vegetable garden on a north-facing balcony", "the quarterly budget for a bakery",
    "a bicycle that keeps losing its chain", "moving a family to another city",
    "a school project about river pollution", "the backup plan for a wedding in the rain",
    "learning the cello as an adult", "a leaking kitchen tap", "the timetable of a night bus",
    "a spreadsheet of club membership fees", "training a shy rescue dog",
    "a short story about a lighthouse keeper", "insulating an old attic",
    "a weekly meal plan for four people", "the rules of a new board game",
    "a hiking route through the hills", "a community radio show", "repainting a wooden fence",
    "a research poster on sleep and memory", "a second-hand camera lens",
    "the seating plan for a conference dinner", "a noisy upstairs neighbour",
    "a beginner course in bookkeeping", "a greenhouse that overheats in summer",
)
_ASKS = (
    "Could you walk me through {topic}?", "What would you do first about {topic}?",
    "I keep going back and forth on {topic}.", "Here is where I am with {topic}.",
    "My {relative} asked me about {topic} and I was not sure.",
    "Is it reasonable to spend {number} {unit} on {topic}?",
    "What am I missing about {topic}?", "Please compare two ways of handling {topic}.",
)
_DETAILS = (
    "Last {day} I tried to {verb} it, but it took {number} {unit} longer than planned.",
    "The {adjective} part is that nobody wrote down how it was done before.",
    "My {relative} thinks we should {verb} everything at once, which sounds {adjective}.",
    "We have about {number} {unit} to spare, and the deadline is next {day}.",
    "A neighbour said it is {adjective} to {verb} it without help.",
    "I made a list: {item}, {item}, and maybe {item}.",
    "The first attempt was {adjective}; the second one went a little better.",
    "On {day} morning it looked fine, and by the evening it did not.",
    "I would rather not buy {item} unless it really saves time.",
    "If it matters, the budget is {number} euros and the space is small.",
    "Someone online suggested we {verb} it twice, but I doubt that helps.",
    "Honestly, I am not sure whether {item} or {item} is the better choice.",
)
_CLOSES = (
    "Thanks for reading this far.", "Any advice is welcome.", "Please be specific.",
    "A rough plan would already help.", "Tell me if I should give more details.",
)
_SLOTS = {
    "relative": "sister brother cousin colleague flatmate grandmother uncle friend".split(),
    "day": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
    "verb": "fix measure plan sort rebuild label clean redesign test schedule".split(),
    "adjective": "tricky surprising tedious risky simple expensive confusing slow".split(),
    "unit": "hours days weeks evenings minutes".split(),
    "item": (
        "a ladder;a notebook;new screws;a second opinion;a cheaper supplier;"
        "an extra shelf;a timer;better gloves;a paper map;spare batteries"
    ).split(";"),
}


def dumps_line(value: dict[str, Any]) -> str:
    """One line of a frozen workload: keys sorted, separators fixed, ASCII only, so the
    same seed and tokenizer give the same bytes, hence the same SHA-256, anywhere."""
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def write_frozen(data: bytes, path: Path) -> str:
    """Write a frozen workload file (atomically) and return its SHA-256 hex digest."""
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_bytes(data)
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise WorkloadError(
            f"The workload could not be written to {path} ({exc}). Check that the "
            "results folder is writable and the disk is not full."
        ) from exc
    return hashlib.sha256(data).hexdigest()


def unique_code(rng: random.Random, taken: set[str]) -> str:
    """A seeded ``XXXX-XXXX`` code not in ``taken`` (added to it)."""
    while True:
        code = "".join(rng.choices(_CODE_ALPHABET, k=4)) + "-" + "".join(
            rng.choices(_CODE_ALPHABET, k=4)
        )
        if code not in taken:
            taken.add(code)
            return code


def require_template(tokenizer: Any) -> None:
    """Refuse a tokenizer without a chat template: counts are taken after it."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise WorkloadError(
            "The tokenizer has no chat template. Prompt lengths are counted after the "
            "model's own chat template (seed 004 section 6), so serve an instruct/chat "
            "checkpoint or add its template to tokenizer_config.json."
        )


def apply_template(tokenizer: Any, messages: list[dict[str, str]], generation: bool = True) -> str:
    """``messages`` through the model's own chat template, as text."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation, date_string=TEMPLATE_DATE
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """What a server makes of ``text``: no BOS added, the template already has it."""
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def chars_per_token(tokenizer: Any) -> float:
    """The tokenizer's characters per token on seeded chat text: how much text to draw."""
    sample = "".join(chat_paragraphs(random.Random(0), 4000, first=True))
    return len(sample) / max(1, len(encode(tokenizer, sample)))


def chat_paragraphs(
    rng: random.Random, min_chars: int, first: bool, separator: str = "\n\n"
) -> list[str]:
    """Chat-like paragraphs of at least ``min_chars`` characters in all, each but the
    very first led by ``separator`` so that they concatenate as they are."""

    def draw(slot: re.Match[str]) -> str:
        name = slot.group(1)
        if name == "number":
            return str(rng.randint(2, 90))
        return rng.choice(_TOPICS if name == "topic" else _SLOTS[name])

    def fill(frame: str) -> str:
        return _SLOT.sub(draw, frame)

    paragraphs: list[str] = []
    size = 0
    while size < min_chars:
        sentences = [fill(rng.choice(_ASKS))]
        sentences += [fill(rng.choice(_DETAILS)) for _ in range(rng.randint(2, 6))]
        if rng.random() < 0.4:
            sentences.append(rng.choice(_CLOSES))
        lead = "" if first and not paragraphs else separator
        paragraphs.append(f"{lead}{rng.choice(_NAMES)} writes: " + " ".join(sentences))
        size += len(paragraphs[-1])
    return paragraphs


class SeededText:
    """Seeded chat text, long enough for ``needed`` tokens, that can be cut after any
    token. Paragraphs are tokenized once each; offsets only for the paragraph cut."""

    def __init__(
        self,
        tokenizer: Any,
        rng: random.Random,
        needed: int,
        chars_per_token: float,
        separator: str = "\n\n",
    ):
        self._tokenizer = tokenizer
        self.pieces: list[str] = []
        self.cumulative: list[int] = []
        self._ends: dict[int, list[int]] = {}
        while not self.cumulative or self.cumulative[-1] < needed + 8:
            missing = needed + 8 - (self.cumulative[-1] if self.cumulative else 0)
            new = chat_paragraphs(
                rng, int(missing * chars_per_token * 1.1) + 64, not self.pieces, separator
            )
            encoded = tokenizer(new, add_special_tokens=False, verbose=False)["input_ids"]
            counts = [len(ids) for ids in encoded]
            for piece, count in zip(new, counts):
                self.pieces.append(piece)
                self.cumulative.append(count + (self.cumulative[-1] if self.cumulative else 0))
        self.starts = [0]
        for piece in self.pieces[:-1]:
            self.starts.append(self.starts[-1] + len(piece))
        self.text = "".join(self.pieces)

    @property
    def tokens(self) -> int:
        return self.cumulative[-1]

    def cut(self, count: int) -> str:
        """The text of the first ``count`` tokens (as counted piece by piece)."""
        if count <= 0:
            return ""
        index = bisect.bisect_left(self.cumulative, count)
        before = self.cumulative[index - 1] if index else 0
        if index not in self._ends:
            encoded = self._tokenizer(
                self.pieces[index],
                add_special_tokens=False,
                return_offsets_mapping=True,
                verbose=False,
            )
            self._ends[index] = [end for _, end in encoded["offset_mapping"]]
        return self.text[: self.starts[index] + self._ends[index][count - before - 1]]


class Fitted(NamedTuple):
    """A fitted text: ``render(content)``, its exact tokens, and the seeded cut itself."""

    text: str
    token_ids: list[int]
    content: str


def fit_text(
    tokenizer: Any,
    render: Callable[[str], str],
    rng: random.Random,
    target: int,
    chars_per_token: float,
    *,
    what: str,
    around: str,
    fix: str,
    separator: str = "\n\n",
) -> Fitted:
    """``render(cut)`` for the cut of seeded text that gives exactly ``target`` tokens,
    those tokens and the cut. ``what`` names the text for the errors (``Bucket 1000's prompt``),
    ``around`` what ``render`` adds to it, ``fix`` what the user can change;
    ``separator`` goes between paragraphs."""
    overhead = len(encode(tokenizer, render("")))
    if overhead >= target:
        raise WorkloadError(
            f"{what} must hold exactly {target} tokens, but {around} already takes "
            f"{overhead} tokens before any text. {fix}"
        )
    seen: set[int] = set()
    # A text whose cuts near the target all jump over it (a merge, or a space a template
    # trims) gives way to the next seeded text; the first that fits is kept.
    for _ in range(_TEXT_ATTEMPTS):
        text_source = SeededText(tokenizer, rng, target - overhead, chars_per_token, separator)
        fitted = _fit_cut(tokenizer, render, text_source, target, overhead, seen)
        if fitted is not None:
            return fitted
        log.debug("%s: no cut of a seeded text gives %d tokens; drawing another", what, target)
    raise WorkloadError(
        f"No cut of the seeded text gives {what} of exactly {target} tokens (counts seen "
        f"near the target: {sorted(seen)}, in {_TEXT_ATTEMPTS} seeded texts). The tokenizer "
        "merges across every cut tried; try another workload seed."
    )


def _fit_cut(
    tokenizer: Any,
    render: Callable[[str], str],
    text_source: SeededText,
    target: int,
    overhead: int,
    seen: set[int],
) -> Fitted | None:
    """The cut of ``text_source`` whose rendering holds ``target`` tokens, or None; the
    counts met on the way are added to ``seen``."""

    def attempt(content: str) -> Fitted:
        text = render(content)
        return Fitted(text, encode(tokenizer, text), content)

    # Follow the count difference on token boundaries; BPE merges at the cut or around
    # the template markers make the count off by a few at most.
    tried: dict[int, int] = {}
    count = target - overhead
    while (
        len(tried) < _BOUNDARY_ATTEMPTS and count not in tried and 0 < count <= text_source.tokens
    ):
        fitted = attempt(text_source.cut(count))
        if len(fitted.token_ids) == target:
            return fitted
        tried[count] = len(fitted.token_ids)
        count += target - len(fitted.token_ids)
    seen.update(tried.values())
    # The count jumps over the target at every token boundary near it: cut inside tokens.
    below = max((k for k, got in tried.items() if got < target), default=min(tried, default=1) - 1)
    start = len(text_source.cut(below))
    for cut in range(start + 1, min(len(text_source.text), start + 1 + _CHARACTER_ATTEMPTS)):
        fitted = attempt(text_source.text[:cut])
        if len(fitted.token_ids) == target:
            return fitted
    return None
