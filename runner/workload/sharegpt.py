"""A ShareGPT workload: real first user turns instead of seeded text at exact lengths.

Seed 000 runs ShareGPT V3 (``ShareGPT_V3_unfiltered_cleaned_split.json``) with a
fixed 256-token output. The file is a JSON list of conversations::

    [{"id": "QWJhYvA_0", "conversations": [{"from": "human", "value": "..."},
                                           {"from": "gpt", "value": "..."}]}, ...]

Each prompt is the conversation's first human turn, as written, inside the model's
chat template (add_generation_prompt), so ``token_ids`` is what the server prefills
and ``text`` tokenizes back to exactly those IDs, as in :mod:`runner.workload`.
Conversations without a human turn, repeating an earlier id, or too long for the context
together with ``max_tokens`` are skipped. All prompts form one population whose
``bucket_total`` is the context ceiling they were filtered against.
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any

from runner.errors import WorkloadError
from runner.workload.context_mix import TEMPLATE_DATE
from runner.workload.prompt import Prompt

log = logging.getLogger("runner")


def load_sharegpt(path: Path) -> list[Any]:
    """The conversations of a local ShareGPT-format JSON file."""
    try:
        conversations = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise WorkloadError(
            f"The ShareGPT file {path} could not be read as JSON ({exc}). Download the "
            "dataset (e.g. ShareGPT_V3_unfiltered_cleaned_split.json) to a local path "
            "and point the workload at it; nothing is fetched during a run."
        ) from exc
    if not isinstance(conversations, list):
        raise WorkloadError(
            f"The ShareGPT file {path} holds a {type(conversations).__name__}, not a list "
            "of conversations. Expected [{\"id\": ..., \"conversations\": [{\"from\": "
            "\"human\", \"value\": ...}, ...]}, ...]."
        )
    return conversations


def build_sharegpt_prompts(
    tokenizer: Any,
    conversations: list[Any],
    *,
    max_tokens: int = 256,
    max_context: int,
    num_prompts: int | None = None,
    seed: int = 0,
) -> list[Prompt]:
    """Templated first human turns, shuffled by ``seed``, that fit ``max_context``."""
    if max_tokens >= max_context:
        raise WorkloadError(
            f"max_tokens ({max_tokens}) leaves no room for a prompt in a context of "
            f"{max_context} tokens. Lower max_tokens or raise the model's max_context."
        )
    # A repeated id keeps its first occurrence in the file, whatever the seed's order.
    first_position: dict[str, int] = {}
    for position, conversation in enumerate(conversations):
        if isinstance(conversation, dict) and conversation.get("id"):
            first_position.setdefault(str(conversation["id"]), position)
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    skipped: Counter[str] = Counter()
    prompts: list[Prompt] = []
    for position in order:
        if num_prompts is not None and len(prompts) >= num_prompts:
            break
        conversation_id, question = _first_human_turn(conversations[position])
        conversation_id = conversation_id or f"sharegpt-{position}"
        if question is None:
            skipped["no human turn"] += 1
            continue
        if first_position.get(conversation_id, position) != position:
            skipped["repeated id"] += 1
            continue
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            tokenize=False,
            add_generation_prompt=True,
            date_string=TEMPLATE_DATE,
        )
        ids = list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
        if len(ids) + max_tokens > max_context:
            skipped["longer than the context"] += 1
            continue
        prompts.append(
            Prompt(
                id=conversation_id,
                bucket_total=max_context,
                prompt_tokens=len(ids),
                max_tokens=max_tokens,
                token_ids=ids,
                text=text,
            )
        )
    if skipped:
        reasons = ", ".join(f"{count} {why}" for why, count in sorted(skipped.items()))
        log.info("ShareGPT: skipped %s", reasons)
    if not prompts:
        raise WorkloadError(
            f"No ShareGPT conversation gave a usable prompt ({dict(skipped)} of "
            f"{len(conversations)} skipped). Each needs a human turn whose templated "
            f"length plus {max_tokens} output tokens fits {max_context} tokens."
        )
    if num_prompts is not None and len(prompts) < num_prompts:
        log.warning("ShareGPT: only %d of the %d prompts asked for fit", len(prompts), num_prompts)
    return prompts


def _first_human_turn(conversation: Any) -> tuple[str, str | None]:
    """The conversation's id and first non-empty human message (None if it has none)."""
    if not isinstance(conversation, dict):
        return "", None
    conversation_id = str(conversation.get("id") or "")
    turns = conversation.get("conversations")
    for turn in turns if isinstance(turns, list) else []:
        if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
            value = turn.get("value")
            if isinstance(value, str) and value.strip():
                return conversation_id, value
            break
    return conversation_id, None
