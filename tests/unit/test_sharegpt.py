"""ShareGPT prompts from a small ShareGPT-format file, with the real tiny tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.errors import WorkloadError
from runner.prepare.generated import ensure_tiny_model
from runner.workload.context_mix import load_tokenizer
from runner.workload.sharegpt import build_sharegpt_prompts, load_sharegpt

LONG_QUESTION = "Tell me about the old farm house near the river. " * 60


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("cache"), max_context=4096))


@pytest.fixture
def sharegpt_file(tmp_path: Path) -> Path:
    conversations = [
        {"id": "a_0", "conversations": [
            {"from": "human", "value": "How do I keep a garden alive in summer?"},
            {"from": "gpt", "value": "Water early in the morning."},
        ]},
        {"id": "b_0", "conversations": [
            {"from": "gpt", "value": "Hello! How can I help?"},
            {"from": "human", "value": "Which plants need the most light?"},
        ]},
        {"id": "c_0", "conversations": [{"from": "gpt", "value": "Only an answer."}]},
        {"id": "d_0", "conversations": [{"from": "human", "value": LONG_QUESTION}]},
        {"id": "a_0", "conversations": [{"from": "human", "value": "A repeated id."}]},
        {"id": "e_0", "conversations": [{"from": "human", "value": "   "}]},
        "not a conversation",
        {"id": "f_0", "conversations": [
            {"from": "human", "value": "Write a short poem about the sea, please."},
        ]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations), encoding="utf-8")
    return path


def test_first_human_turns_fit_the_context_and_retokenize_exactly(tokenizer, sharegpt_file):
    """seed 000: ShareGPT prompts with a fixed 256-token output; prompts too long for the
    context with that output are skipped, not cut."""
    prompts = build_sharegpt_prompts(
        tokenizer, load_sharegpt(sharegpt_file), max_tokens=256, max_context=400
    )
    by_id = {prompt.id: prompt for prompt in prompts}
    assert sorted(by_id) == ["a_0", "b_0", "f_0"]
    assert "Which plants need the most light?" in by_id["b_0"].text
    assert "Hello! How can I help?" not in by_id["b_0"].text
    assert "How do I keep a garden alive in summer?" in by_id["a_0"].text
    for prompt in prompts:
        assert prompt.max_tokens == 256
        assert prompt.bucket_total == 400
        assert prompt.prompt_tokens + 256 <= 400
        assert prompt.text.startswith("<s><|user|>") and prompt.text.endswith("<|assistant|>")
        assert tokenizer(prompt.text, add_special_tokens=False)["input_ids"] == prompt.token_ids
        assert len(prompt.token_ids) == prompt.prompt_tokens

    roomy = build_sharegpt_prompts(
        tokenizer, load_sharegpt(sharegpt_file), max_tokens=256, max_context=4096
    )
    assert "d_0" in {prompt.id for prompt in roomy}


def test_order_follows_the_seed_and_num_prompts_limits(tokenizer, sharegpt_file):
    conversations = load_sharegpt(sharegpt_file)

    def ids(seed: int, num_prompts: int | None = None) -> list[str]:
        prompts = build_sharegpt_prompts(
            tokenizer, conversations, max_context=4096, num_prompts=num_prompts, seed=seed
        )
        return [prompt.id for prompt in prompts]

    assert ids(1) == ids(1)
    assert sorted(ids(1)) == sorted(ids(2)) == ["a_0", "b_0", "d_0", "f_0"]
    assert len({tuple(ids(seed)) for seed in range(8)}) > 1
    assert ids(1, num_prompts=2) == ids(1)[:2]


def test_unusable_files_raise_a_clear_paragraph(tokenizer, tmp_path):
    with pytest.raises(WorkloadError, match="could not be read as JSON"):
        load_sharegpt(tmp_path / "missing.json")
    (tmp_path / "dict.json").write_text('{"id": "x"}')
    with pytest.raises(WorkloadError, match="not a list of conversations"):
        load_sharegpt(tmp_path / "dict.json")
    only_answers = [{"id": "x", "conversations": [{"from": "gpt", "value": "hi"}]}]
    with pytest.raises(WorkloadError, match="No ShareGPT conversation gave a usable prompt"):
        build_sharegpt_prompts(tokenizer, only_answers, max_context=4096)
    with pytest.raises(WorkloadError, match="leaves no room for a prompt"):
        build_sharegpt_prompts(tokenizer, only_answers, max_tokens=512, max_context=512)
