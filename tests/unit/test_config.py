"""The tracked YAML composes, with Hydra's own compose API, into valid configs."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.cli import check_command_line
from runner.config import RunConfig, build_config, known_keys
from runner.errors import ConfigError
from runner.measure.uncertainty import BATCH_REQUESTS, MIN_BATCHES
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


def literal_values(group: str, option: str) -> dict[str, object]:
    """The option file's plain scalar values (no interpolation), as the config must hold them."""
    data = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"), resolve=False)
    assert isinstance(data, dict) and data, f"{group}/{option}.yaml is empty"
    return {
        key: value
        for key, value in data.items()
        if key != "defaults" and isinstance(value, str | int | float | bool)
        and not (isinstance(value, str) and "${" in value)
    }


def test_the_default_is_the_cpu_run() -> None:
    config = compose_config()
    assert config.hw is None
    assert (config.model.name, config.engine.name, config.backend.kind) == ("tiny", "cpu", "process")
    validate(config)


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
    if option.startswith("chat_sessions"):
        extra = ["engine.enable_prefix_caching=true"]  # refused without it, by design
    refusals = []
    for context in [[]] + [[f"+hw={profile}"] for profile in HW_PROFILES]:
        config = compose_config(*context, f"{group}={option}", "dry_run=true", *extra)
        for key, value in literal_values(group, option).items():
            assert getattr(getattr(config, group), key) == value, (group, option, key)
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


def test_the_cpu_defaults_full_windows_carry_intervals_at_the_floor() -> None:
    """A window carries 95% intervals only with MIN_BATCHES batches of BATCH_REQUESTS
    typical requests. At the floor a request of the default's answer length takes its
    decode at 15 tok/s plus the prefill wait (0.2-0.7 s on 2 cores): 22 s windows held
    three batches, so a real default run decided near the floor without intervals, in 11
    full windows where the simulator had costed the search with them."""
    config = compose_config()
    request_s = config.workload.max_tokens / config.slo.min_user_tok_s + 0.7
    batches = config.search.window_s // (BATCH_REQUESTS * request_s)
    assert batches >= MIN_BATCHES


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
        check_command_line([override, "dry_run=true"])
    message = str(caught.value)
    assert "\n" not in message and message.endswith("nothing was started.")
    for word in words:
        assert word in message, message


def test_hydra_flags_and_valid_overrides_pass_the_composition_check() -> None:
    check_command_line(["+hw=rtx5090", "kv=nvfp4", "hydra.run.dir=/tmp/x", "dry_run=true"])
    check_command_line(["-m", "engine.max_num_seqs=4,5", "hydra/launcher=joblib"])
    check_command_line(["--config-dir", "sweeps", "--config-name", "max_num_seqs", "+hw=h200"])
    check_command_line(["--cfg", "job", "engine.max_num_seq=4"])  # Hydra's own report


def test_a_multirun_is_composed_once_per_swept_value() -> None:
    """A mistyped key or option in a sweep is refused before Hydra launches any job."""
    with pytest.raises(ConfigError, match="did you mean engine.max_num_seqs"):
        check_command_line(["-m", "engine.max_num_seq=4,5"])
    with pytest.raises(ConfigError, match="kv/nvfp5"):
        check_command_line(["-m", "kv=auto,nvfp5"])


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
    validate(pinned)


def test_engine_arguments_and_environment_are_text_as_typed_on_the_command_line() -> None:
    """`[--stream-interval,16]` is an argv; Hydra reads its 16 as a number."""
    config = compose_config(
        "engine.extra_args=[--stream-interval,16]", "+engine.env.VLLM_FLAG=1", "+engine.env.ON=true"
    )
    assert config.engine.extra_args == ["--stream-interval", "16"]
    assert config.engine.env == {"VLLM_FLAG": "1", "ON": "true"}


def test_a_key_of_another_search_kind_is_named_as_such() -> None:
    """search and workload take only their kind's keys: no YAML carries ignored keys."""
    data = compose_plain("search=fixed")
    data["search"]["max_users"] = 64
    with pytest.raises(ConfigError) as caught:
        build_config(data)
    assert "search.max_users belongs to another kind; with search.kind=fixed" in str(caught.value)


def compose_plain(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = compose("runner", overrides=[*overrides, "results.dir=results/test"])
    plain = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(plain, dict)
    return plain
@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (("search=fixed", "search.users=[0]"), ["search.users.0", "greater than or equal to 1"]),
        (("search=fixed", "search.users=[4,-2]"), ["search.users.1"]),
        (("search.start_users=-1",), ["search.start_users"]),
        (("search.window_s=inf",), ["search.window_s", "finite"]),
        (("search.warmup_s=nan",), ["search.warmup_s", "finite"]),
        (("slo.min_user_tok_s=nan",), ["slo.min_user_tok_s", "finite"]),
        (("slo.min_user_tok_s=inf",), ["slo.min_user_tok_s", "finite"]),
        (("workload.request_timeout_s=inf",), ["workload.request_timeout_s"]),
        (("backend=external", "backend.url='http://[::1'"), ["backend.url", "IPv6"]),
        (("backend=external", "backend.url='http://h:port'"), ["backend.url", "port"]),
        (("backend=external", "backend.url=ftp://h"), ["backend.url", "http"]),
        (("tracking.uri='http://u:hunter2@[::1'",), ["tracking.uri", "***"]),
    ],
)
def test_bad_values_are_refused_by_the_schema_before_anything_starts(
    overrides: tuple[str, ...], words: list[str]
) -> None:
    """Issue 8: users=[0] reached the engine and ended in a traceback; inf never ends a window."""
    with pytest.raises(ConfigError) as caught:
        compose_config(*overrides)
    message = str(caught.value)
    assert "\n" not in message and "hunter2" not in message
    for word in words:
        assert word in message, message


# One key per group (and top-level value) with a value of the wrong type.
WRONG_TYPE = {
    "image": "image.allow_unpinned=maybe", "model": "model.max_context=huge",
    "kv": "kv.cache_dtype=fp16", "engine": "engine.max_num_seqs=many",
    "workload": "workload.max_tokens=-5", "search": "search.kind=binary",
    "backend": "backend.on_engine_fault=retry", "tracking": "tracking.enabled=sometimes",
    "slo": "slo.audit_tolerance_pct=0", "smoke": "smoke.memory_repeats=1",
    "hw": "hw.count=0", "run": "dry_run=perhaps",
}


@pytest.mark.parametrize("group", sorted(WRONG_TYPE))
def test_every_group_refuses_a_value_of_the_wrong_type(group: str) -> None:
    overrides = ("+hw=h200", WRONG_TYPE[group]) if group == "hw" else (WRONG_TYPE[group],)
    with pytest.raises(ConfigError) as caught:
        compose_config(*overrides)
    key = WRONG_TYPE[group].split("=")[0]
    assert key in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("group", [*GROUPS, "slo", "smoke", "results"])
def test_every_group_refuses_an_unknown_key(group: str) -> None:
    """Without `+` Hydra refuses it while composing; with `+` runner's schema does."""
    with pytest.raises(ConfigError, match="no_such_key"):
        check_command_line([f"{group}.no_such_key=1"])
    with pytest.raises(ConfigError, match="no_such_key"):
        compose_config(f"+{group}.no_such_key=1")


def test_a_missing_config_dir_and_a_malformed_option_file_are_one_paragraph(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config-dir") as caught:
        check_command_line(["--config-dir", str(tmp_path / "missing"), "dry_run=true"])
    assert str(tmp_path / "missing") in str(caught.value)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "broken.yaml").write_text("name: broken\nrepo: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        check_command_line(["--config-dir", str(tmp_path), "model=broken"])
    message = str(caught.value)
    assert "not valid YAML" in message and "broken.yaml" in message and "line 2" in message


def test_a_sweep_without_a_multirun_is_named_and_a_sweep_file_needs_no_flag() -> None:
    with pytest.raises(ConfigError, match="engine.max_num_seqs names several values"):
        check_command_line(["engine.max_num_seqs=32,64"])
    # sweeps/*.yaml set hydra.mode: MULTIRUN themselves
    sweeps = str(CONF.parent / "sweeps")
    check_command_line(["--config-dir", sweeps, "--config-name", "max_num_seqs", "engine.max_num_seqs=32,64"])
