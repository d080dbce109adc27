"""The frozen workload, built with the real tiny model's tokenizer and chat template."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import pytest

from runner.config import Bucket, ContextMixWorkload
from runner.errors import WorkloadError
from runner.prepare.generated import ensure_tiny_model
from runner.workload.context_mix import (
    build_prompts,
    load_tokenizer,
    shared_prefix_tokens,
    write_workload,
)
from runner.workload.prompt import Prompt, assign_buckets

SEED_004_TOTALS = [1000, 2000, 4000, 8000, 16000, 24000, 30000]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("cache"), max_context=32768))


def workload(totals: list[int], max_tokens: int | None = 512, per_bucket: int = 2, seed: int = 0):
    return ContextMixWorkload(
        name="test",
        buckets=[Bucket(total_tokens=total) for total in totals],
        max_tokens=max_tokens,
        prompts_per_bucket=per_bucket,
        seed=seed,
    )


def test_seed_004_buckets_hit_the_templated_prompt_counts_exactly(tokenizer):
    """seed 004 §6: totals 1,000..30,000 with 512 forced output give 488..29,488 prompt
    tokens, counted after the chat template (BOS and special tokens included)."""
    prompts = build_prompts(tokenizer, workload(SEED_004_TOTALS))
    counts = sorted({(p.bucket_total, p.prompt_tokens) for p in prompts})
    assert counts == [
        (1000, 488), (2000, 1488), (4000, 3488), (8000, 7488),
        (16000, 15488), (24000, 23488), (30000, 29488),
    ]
    for prompt in prompts:
        assert len(prompt.token_ids) == prompt.prompt_tokens
        assert prompt.max_tokens == 512
        assert prompt.token_ids[0] == tokenizer.bos_token_id
        assert tokenizer(prompt.text, add_special_tokens=False)["input_ids"] == prompt.token_ids


def test_odd_bucket_sizes_are_exact_and_retokenize_to_the_same_ids(tokenizer):
    """seed 004 §6: pad or truncate after templating; the text a server tokenizes must
    give exactly the recorded token IDs, whatever the cut point."""
    totals = [97, 101, 333, 1001, 2047, 4099]
    prompts = build_prompts(tokenizer, workload(totals, max_tokens=13, per_bucket=4))
    assert len(prompts) == 4 * len(totals)
    for prompt in prompts:
        assert prompt.prompt_tokens == prompt.bucket_total - 13
        assert tokenizer(prompt.text, add_special_tokens=False)["input_ids"] == prompt.token_ids
        assert prompt.text.endswith("<|assistant|>"), "the generation prompt is part of the count"


def test_every_prompt_is_unique_from_its_first_tokens(tokenizer):
    """seed 004 §6: every request is a prefix-cache miss, so no prompt shares a system
    prompt or instruction prefix with another; only the template's markers are common."""
    prompts = build_prompts(tokenizer, workload([600, 1200, 2400], per_bucket=12))
    assert len({p.text for p in prompts}) == len(prompts)
    assert len({tuple(p.token_ids[:16]) for p in prompts}) == len(prompts)
    assert len({p.id for p in prompts}) == len(prompts)
    assert shared_prefix_tokens(prompts) < 16


def test_content_is_varied_chat_text_not_a_repeated_filler(tokenizer):
    """seed 004 §6: varied natural-language/chat content rather than one repeated string."""
    (prompt,) = build_prompts(tokenizer, workload([30000], per_bucket=1))
    sentences = [s for s in re.split(r"(?<=[.?!])\s+", prompt.text) if len(s) > 20]
    most_common_share = Counter(sentences).most_common(1)[0][1] / len(sentences)
    assert len(set(sentences)) > 0.5 * len(sentences)
    assert most_common_share < 0.05
    assert "<|system|>" in prompt.text and "<|user|>" in prompt.text


def test_same_seed_gives_the_same_file_hash_and_another_seed_does_not(tokenizer, tmp_path):
    """seed 004 §6: fix and record the workload seed and SHA-256 hash."""
    totals = [700, 1500]

    def digest(seed: int, name: str) -> str:
        prompts = build_prompts(tokenizer, workload(totals, seed=seed))
        return write_workload(prompts, tmp_path / name, seed)

    first, again, other = digest(7, "a.jsonl"), digest(7, "b.jsonl"), digest(8, "c.jsonl")
    assert first == again
    assert first != other
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert re.fullmatch(r"[0-9a-f]{64}", first)


def test_workload_file_round_trips_with_a_header_line(tokenizer, tmp_path):
    """seed 004 §6: workload.jsonl records the seed, and reading it back gives the hash."""
    prompts = build_prompts(tokenizer, workload([800, 1600], per_bucket=3, seed=3))
    path = tmp_path / "run" / "workload.jsonl"
    digest = write_workload(prompts, path, seed=3)
    header = json.loads(path.read_text().splitlines()[0])
    assert header["seed"] == 3
    assert header["prompts"] == 6
    assert header["buckets"] == [
        {"total_tokens": 800, "prompt_tokens": 288, "max_tokens": 512, "prompts": 3},
        {"total_tokens": 1600, "prompt_tokens": 1088, "max_tokens": 512, "prompts": 3},
    ]
    lines = path.read_text().splitlines()
    assert len(lines) == 7
    assert [Prompt(**json.loads(line)) for line in lines[1:]] == prompts
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_impossible_buckets_raise_a_clear_paragraph(tokenizer):
    """seed 004 §6: a total counts prompt plus forced output, so it must exceed max_tokens."""
    with pytest.raises(WorkloadError, match="Bucket 512 cannot hold a prompt"):
        build_prompts(tokenizer, workload([1000, 512]))
    with pytest.raises(WorkloadError, match="chat template with its system message already takes"):
        build_prompts(tokenizer, workload([520]))
    with pytest.raises(WorkloadError, match="has no max_tokens"):
        build_prompts(tokenizer, workload([1000], max_tokens=None))
    with pytest.raises(WorkloadError, match="lists a bucket twice"):
        build_prompts(tokenizer, workload([1000, 1000]))


def test_a_template_without_a_system_role_still_counts_exactly(tokenizer):
    """seed 004 §6: counts follow the model's own template, whatever roles it accepts."""
    original = tokenizer.chat_template
    tokenizer.chat_template = (
        "{{ bos_token }}{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "{{ '<|' + message['role'] + '|>' }}{{ message['content'] }}{{ '<|end|>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    try:
        prompts = build_prompts(tokenizer, workload([900, 1900], per_bucket=3))
    finally:
        tokenizer.chat_template = original
    for prompt in prompts:
        assert "<|system|>" not in prompt.text
        assert prompt.prompt_tokens == prompt.bucket_total - 512
        assert tokenizer(prompt.text, add_special_tokens=False)["input_ids"] == prompt.token_ids
    assert len({tuple(p.token_ids[:16]) for p in prompts}) == len(prompts)


def test_a_tokenizer_that_merges_across_words_still_counts_exactly():
    """seed 004 §6: exact counts with any tokenizer. With merges across spaces (as
    SentencePiece models without word splitting do), most first cuts miss the count."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from runner.prepare.generated import CHAT_TEMPLATE, SPECIAL_TOKENS, _corpus

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    trainer = trainers.BpeTrainer(
        vocab_size=3000, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    backend.train_from_iterator(_corpus(seed=1), trainer=trainer)
    merging = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    merging.chat_template = CHAT_TEMPLATE
    assert any("▁" in piece[1:-1] for piece in merging.get_vocab()), "merges must cross words"

    totals = list(range(300, 1300, 37))
    prompts = build_prompts(merging, workload(totals, max_tokens=11, per_bucket=2))
    for prompt in prompts:
        assert prompt.prompt_tokens == prompt.bucket_total - 11
        assert merging(prompt.text, add_special_tokens=False)["input_ids"] == prompt.token_ids


def test_a_missing_tokenizer_is_a_workload_error(tmp_path):
    with pytest.raises(WorkloadError, match="could not be loaded"):
        load_tokenizer(tmp_path / "no-model-here")


def test_users_are_spread_round_robin_over_all_buckets():
    """seed 004 §6: balanced round-robin so all seven buckets stay represented when the
    user count is not divisible by seven."""
    for users in (7, 10, 15, 30, 57):
        assigned = assign_buckets(users, SEED_004_TOTALS)
        counts = Counter(assigned)
        assert len(assigned) == users
        assert set(counts) == set(SEED_004_TOTALS)
        assert max(counts.values()) - min(counts.values()) <= 1
    assert assign_buckets(3, SEED_004_TOTALS) == [1000, 2000, 4000]
    assert assign_buckets(9, [1, 2]) == [1, 2, 1, 2, 1, 2, 1, 2, 1]
    with pytest.raises(WorkloadError):
        assign_buckets(4, [])
