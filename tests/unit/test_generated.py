"""Generated models: a real architecture's config.json, a tokenizer over its whole
vocabulary, random weights, and results that say so (issue 11)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runner.config import RunConfig, build_config
from runner.errors import ConfigError
from runner.output.report import render_report
from runner.prepare.generated import (
    SPECIAL_TOKENS,
    definition_hash,
    ensure_generated_model,
    ensure_tiny_model,
    full_vocab_tokenizer,
    load_architecture,
)
from runner.prepare.identity import caveats, config_id, family
from runner.prepare.launch import build_launch_plan
from runner.prepare.validate import validate
from runner.workload.context_mix import build_prompts, load_tokenizer
from tests.conftest import compose

H200_8B = ("+hw=h200", "backend=process", "model=llama31_8b_dummy", "kv=auto")


@functools.cache
def config(*overrides: str) -> RunConfig:
    return build_config(compose(list(overrides)))


@pytest.fixture(scope="module")
def llama8b_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8B model's folder, generated once for this module (a couple of seconds)."""
    return ensure_generated_model(tmp_path_factory.mktemp("cache"), config(*H200_8B).model)


def test_the_8b_config_is_llama_3_1_8bs_architecture(llama8b_folder: Path) -> None:
    """The dimensions of meta-llama/Llama-3.1-8B's config.json: what decides the compute
    per token and the KV cache bytes per token on the GPU."""
    written = json.loads((llama8b_folder / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
        "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }  # fmt: skip
    assert {key: written[key] for key in expected} == expected
    assert written["rope_scaling"]["rope_type"] == "llama3"
    assert written["rope_scaling"]["original_max_position_embeddings"] == 8192
    # runner's context, so vLLM's default max_model_len holds seed 004's 30k bucket
    assert written["max_position_embeddings"] == 32768
    tokenizer_config = json.loads((llama8b_folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == 32768


def test_every_id_of_the_8b_vocabulary_decodes_to_text(llama8b_folder: Path) -> None:
    """A random model samples any of its 128,256 IDs; each must decode, or the smoke chat
    check sees no text (the H200 run's 992-token tokenizer could not)."""
    tokenizer = load_tokenizer(llama8b_folder)  # as the workload and vLLM load it
    assert len(tokenizer) == 128256
    config_json = json.loads((llama8b_folder / "config.json").read_text())
    assert tokenizer.bos_token_id == config_json["bos_token_id"]
    assert tokenizer.eos_token_id == config_json["eos_token_id"]
    # vLLM skips special tokens in what it returns: only those decode to nothing.
    pieces = tokenizer.batch_decode([[token] for token in range(128256)], skip_special_tokens=True)
    special = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)
    assert [token for token, piece in enumerate(pieces) if not piece] == special
    assert all(tokenizer.batch_decode([[token] for token in special], skip_special_tokens=False))


def test_the_8b_tokenizer_builds_seed_004s_30k_prompts_exactly(llama8b_folder: Path) -> None:
    """seed 004 §6: exact templated counts up to the 30,000-token bucket."""
    workload = config(*H200_8B).workload.model_copy(update={"prompts_per_bucket": 1})
    prompts = build_prompts(load_tokenizer(llama8b_folder), workload)
    assert [p.prompt_tokens + p.max_tokens for p in prompts] == [b.total_tokens for b in workload.buckets]


def test_a_generated_folder_is_reused_and_named_by_its_definition(
    llama8b_folder: Path, tmp_path: Path
) -> None:
    model = config(*H200_8B).model
    again = ensure_generated_model(llama8b_folder.parent.parent, model)
    assert again == llama8b_folder
    assert definition_hash(model.architecture) in llama8b_folder.name
    wider = dict(model.architecture or {}, hidden_size=2048)
    assert definition_hash(wider) != definition_hash(model.architecture)


def test_the_tiny_model_keeps_its_folder_and_vocabulary(tmp_path: Path) -> None:
    """The CPU default is generated as before: same definition (folder name, manifest)
    and the ~1k-token vocabulary its training reaches."""
    assert definition_hash() == "17554a25d350"
    folder = ensure_tiny_model(tmp_path, 4096)
    assert folder.name == "tiny-llama-17554a25d350-4096"
    assert json.loads((folder / "config.json").read_text())["vocab_size"] < 4096


def test_a_vocabulary_too_small_for_bytes_is_refused() -> None:
    assert full_vocab_tokenizer(len(SPECIAL_TOKENS) + 256).get_vocab_size() == len(SPECIAL_TOKENS) + 256
    with pytest.raises(ConfigError, match="at least 263 tokens"):
        full_vocab_tokenizer(100)


def test_dummy_weights_form_their_own_families() -> None:
    """Random weights are never ranked with a real checkpoint's results (issue 11)."""
    assert family(config(*H200_8B)) == "dummy-weights-bf16"
    fp8 = config("+hw=h200", "backend=process", "model=llama31_8b_dummy_fp8", "kv=fp8")
    assert family(fp8) == "dummy-weights-fp8-fp8kv"
    real = config("+hw=h200")
    assert family(real) == "fp8-fp8kv"
    dummy_real = config("+hw=h200", "engine.load_format=dummy")
    assert family(dummy_real) == "dummy-weights-fp8-fp8kv"
    assert caveats(real) == []


def test_the_report_names_what_random_weights_cannot_show() -> None:
    text = render_report({"caveats": caveats(config(*H200_8B))}, [], [])
    caveat_section = text.split("## Caveats", 1)[1].split("## Windows", 1)[0]
    for words in ("Random weights", "MoE routing", "Speculative decoding", "forced"):
        assert words in caveat_section
    assert "## Caveats" not in render_report({"caveats": caveats(config("+hw=h200"))}, [], [])


def test_a_generated_model_is_served_with_random_weights() -> None:
    """The H200 profile's engine flags load checkpoints; a generated model has none."""
    plan = build_launch_plan(config(*H200_8B), model_path="/m", host="127.0.0.1")
    assert plan.argv[plan.argv.index("--load-format") + 1] == "dummy"
    with pytest.raises(ConfigError, match="engine.load_format=safetensors"):
        validate(config(*H200_8B, "engine.load_format=safetensors"))


def test_config_id_names_the_architecture_not_the_file(tmp_path: Path) -> None:
    embedded = config(*H200_8B)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(embedded.model.architecture))
    from_file = load_architecture(config(*H200_8B, f"model.hf_config={path}"))
    assert from_file.model.architecture == embedded.model.architecture
    assert config_id(from_file) == config_id(embedded)
    path.write_text(json.dumps(dict(embedded.model.architecture or {}, num_hidden_layers=16)))
    assert config_id(load_architecture(config(*H200_8B, f"model.hf_config={path}"))) != config_id(embedded)


def test_an_unreadable_hf_config_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="could not be read"):
        load_architecture(config("model=dummy", f"model.hf_config={tmp_path / 'absent.json'}"))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not the JSON object"):
        load_architecture(config("model=dummy", f"model.hf_config={listed}"))


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (("model=llama31_8b_fp8", "+model.architecture={model_type: llama}"), "set model.generated=true"),
        (("model.architecture.vocab_size=200",), "vocab_size=200"),
        (("model.architecture.architectures=[]",), "no 'architectures'"),
        (("model.max_context=262144",), "exceeds the architecture's max_position_embeddings=131072"),
    ],
)
def test_an_architecture_vllm_cannot_serve_is_refused_before_anything_starts(
    overrides: tuple[str, ...], words: str
) -> None:
    base = ("+hw=h200", "backend=process", "model=llama31_8b_dummy", "kv=auto", "dry_run=true")
    with pytest.raises(ConfigError, match=words):
        validate(config(*base, *overrides))


def test_processes_building_the_same_model_at_once_share_one_complete_folder(
    tmp_path: Path,
) -> None:
    """The jobs of a parallel sweep on a fresh cache generate the tiny model together:
    each builds in a staging folder of its own, the first complete one wins."""
    code = (
        "import sys; from pathlib import Path; "
        "from runner.prepare.generated import ensure_tiny_model; "
        "print(ensure_tiny_model(Path(sys.argv[1]), 4096))"
    )
    repo = Path(__file__).resolve().parents[2]
    builders = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=repo,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]  # fmt: skip
    outputs = [builder.communicate(timeout=120) for builder in builders]
    assert [builder.returncode for builder in builders] == [0, 0, 0], outputs
    (folder,) = {Path(out.strip()) for out, _ in outputs}
    assert (folder / "tokenizer.json").exists() and (folder / "config.json").exists()
    assert [path.name for path in (tmp_path / "models").iterdir()] == [folder.name]
