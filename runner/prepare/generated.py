"""Generated models: an architecture's config.json and a tokenizer, served with random weights.

vLLM builds any architecture it knows from a Hugging Face ``config.json`` and, with
``--load-format dummy``, fills the weights with random values. The work per token
(matmuls, attention, KV cache bytes, CUDA graphs) is the real architecture's, so with
forced output lengths the serving capacity of a box can be measured before any
checkpoint is downloaded. Nothing is fetched: runner writes the folder itself.

- ``model.architecture`` null: runner's built-in tiny Llama (the embedded CPU default),
  with a byte-level BPE trained in a fraction of a second on a synthetic corpus; its
  vocabulary is what that training reaches (about a thousand tokens).
- Any other architecture (embedded in the model option, or read from
  ``model.hf_config``): the same trained BPE, then synthetic merges of printable pieces
  until the tokenizer has exactly the architecture's ``vocab_size`` tokens. A random
  model samples IDs from its whole vocabulary; a tokenizer smaller than that cannot
  decode them, and the smoke chat check sees no text.

The folder is cached under ``cache_dir`` by a hash of its definition, so every run on
every machine serves the same files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from runner.config import Model, RunConfig
from runner.errors import ConfigError

log = logging.getLogger("runner")

ARCHITECTURE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
BOS_ID, EOS_ID = SPECIAL_TOKENS.index("<s>"), SPECIAL_TOKENS.index("</s>")
# The smallest whole vocabulary a byte-level tokenizer can have: its specials and 256 bytes.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256
# Names the way a full vocabulary is filled; a change here must give new folders.
FULL_VOCAB_RECIPE = "trained-bpe+printable-pair-merges/1"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}{{ message['content'] }}{{ '<|end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
_WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one "
    "have this from or had by hot word but what some we can out other were all there "
    "when up use your how said an each she which do their time if will way about many "
    "then them write would like so these her long make thing see him two has look more "
    "day could go come did number sound no most people my over know water than call "
    "first who may down side been now find any new work part take get place made live "
    "where after back little only round man year came show every good me give our under "
    "name very through just form sentence great think say help low line differ turn cause "
    "much mean before move right boy old too same tell does set three want air well also "
    "play small end put home read hand port large spell add even land here must big high "
    "such follow act why ask men change went light kind off need house picture try us "
    "again animal point mother world near build self earth father head stand own page "
    "should country found answer school grow study still learn plant cover food sun four "
    "between state keep eye never last let thought city tree cross farm hard start might "
    "story saw far sea draw left late run while press close night real life few north"
).split()


def _corpus(seed: int, sentences: int = 4000) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        words = rng.choices(_WORDS, k=rng.randint(6, 18))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return lines


def definition_hash(architecture: dict[str, Any] | None = None) -> str:
    """12 hex digits naming what is generated; the tiny model's hash is the one it always had."""
    if architecture is None:
        spec: dict[str, Any] = {
            "arch": ARCHITECTURE, "vocab": VOCAB_SIZE, "special": SPECIAL_TOKENS, "tpl": CHAT_TEMPLATE,
        }  # fmt: skip
    else:
        spec = {
            "arch": architecture, "tokenizer": FULL_VOCAB_RECIPE, "special": SPECIAL_TOKENS,
            "tpl": CHAT_TEMPLATE,
        }  # fmt: skip
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def model_config(architecture: dict[str, Any], vocab_size: int, max_context: int) -> dict[str, Any]:
    """The config.json vLLM reads: the architecture, the tokenizer's ids and runner's context.

    ``max_position_embeddings`` becomes ``max_context``, so vLLM's default max_model_len
    is the context runner validated the workload against; rope scaling is kept, so
    attention at those lengths computes as the architecture's own.
    """
    return dict(
        architecture,
        vocab_size=vocab_size,
        max_position_embeddings=max_context,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )


def ensure_tiny_model(cache_dir: Path, max_context: int) -> Path:
    """Return the folder of the tiny model, generating it on first use."""
    folder = cache_dir.expanduser() / "models" / f"tiny-llama-{definition_hash()}-{max_context}"
    return _ensure(folder, ARCHITECTURE, max_context, lambda: _trained_tokenizer(VOCAB_SIZE))


def ensure_generated_model(cache_dir: Path, model: Model) -> Path:
    """Return the folder of a generated model (``model.generated``), writing it on first use."""
    architecture = model.architecture
    if architecture is None:
        return ensure_tiny_model(cache_dir, model.max_context)
    kind = str(architecture.get("model_type", "model")).replace("/", "-")
    name = f"{kind}-{definition_hash(architecture)}-{model.max_context}"
    folder = cache_dir.expanduser() / "models" / name
    vocab_size = int(architecture["vocab_size"])
    return _ensure(
        folder, architecture, model.max_context, lambda: full_vocab_tokenizer(vocab_size)
    )


def load_architecture(config: RunConfig) -> RunConfig:
    """The config with ``model.hf_config``'s file read into ``model.architecture``.

    Read before config_id is computed, so the id names the file's content, not its path.
    """
    model = config.model
    if model.hf_config is None:
        return config
    path = Path(model.hf_config).expanduser()
    try:
        architecture = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"model.hf_config={model.hf_config} could not be read as a Hugging Face config.json "
            f"({exc}). Point it at the config.json of the architecture to generate (the file "
            "alone: no weights or tokenizer are needed)."
        ) from exc
    if not isinstance(architecture, dict):
        raise ConfigError(
            f"model.hf_config={model.hf_config} holds {type(architecture).__name__}, not the "
            "JSON object of a Hugging Face config.json."
        )
    return config.model_copy(
        update={"model": model.model_copy(update={"architecture": architecture})}
    )


def full_vocab_tokenizer(vocab_size: int) -> Tokenizer:
    """A byte-level BPE with exactly ``vocab_size`` tokens, each decoding to non-empty text.

    The trained merges tokenize prompt text; the synthetic ones make every ID an
    architecture can sample a piece of printable text. A synthetic merge may also join
    two pieces of a prompt's word, which only changes the count the workload takes
    from this same tokenizer.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(
            f"A generated tokenizer needs at least {MIN_VOCAB_SIZE} tokens (its special tokens "
            f"and the 256 bytes), but the architecture's vocab_size is {vocab_size}."
        )
    spec = json.loads(_trained_tokenizer(min(vocab_size, VOCAB_SIZE)).to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges: list[list[str]] = spec["model"]["merges"]
    for left, right in _printable_pairs(vocab):
        if len(vocab) >= vocab_size:
            break
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append([left, right])
    return Tokenizer.from_str(json.dumps(spec))


def _printable(piece: str) -> bool:
    # Byte-level pieces spell printable ASCII as itself and a space as "Ġ".
    return all(33 <= ord(char) <= 126 or char == "Ġ" for char in piece)


def _printable_pairs(vocab: dict[str, int]) -> Iterator[tuple[str, str]]:
    """Pairs of printable pieces, spread over the vocabulary; endless (pieces grow)."""
    while True:
        pieces = [piece for piece in sorted(vocab, key=vocab.__getitem__) if _printable(piece)]
        for offset in range(1, len(pieces)):
            for index, left in enumerate(pieces):
                yield left, pieces[(index + offset) % len(pieces)]


def _trained_tokenizer(vocab_size: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed=0), trainer=trainer)
    return tokenizer


def _ensure(
    folder: Path,
    architecture: dict[str, Any],
    max_context: int,
    build_tokenizer: Callable[[], Tokenizer],
) -> Path:
    if (folder / "tokenizer.json").exists() and (folder / "config.json").exists():
        return folder
    # A staging folder of this process's own: the jobs of a parallel sweep on a fresh
    # cache build the same model at once, and the first complete one wins.
    staging = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(staging / "tokenizer.json"))
    (staging / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "</s>",
                "add_bos_token": False,
                "model_max_length": max_context,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    config = model_config(architecture, tokenizer.get_vocab_size(), max_context)
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    (staging / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "do_sample": False}, indent=2)
    )
    if folder.exists() and not (folder / "tokenizer.json").exists():
        shutil.rmtree(folder, ignore_errors=True)  # left incomplete by an older runner
    try:
        staging.rename(folder)
    except OSError:
        # Another process finished the same model first: use its folder.
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / "tokenizer.json").exists():
            raise
        return folder
    log.info("generated the model %s (vocabulary %d) in %s", architecture.get("model_type"),
             tokenizer.get_vocab_size(), folder)  # fmt: skip
    return folder
