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

import logging
import random
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from runner.config import ContextMixWorkload
from runner.errors import WorkloadError
from runner.workload.exact import (
    PERSONAS,
    TEMPLATE_DATE,
    apply_template,
    chars_per_token,
    dumps_line,
    fit_text,
    require_template,
    unique_code,
    write_frozen,
)
from runner.workload.prompt import Prompt, prompts_by_bucket

__all__ = ["TEMPLATE_DATE", "build_prompts", "load_tokenizer", "write_workload"]

log = logging.getLogger("runner")

FORMAT = "runner-workload/1"


def load_tokenizer(model_dir: Path | str) -> Any:
    """The model's own tokenizer and chat template, from local files only."""
    try:
        from transformers import AutoTokenizer  # seconds of imports, only when a run needs it

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
    per_token = chars_per_token(tokenizer)
    codes: set[str] = set()
    prompts: list[Prompt] = []
    for total in totals:
        target = total - workload.max_tokens
        for index in range(workload.prompts_per_bucket):
            code = unique_code(rng, codes)
            text_rng = random.Random(rng.getrandbits(64))
            system = f"{code} {text_rng.choice(PERSONAS)}"
            text, ids, _ = fit_text(
                tokenizer,
                lambda user, system=system: render(system, user),
                text_rng,
                target,
                per_token,
                what=f"Bucket {total}'s prompt",
                around="the chat template with its system message",
                fix="Raise the bucket's total_tokens or lower max_tokens.",
            )
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
    lines = [dumps_line(header)] + [dumps_line(asdict(prompt)) for prompt in prompts]
    return ("\n".join(lines) + "\n").encode("ascii")


def write_workload(prompts: list[Prompt], path: Path, seed: int) -> str:
    """Write ``workload.jsonl`` (atomically) and return its SHA-256 hex digest."""
    return write_frozen(encode_workload(prompts, seed), path)


def _renderer(tokenizer: Any) -> Callable[[str, str], str]:
    """``render(system, user)`` -> templated text, folding the system message into the
    user turn for templates that refuse a system role."""
    require_template(tokenizer)

    def with_system(system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return apply_template(tokenizer, messages)

    def folded(system: str, user: str) -> str:
        return apply_template(tokenizer, [{"role": "user", "content": f"{system}\n\n{user}"}])

    try:
        with_system("probe", "probe")
        return with_system
    except TemplateError:
        log.info("the chat template refuses a system message; folding it into the user turn")
        return folded
