"""Pinning the checkpoint before anything is downloaded (seed 004 §4)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from runner.config import Model
from runner.prepare.modelref import fingerprint, resolve_revision, snapshot_folder

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def model(revision: str | None) -> Model:
    return Model(
        name="m", repo="nvidia/Llama-3.1-8B-Instruct-NVFP4", revision=revision, weights="nvfp4",
        served_name="m", max_context=131072,
    )


def hf_cache(tmp_path: Path) -> Path:
    """A Hugging Face hub cache laid out as huggingface_hub writes it."""
    folder = tmp_path / "models--nvidia--Llama-3.1-8B-Instruct-NVFP4"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"quantization_config": {"quant_algo": "NVFP4", "quant_method": "modelopt"}}))
    (snapshot / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return tmp_path


def test_a_commit_needs_no_lookup() -> None:
    resolved = resolve_revision(model(COMMIT), None, ask_hub=False)
    assert resolved.commit == COMMIT and resolved.pinned


def test_a_branch_resolves_from_the_local_cache(tmp_path: Path) -> None:
    resolved = resolve_revision(model("main"), hf_cache(tmp_path), ask_hub=False)
    assert resolved.commit == COMMIT
    assert "refs/main" in resolved.source


def test_an_unknown_branch_stays_unresolved_and_says_so(tmp_path: Path) -> None:
    resolved = resolve_revision(model("nightly"), hf_cache(tmp_path), ask_hub=False)
    assert resolved.commit is None and not resolved.pinned
    assert "nightly" in resolved.source


def test_fingerprint_keeps_hashes_and_the_quantization_config(tmp_path: Path) -> None:
    """Seed 004 §4: hashes of config.json and the safetensors index, quantization_config,
    tokenizer and chat-template revisions go into the manifest."""
    snapshot = snapshot_folder(hf_cache(tmp_path), "nvidia/Llama-3.1-8B-Instruct-NVFP4", COMMIT)
    facts = fingerprint(snapshot)
    assert facts["sha256:config.json"] == hashlib.sha256((snapshot / "config.json").read_bytes()).hexdigest()
    assert "sha256:model.safetensors.index.json" in facts
    assert facts["quantization_config"]["quant_algo"] == "NVFP4"
    assert facts["sha256:chat_template"] == hashlib.sha256(b"{{ messages }}").hexdigest()
