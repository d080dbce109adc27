"""The embedded default's model: a tiny Llama generated locally, nothing downloaded.

vLLM serves it with ``--load-format dummy`` (random weights), which is enough to
measure serving capacity on the CPU: the scheduler, KV cache and streaming paths
are the real ones. The folder is cached by a hash of its definition, so every run
on every machine serves the same model files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def definition_hash() -> str:
    spec = json.dumps(
        {"arch": ARCHITECTURE, "vocab": VOCAB_SIZE, "special": SPECIAL_TOKENS, "tpl": CHAT_TEMPLATE},
        sort_keys=True,
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def ensure_tiny_model(cache_dir: Path, max_context: int) -> Path:
    """Return the folder of the tiny model, generating it on first use."""
    folder = cache_dir.expanduser() / "models" / f"tiny-llama-{definition_hash()}-{max_context}"
    if (folder / "tokenizer.json").exists() and (folder / "config.json").exists():
        return folder

    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed=0), trainer=trainer)
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
    config = dict(ARCHITECTURE, vocab_size=tokenizer.get_vocab_size(), max_position_embeddings=max_context)
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    (staging / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, indent=2)
    )
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    log.info("generated the tiny model in %s", folder)
    return folder
