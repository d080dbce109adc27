"""The frozen chat-session workload, built with the real tiny model's tokenizer and chat
template: exact counts, prompts that extend each other, seeds, restarts, think time."""

from __future__ import annotations

import copy
import hashlib
import json
import random
import statistics
from itertools import pairwise

import pytest

from runner.config import ChatSessionsWorkload, ThinkTime
from runner.errors import WorkloadError
from runner.prepare.generated import ensure_tiny_model
from runner.workload.chat_sessions import build_sessions, draw_think_s, write_sessions
from runner.workload.context_mix import load_tokenizer

CONTEXT = 4096


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("cache"), max_context=CONTEXT))


def chat(**changes) -> ChatSessionsWorkload:
    settings = {
        "name": "chat", "kind": "chat_sessions", "system_tokens": 200, "user_tokens": 50,
        "max_tokens": 40, "turns": 5, "conversations": 6,
        "think_time": {"distribution": "exponential", "mean_s": 1.0, "max_s": 3.0},
    }  # fmt: skip
    return ChatSessionsWorkload.model_validate({**settings, **changes})


def test_every_turn_holds_exactly_its_templated_count(tokenizer) -> None:
    """Turn k's prompt: system + k user turns + (k - 1) answers, counted after the chat
    template; the IDs spell exactly the templated conversation."""
    sessions = build_sessions(tokenizer, chat(), CONTEXT)
    assert sessions.turns == 5
    assert [prompt.prompt_tokens for prompt in sessions] == [250, 340, 430, 520, 610]
    assert sessions.session_total == 650 == chat().total_at(5)
    assert len(sessions.system.token_ids) == 200
    for conversation in sessions.conversations:
        assert [len(turn.token_ids) for turn in conversation.user_turns] == [50] * 5
        assert [len(answer.token_ids) for answer in conversation.answers] == [40] * 4
    for instance in (0, 3, 17):
        for turn in range(1, 6):
            prompt = sessions.prompt(instance, turn)
            assert len(prompt.token_ids) == prompt.prompt_tokens == sessions.prompt_tokens(turn)
            assert prompt.max_tokens == 40 and prompt.bucket_total == sessions.total(turn)
            assert tokenizer.decode(prompt.token_ids) == prompt.text
    last = sessions[-1].text
    assert last.startswith("<s><|system|>") and last.endswith("<|end|><|assistant|>")
    assert last.count("<|user|>") == last.count("<|assistant|>") == 5


def test_each_turn_extends_the_one_before_token_for_token(tokenizer) -> None:
    """A prefix cache can reuse the whole previous prompt of the same conversation."""
    sessions = build_sessions(tokenizer, chat(), CONTEXT)
    for instance in (0, 1, 40):
        prompts = [sessions.prompt(instance, turn) for turn in range(1, 6)]
        for before, after in pairwise(prompts):
            assert after.token_ids[: before.prompt_tokens] == before.token_ids
            assert after.text.startswith(before.text)


def test_conversations_share_the_system_prompt_and_nothing_more(tokenizer) -> None:
    """Every instance (a conversation, or a repeat of one) opens with its own code right
    after the system prompt and the user's opening marker, so instances a window runs
    together share that and no more."""
    sessions = build_sessions(tokenizer, chat(), CONTEXT)
    assert len(sessions.code.characters) >= 20
    shared = sessions.shared_prefix_tokens
    assert shared == 200 + sessions.code.at
    prompts = [sessions.prompt(instance, 2).token_ids for instance in range(20)]
    for index, ids in enumerate(prompts):
        for other in prompts[index + 1 :]:
            assert ids[:shared] == other[:shared] and ids[shared] != other[shared]
    # Instance c < conversations is conversation c exactly as frozen; a repeat is not.
    frozen = sessions.conversations[2].user_turns[0].token_ids
    assert sessions.user_turn(2, 1) == frozen
    repeat = sessions.user_turn(2 + len(sessions.conversations), 1)
    assert repeat != frozen and len(repeat) == len(frozen)


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_ones(
    tokenizer, tmp_path
) -> None:
    digests = [
        write_sessions(
            build_sessions(tokenizer, chat(seed=seed), CONTEXT), chat(seed=seed), tmp_path / name
        )
        for seed, name in [(7, "a.jsonl"), (7, "b.jsonl"), (8, "c.jsonl")]
    ]
    assert digests[0] == digests[1] != digests[2]
    path = tmp_path / "a.jsonl"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digests[0]
    header, system, *conversations = [json.loads(line) for line in path.read_text().splitlines()]
    assert header["format"] == "runner-chat-sessions/1"
    assert (header["system_tokens"], header["user_tokens"], header["answer_tokens"]) == (
        200,
        50,
        40,
    )
    assert header["session_total"] == 650 and header["conversations"] == len(conversations) == 6
    assert system["id"] == "system" and len(system["token_ids"]) == 200
    assert [len(c["think_s"]) for c in conversations] == [5] * 6


def test_a_conversation_ends_before_a_turn_would_pass_the_context(tokenizer) -> None:
    """Turn 5 would total 650 tokens: with 600 served, conversations restart after 4."""
    workload = chat()
    assert workload.turns_within(600) == 4 and workload.turns_within(650) == 5
    sessions = build_sessions(tokenizer, workload, 600)
    assert sessions.turns == 4 and len(sessions) == 4
    assert sessions.session_total == 560
    with pytest.raises(WorkloadError, match="first turn .* totals 290 tokens"):
        build_sessions(tokenizer, workload, 289)


def test_think_times_are_seeded_fixed_or_exponential_and_capped() -> None:
    fixed = ThinkTime(distribution="fixed", mean_s=2.5)
    assert {draw_think_s(random.Random(seed), fixed) for seed in range(5)} == {2.5}
    assert draw_think_s(random.Random(0), ThinkTime(mean_s=0.0)) == 0.0
    capped = ThinkTime(distribution="exponential", mean_s=2.0, max_s=5.0)
    rng = random.Random(3)
    draws = [draw_think_s(rng, capped) for _ in range(4000)]
    assert max(draws) == 5.0 and min(draws) >= 0.0
    # The cap at 2.5 means trims the mean to 2 * (1 - e^-2.5) = 1.84 s.
    assert statistics.mean(draws) == pytest.approx(1.84, abs=0.08)
    again = random.Random(3)
    assert [draw_think_s(again, capped) for _ in range(4000)] == draws
    assert ThinkTime(mean_s=2.0).longest_s == 10.0  # no cap given: five means


def test_the_pauses_are_frozen_with_each_conversation(tokenizer) -> None:
    sessions = build_sessions(tokenizer, chat(), CONTEXT)
    pauses = [pause for c in sessions.conversations for pause in c.think_s]
    assert len(set(pauses)) > 1 and all(0.0 <= pause <= 3.0 for pause in pauses)
    fixed = build_sessions(
        tokenizer, chat(think_time={"distribution": "fixed", "mean_s": 0}), CONTEXT
    )
    assert {pause for c in fixed.conversations for pause in c.think_s} == {0.0}


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer) -> None:
    """Such a template cannot give a prompt that extends the previous turn's."""
    original = tokenizer.chat_template
    tokenizer.chat_template = (
        "{{ bos_token }}{{ messages | length }}{% for message in messages %}"
        "{{ '<|' + message['role'] + '|>' }}{{ message['content'] }}{{ '<|end|>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    try:
        with pytest.raises(WorkloadError, match="growing text"):
            build_sessions(tokenizer, chat(), CONTEXT)
    finally:
        tokenizer.chat_template = original


def test_a_llama3_style_template_counts_exactly_too(tokenizer) -> None:
    """Llama 3's template trims every message and marks roles with special tokens."""
    llama = copy.deepcopy(tokenizer)
    llama.add_special_tokens(
        {"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    llama.chat_template = (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
        "{{ message['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
    )
    sessions = build_sessions(llama, chat(), CONTEXT)
    assert [prompt.prompt_tokens for prompt in sessions] == [250, 340, 430, 520, 610]
    for before, after in pairwise(sessions):
        assert after.token_ids[: before.prompt_tokens] == before.token_ids
    assert "<|eot_id|><|start_header_id|>user<|end_header_id|>" in sessions[-1].text


def test_counts_the_template_cannot_hold_are_refused(tokenizer) -> None:
    with pytest.raises(WorkloadError, match="system prompt .* must hold exactly 3 tokens"):
        build_sessions(tokenizer, chat(system_tokens=3), CONTEXT)
    with pytest.raises(WorkloadError, match="first user turn .* must hold more than"):
        build_sessions(tokenizer, chat(user_tokens=4), CONTEXT)
    with pytest.raises(WorkloadError, match="has no max_tokens"):
        build_sessions(tokenizer, chat(max_tokens=None), CONTEXT)
