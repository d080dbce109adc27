"""The tracked YAML composes, with Hydra's own compose API, into valid configs."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.cli import check_composes
from runner.config import RunConfig, build_config, known_keys
from runner.errors import ConfigError
from runner.prepare.validate import validate

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ["image", "model", "kv", "engine", "workload", "search", "backend", "slo", "tracking"]
HW_PROFILES = sorted(path.stem for path in (CONF / "hw").glob("*.yaml"))


@functools.lru_cache(maxsize=None)
def compose_config(*overrides: str) -> RunConfig:
    """What the entry point builds from `python -m runner OVERRIDES`."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = compose("runner", overrides=[*overrides, "results.dir=results/test"])
    return build_config(OmegaConf.to_container(composed, resolve=True))


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def test_the_default_is_the_cpu_run() -> None:
    config = compose_config()
    assert config.hw is None
    assert (config.model.name, config.engine.name, config.backend.kind) == ("tiny", "cpu", "process")
    assert validate(config) == []


@pytest.mark.parametrize("profile", HW_PROFILES)
def test_every_hw_profile_validates_as_a_dry_run(profile: str) -> None:
    config = compose_config(f"+hw={profile}", "dry_run=true")
    assert config.hw is not None and config.hw.name == profile
    validate(config)


@pytest.mark.parametrize(
    ("group", "option"), [(group, option) for group in GROUPS for option in options(group)]
)
def test_every_option_composes_and_validates_somewhere(group: str, option: str) -> None:
    """Each option builds a RunConfig, and the CPU or at least one hw profile accepts it."""
    extra = ["backend.url=http://127.0.0.1:8000"] if option == "external" else []
    refusals = []
    for context in [[]] + [[f"+hw={profile}"] for profile in HW_PROFILES]:
        config = compose_config(*context, f"{group}={option}", "dry_run=true", *extra)
        assert getattr(config, group) is not None
        try:
            validate(config)
        except ConfigError as exc:
            refusals.append(str(exc))
            continue
        return
    pytest.fail(f"{group}={option} is refused everywhere: {refusals}")


def test_every_yaml_key_is_commented() -> None:
    key_line = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*:")
    bare = [
        f"{path.relative_to(CONF)}:{number}"
        for path in CONF.rglob("*.yaml")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if key_line.match(line) and "#" not in line
    ]
    assert bare == []


def test_command_line_groups_win_over_the_hw_recipe() -> None:
    """`+hw=rtx5090` selects seed 004's recipe, but options given by the user are kept."""
    config = compose_config("+hw=rtx5090", "model=tiny", "kv=bf16", "search=fixed", "backend=process")
    assert config.hw is not None and config.hw.name == "rtx5090"
    assert (config.model.name, config.kv.name) == ("tiny", "bf16")
    assert (config.search.kind, config.backend.kind) == ("fixed", "process")
    assert config.engine.name == "llama8b_rtx5090"  # not overridden: the recipe's


def test_gpu_profiles_measure_with_seed_004_windows_and_the_cpu_with_short_ones() -> None:
    """seed 004 §7 and §9: 300 s windows, 30 s warm-up, three confirmations on a GPU."""
    gpu = compose_config("+hw=rtx5090").search
    assert (gpu.kind, gpu.window_s, gpu.warmup_s, gpu.confirm_repeats) == ("bracket", 300.0, 30.0, 3)
    assert gpu.start_users == 7
    cpu = compose_config().search
    assert cpu.kind == "bracket"
    # Short windows, screening for the doubling: the default run answers in minutes.
    assert cpu.window_s <= 30.0 and cpu.warmup_s <= 5.0 and cpu.confirm_repeats < gpu.confirm_repeats
    assert cpu.screening_window_s is not None and cpu.screening_window_s < cpu.window_s


def test_the_search_ceiling_follows_the_engines_max_num_seqs() -> None:
    """seed 004 §10: max-num-seqs is always at least the candidate user count."""
    assert compose_config("engine.max_num_seqs=64").search.max_users == 64
    assert compose_config("+hw=h200x2").search.max_users == 32


def test_an_unknown_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="max_num_seq") as caught:
        compose_config("+engine.max_num_seq=4")
    assert "\n" not in str(caught.value)
    assert "did you mean engine.max_num_seqs?" in str(caught.value)


def test_the_schema_knows_its_keys_at_every_depth() -> None:
    assert "max_num_seqs" in known_keys(["engine"])
    assert known_keys(["workload", "buckets", 0]) == ["total_tokens"]
    assert "min_user_tok_s" in known_keys(["slo"])
    assert known_keys(["engine", "max_num_seqs"]) == known_keys(["nope"]) == []


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("engine.max_num_seq=4", ["'engine.max_num_seq'", "did you mean engine.max_num_seqs?"]),
        ("workload.bucket=3", ["did you mean workload.buckets?"]),
        ("kv=nvfp5", ["kv/nvfp5", "auto bf16 fp8 nvfp4", "--help"]),
    ],
)
def test_an_override_hydra_refuses_becomes_one_paragraph(override: str, words: list[str]) -> None:
    """A key mistyped without ``+`` never reaches the schema: Hydra refuses it while
    composing. The entry point composes first and says so in runner's own words."""
    with pytest.raises(ConfigError) as caught:
        check_composes([override, "dry_run=true"])
    message = str(caught.value)
    assert "\n" not in message and message.endswith("nothing was started.")
    for word in words:
        assert word in message, message


def test_hydra_flags_and_valid_overrides_pass_the_composition_check() -> None:
    check_composes(["+hw=rtx5090", "kv=nvfp4", "hydra.run.dir=/tmp/x", "dry_run=true"])
    check_composes(["-m", "engine.max_num_seq=4,5"])  # multirun: Hydra reports it itself


def test_nvfp4_kv_on_h200_is_refused() -> None:
    """seed 003: Hopper has no native FP4."""
    config = compose_config("+hw=h200", "kv=nvfp4", "dry_run=true")
    with pytest.raises(ConfigError, match="nvfp4") as caught:
        validate(config)
    message = str(caught.value)
    assert "Hopper" in message and "\n" not in message


def test_a_context_window_below_the_largest_bucket_is_refused() -> None:
    config = compose_config("engine.max_model_len=8192", "workload=context_mix")
    with pytest.raises(ConfigError) as caught:
        validate(config)
    message = str(caught.value)
    assert "8192" in message and "30000" in message and "\n" not in message


def test_a_measured_gpu_run_needs_a_pinned_image_and_revision() -> None:
    with pytest.raises(ConfigError) as caught:
        validate(compose_config("+hw=h200x2"))
    message = str(caught.value)
    assert "image.digest" in message and "model.revision" in message
    pinned = compose_config(
        "+hw=h200x2",
        "image.digest=sha256:" + "ab" * 32,
        "model.revision=" + "0123456789abcdef" * 2 + "01234567",
    )
    assert validate(pinned) == []


def test_engine_arguments_and_environment_are_text_as_typed_on_the_command_line() -> None:
    """`[--stream-interval,16]` is an argv; Hydra reads its 16 as a number."""
    config = compose_config(
        "engine.extra_args=[--stream-interval,16]", "+engine.env.VLLM_FLAG=1", "+engine.env.ON=true"
    )
    assert config.engine.extra_args == ["--stream-interval", "16"]
    assert config.engine.env == {"VLLM_FLAG": "1", "ON": "true"}
