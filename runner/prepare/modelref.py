"""Pin the checkpoint: resolve the model revision to a commit and fingerprint its files.

Seed 004 §4: the repository commit is resolved and recorded *before* anything is
downloaded, and the manifest keeps the hashes of ``config.json`` and the safetensors
index, the ``quantization_config``, and the tokenizer and chat-template revisions.
Resolution looks in the local Hugging Face cache first (``refs/<branch>``), then asks
the Hub; a revision that is already a commit needs neither.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi

from runner.config import Model

log = logging.getLogger("runner")

COMMIT = re.compile(r"^[0-9a-f]{40}$")
FINGERPRINTED = (
    "config.json",
    "model.safetensors.index.json",
    "hf_quant_config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


@dataclass(frozen=True)
class ResolvedModel:
    """What the run serves: the commit (None when unresolved) and where it came from."""

    repo: str
    requested: str | None
    commit: str | None
    source: str
    files: dict[str, Any] = field(default_factory=dict)

    @property
    def pinned(self) -> bool:
        return self.commit is not None


def hub_folder(hf_cache: Path, repo: str) -> Path:
    return hf_cache / ("models--" + repo.replace("/", "--"))


def resolve_revision(model: Model, hf_cache: Path | None, *, ask_hub: bool = True) -> ResolvedModel:
    """Resolve ``model.revision`` (a branch, tag or commit) to a commit, or say why not."""
    requested = model.revision
    if requested and COMMIT.match(requested):
        return ResolvedModel(model.repo, requested, requested, "given as a commit")
    ref = requested or "main"
    if hf_cache is not None:
        ref_file = hub_folder(hf_cache.expanduser(), model.repo) / "refs" / ref
        if ref_file.is_file():
            commit = ref_file.read_text().strip()
            if COMMIT.match(commit):
                return ResolvedModel(model.repo, requested, commit, f"local cache refs/{ref}")
    if ask_hub:
        commit = _ask_hub(model.repo, ref)
        if commit:
            return ResolvedModel(model.repo, requested, commit, f"Hugging Face Hub ({ref})")
    return ResolvedModel(model.repo, requested, None, f"unresolved ({ref} not in the local cache or the Hub)")


def _ask_hub(repo: str, ref: str) -> str | None:
    try:
        # The token, if any, comes from the environment only and is never logged.
        info = HfApi(token=os.environ.get("HF_TOKEN") or None).model_info(repo, revision=ref, timeout=10)
    except Exception as exc:  # noqa: BLE001 - any hub failure means "unresolved", said plainly
        log.info("could not resolve %s@%s on the Hub: %s", repo, ref, exc.__class__.__name__)
        return None
    return info.sha


def fingerprint(snapshot: Path) -> dict[str, Any]:
    """SHA-256 of the files that define the checkpoint, and its quantization_config."""
    facts: dict[str, Any] = {}
    for name in FINGERPRINTED:
        path = snapshot / name
        if path.is_file():
            facts[f"sha256:{name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    config_path = snapshot / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        if "quantization_config" in config:
            facts["quantization_config"] = config["quantization_config"]
    quant_path = snapshot / "hf_quant_config.json"
    if quant_path.is_file() and "quantization_config" not in facts:
        facts["quantization_config"] = json.loads(quant_path.read_text())
    tokenizer_config = snapshot / "tokenizer_config.json"
    if tokenizer_config.is_file():
        template = json.loads(tokenizer_config.read_text()).get("chat_template")
        if isinstance(template, str):
            facts["sha256:chat_template"] = hashlib.sha256(template.encode()).hexdigest()
    return facts


def snapshot_folder(hf_cache: Path, repo: str, commit: str) -> Path:
    return hub_folder(hf_cache.expanduser(), repo) / "snapshots" / commit
