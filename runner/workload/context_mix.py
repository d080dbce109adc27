"""The frozen workload: seeded, unique prompts at exact templated token counts.

Seed 004 section 6: every bucket's prompt holds exactly ``total - max_tokens`` tokens
*after* the model's own chat template (system message, template markers, BOS and
other special tokens included), the content is varied chat text, and no two prompts
share a system prompt or instruction prefix, so every request is a prefix-cache miss.
Each prompt therefore opens its system message with its own seeded code; only the
template's fixed markers in front of it are common to all prompts.

The exact count is reached after templating: the user text is cut on a token
boundary found from one tokenization of the text, the message is templated and
tokenized again, and the cut moves by the difference until the count is exact
(a merge across the cut can skip a count; then the cut is tried between characters).
``token_ids`` is always the tokenization of the final templated ``text`` with
``add_special_tokens=False``, which is what a server sees for that text.

``workload.jsonl`` holds one header line, then one prompt per line::

    {"buckets": [{"max_tokens": 512, "prompt_tokens": 488, "prompts": 16,
                  "total_tokens": 1000}, ...],
     "format": "runner-workload/1", "prompts": 112, "seed": 0,
     "shared_prefix_tokens": 2}
    {"bucket_total": 1000, "id": "b1000-0000", "max_tokens": 512,
     "prompt_tokens": 488, "text": "...", "token_ids": [...]}

Keys are sorted, separators fixed and text ASCII-escaped, so the same seed and
tokenizer give the same bytes, hence the same SHA-256, on every machine.
``shared_prefix_tokens`` is the longest token prefix any two prompts share: the
part of a prompt a prefix cache could reuse.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import random
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from jinja2 import TemplateError
from transformers import AutoTokenizer

from runner.config import ContextMixWorkload
from runner.errors import WorkloadError
from runner.workload.prompt import Prompt, prompts_by_bucket

log = logging.getLogger("runner")

FORMAT = "runner-workload/1"
# Templates that print a date (Llama 3.x) would otherwise change the text, and the
# hash, from one day to the next.
TEMPLATE_DATE = "26 Jul 2024"
_CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
# Cuts tried per prompt: first on token boundaries, then between characters.
_BOUNDARY_ATTEMPTS = 24
_CHARACTER_ATTEMPTS = 24
_SLOT = re.compile(r"\{(\w+)\}")

_NAMES = (
    "Ada Bruno Chen Dalia Emeka Farah Goran Hana Ivo Jun Kemal Lena Mateo Nia Omar "
    "Priya Quinn Rosa Sami Tomas Uma Viktor Wen Yara Zoltan Ines Kofi Mirela Arjun Elif"
).split()
_PERSONAS = (
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


def load_tokenizer(model_dir: Path | str) -> Any:
    """The model's own tokenizer and chat template, from local files only."""
    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise WorkloadError(
            f"The tokenizer in {model_dir} could not be loaded ({exc}). The workload is "
            "counted in the served model's own tokens, so its tokenizer files "
            "(tokenizer.json or equivalent, tokenizer_config.json with a chat template) "
            "must be present locally; download the model first or point model.repo at it."
        ) from exc


def build_prompts(tokenizer: Any, workload: ContextMixWorkload) -> list[Prompt]:
    """``prompts_per_bucket`` unique prompts per bucket, each exactly at its token count."""
    if workload.max_tokens is None:
        raise WorkloadError(
            f"Workload {workload.name!r} has no max_tokens. A context-mix bucket is "
            "prompt plus forced output (seed 004 section 6), so the prompt length is "
            "total_tokens - max_tokens; set workload.max_tokens (512 in the seed)."
        )
    totals = [bucket.total_tokens for bucket in workload.buckets]
    if len(set(totals)) != len(totals):
        raise WorkloadError(
            f"Workload {workload.name!r} lists a bucket twice ({totals}); each bucket "
            "is one equal-weight share of the users, so list every total once."
        )
    for total in totals:
        if total <= workload.max_tokens:
            raise WorkloadError(
                f"Bucket {total} cannot hold a prompt: total_tokens must exceed "
                f"max_tokens ({workload.max_tokens}) because the total counts the prompt "
                "and the forced output together. Raise the bucket or lower max_tokens."
            )
    rng = random.Random(workload.seed)
    render = _renderer(tokenizer)
    chars_per_token = _chars_per_token(tokenizer)
    codes: set[str] = set()
    prompts: list[Prompt] = []
    for total in totals:
        target = total - workload.max_tokens
        for index in range(workload.prompts_per_bucket):
            code = _unique_code(rng, codes)
            text_rng = random.Random(rng.getrandbits(64))
            system = f"{code} {text_rng.choice(_PERSONAS)}"
            text, ids = _fit(tokenizer, render, system, text_rng, target, chars_per_token, total)
            prompts.append(
                Prompt(
                    id=f"b{total}-{index:04d}",
                    bucket_total=total,
                    prompt_tokens=len(ids),
                    max_tokens=workload.max_tokens,
                    token_ids=ids,
                    text=text,
                )
            )
    log.info("built %d prompts in %d buckets (seed %d)", len(prompts), len(totals), workload.seed)
    return prompts






def shared_prefix_tokens(prompts: list[Prompt]) -> int:
    """The longest token prefix any two prompts share (sorted neighbours hold the maximum)."""
    ordered = sorted(prompt.token_ids for prompt in prompts)
    longest = 0
    for left, right in zip(ordered, ordered[1:]):
        common = 0
        for a, b in zip(left, right):
            if a != b:
                break
            common += 1
        longest = max(longest, common)
    return longest


def encode_workload(prompts: list[Prompt], seed: int) -> bytes:
    """The bytes of ``workload.jsonl``: a header line, then one line per prompt."""
    buckets = [
        {
            "total_tokens": total,
            "prompt_tokens": group[0].prompt_tokens,
            "max_tokens": group[0].max_tokens,
            "prompts": len(group),
        }
        for total, group in prompts_by_bucket(prompts).items()
    ]
    header = {
        "format": FORMAT,
        "seed": seed,
        "buckets": buckets,
        "prompts": len(prompts),
        "shared_prefix_tokens": shared_prefix_tokens(prompts),
    }
    lines = [_dumps(header)] + [_dumps(asdict(prompt)) for prompt in prompts]
    return ("\n".join(lines) + "\n").encode("ascii")


def write_workload(prompts: list[Prompt], path: Path, seed: int) -> str:
    """Write ``workload.jsonl`` (atomically) and return its SHA-256 hex digest."""
    data = encode_workload(prompts, seed)
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


def _dumps(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def _unique_code(rng: random.Random, taken: set[str]) -> str:
    while True:
        code = "".join(rng.choices(_CODE_ALPHABET, k=4)) + "-" + "".join(
            rng.choices(_CODE_ALPHABET, k=4)
        )
        if code not in taken:
            taken.add(code)
            return code


def _renderer(tokenizer: Any) -> Callable[[str, str], str]:
    """``render(system, user)`` -> templated text, folding the system message into the
    user turn for templates that refuse a system role."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise WorkloadError(
            "The tokenizer has no chat template. Prompt lengths are counted after the "
            "model's own chat template (seed 004 section 6), so serve an instruct/chat "
            "checkpoint or add its template to tokenizer_config.json."
        )

    def with_system(system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return _apply(tokenizer, messages)

    def folded(system: str, user: str) -> str:
        return _apply(tokenizer, [{"role": "user", "content": f"{system}\n\n{user}"}])

    try:
        with_system("probe", "probe")
        return with_system
    except TemplateError:
        log.info("the chat template refuses a system message; folding it into the user turn")
        return folded


def _apply(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, date_string=TEMPLATE_DATE
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def _chars_per_token(tokenizer: Any) -> float:
    sample = "".join(_paragraphs(random.Random(0), 4000, first=True))
    return len(sample) / max(1, len(_encode(tokenizer, sample)))


def _paragraphs(rng: random.Random, min_chars: int, first: bool) -> list[str]:
    """Chat-like paragraphs of at least ``min_chars`` characters in all, each but the
    very first led by its blank-line separator so that they concatenate as they are."""

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
        lead = "" if first and not paragraphs else "\n\n"
        paragraphs.append(f"{lead}{rng.choice(_NAMES)} writes: " + " ".join(sentences))
        size += len(paragraphs[-1])
    return paragraphs


class _UserText:
    """Seeded user text, long enough for ``needed`` tokens, that can be cut after any
    token. Paragraphs are tokenized once each; offsets only for the paragraph cut."""

    def __init__(self, tokenizer: Any, rng: random.Random, needed: int, chars_per_token: float):
        self._tokenizer = tokenizer
        self.pieces: list[str] = []
        self.cumulative: list[int] = []
        self._ends: dict[int, list[int]] = {}
        while not self.cumulative or self.cumulative[-1] < needed + 8:
            missing = needed + 8 - (self.cumulative[-1] if self.cumulative else 0)
            new = _paragraphs(rng, int(missing * chars_per_token * 1.1) + 64, not self.pieces)
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


def _fit(
    tokenizer: Any,
    render: Callable[[str, str], str],
    system: str,
    rng: random.Random,
    target: int,
    chars_per_token: float,
    total: int,
) -> tuple[str, list[int]]:
    """Templated text of exactly ``target`` tokens, and its tokens."""
    overhead = len(_encode(tokenizer, render(system, "")))
    if overhead >= target:
        raise WorkloadError(
            f"Bucket {total} leaves {target} prompt tokens, but the chat template with "
            f"its system message already takes {overhead} tokens before any user text. "
            "Raise the bucket's total_tokens or lower max_tokens."
        )
    user = _UserText(tokenizer, rng, target - overhead, chars_per_token)

    def attempt(content: str) -> tuple[str, list[int]]:
        text = render(system, content)
        return text, _encode(tokenizer, text)

    # Follow the count difference on token boundaries; BPE merges at the cut or around
    # the template markers make the count off by a few at most.
    tried: dict[int, int] = {}
    count = target - overhead
    while len(tried) < _BOUNDARY_ATTEMPTS and count not in tried and 0 < count <= user.tokens:
        text, ids = attempt(user.cut(count))
        if len(ids) == target:
            return text, ids
        tried[count] = len(ids)
        count += target - len(ids)
    # The count jumps over the target at every token boundary near it: cut inside tokens.
    log.debug(
        "bucket %d: no token boundary gives %d tokens (%s); cutting inside tokens",
        total, target, tried,
    )
    below = max((k for k, got in tried.items() if got < target), default=min(tried, default=1) - 1)
    start = len(user.cut(below))
    for cut in range(start + 1, min(len(user.text), start + 1 + _CHARACTER_ATTEMPTS)):
        text, ids = attempt(user.text[:cut])
        if len(ids) == target:
            return text, ids
    raise WorkloadError(
        f"No cut of the user text gives a templated prompt of exactly {target} tokens for "
        f"bucket {total} (counts seen near the target: {sorted(set(tried.values()))}). "
        "The tokenizer merges across every cut tried; try another workload seed."
    )
