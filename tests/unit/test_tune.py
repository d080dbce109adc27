"""The tuning loop (seed 004 §10): the Optuna search space, its overrides, and the
Hydra sweep files in sweeps/, composed against the real config groups."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from optuna.trial import FixedTrial

from runner.compose import config_dir, to_plain
from runner.config import build_config
from runner.errors import ConfigError
from runner.prepare import identity, validate
from runner.run.tune import (
    DEFAULT_SPACE,
    Param,
    check_overrides,
    fit_to_users,
    min_num_seqs,
    parse_space,
    suggest,
    to_overrides,
)

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
SWEEP_NAMES = sorted(path.stem for path in SWEEPS.glob("*.yaml"))
# Seed 004's GPU recipe with its checkpoint pinned (validation refuses an unpinned one).
RECIPE = ["+hw=rtx5090", "kv=nvfp4", "model.revision=" + "0123456789abcdef" * 2 + "01234567"]


def compose_run(overrides: list[str], tmp_path: Path):
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("runner", overrides=[*overrides, f"results.dir={tmp_path}"])
    return build_config(to_plain(cfg))


def test_default_space_maps_to_overrides_that_set_the_engine(tmp_path: Path) -> None:
    space = parse_space(DEFAULT_SPACE)
    values = suggest(
        FixedTrial(
            {
                "engine.max_num_batched_tokens": 8192,
                "engine.max_num_seqs": 128,
                "engine.gpu_memory_utilization": 0.95,
                "engine.long_prefill_token_threshold": 2048,
            }
        ),
        space,
    )
    overrides = to_overrides(values)
    assert overrides == [
        "engine.max_num_batched_tokens=8192",
        "engine.max_num_seqs=128",
        "engine.gpu_memory_utilization=0.95",
        "engine.long_prefill_token_threshold=2048",
    ]
    config = compose_run([*RECIPE, *overrides], tmp_path)
    assert config.engine.max_num_batched_tokens == 8192
    assert config.engine.max_num_seqs == 128
    assert config.engine.gpu_memory_utilization == 0.95
    assert config.engine.long_prefill_token_threshold == 2048
    # The bracket's ceiling follows the tuned value, so no user count exceeds it.
    assert config.search.max_users == 128
    validate.validate(config)


def test_a_float_step_gives_the_same_config_id_as_the_grid_value(tmp_path: Path) -> None:
    """0.92 + 3 x 0.01 is 0.9500000000000001 in floating point; seed 004 §10 names a
    setup by config_id, so the tuner must not invent a new one for 0.95."""
    space = [Param("engine.gpu_memory_utilization", low=0.92, high=0.96, step=0.01)]
    values = suggest(FixedTrial({"engine.gpu_memory_utilization": 0.92 + 3 * 0.01}), space)
    assert values == {"engine.gpu_memory_utilization": 0.95}
    tuned = compose_run(to_overrides(values), tmp_path)
    grid = compose_run(["engine.gpu_memory_utilization=0.95"], tmp_path)
    assert identity.config_id(tuned) == identity.config_id(grid)


def test_overrides_quote_strings_and_lists() -> None:
    assert to_overrides({"engine.extra_args": ["--long-prefill-token-threshold-adaptive"]}) == [
        'engine.extra_args=["--long-prefill-token-threshold-adaptive"]'
    ]
    assert to_overrides({"engine.enable_chunked_prefill": True, "engine.dtype": "a,b"}) == [
        "engine.enable_chunked_prefill=true",
        'engine.dtype="a,b"',
    ]
    assert to_overrides({"engine.max_num_batched_tokens": None}) == [
        "engine.max_num_batched_tokens=null"
    ]


def test_integer_ranges_suggest_integers() -> None:
    space = parse_space(
        {"engine.max_num_batched_tokens": {"low": 1024, "high": 16384, "step": 1024}}
    )
    values = suggest(FixedTrial({"engine.max_num_batched_tokens": 6144}), space)
    assert values == {"engine.max_num_batched_tokens": 6144}
    assert isinstance(values["engine.max_num_batched_tokens"], int)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"engine.max_num_seqs": 128},
        {"engine.max_num_seqs": {"choices": []}},
        {"engine.max_num_seqs": {"choices": [64], "low": 1}},
        {"engine.max_num_seqs": {"low": 256, "high": 64}},
        {"engine.max_num_seqs": {"low": 64, "hi": 256}},
    ],
)
def test_malformed_spaces_are_refused(spec: dict) -> None:
    with pytest.raises(ConfigError):
        parse_space(spec)


def test_max_num_seqs_never_falls_below_the_users_searched() -> None:
    """Seed 004 §10: max-num-seqs always at least as large as the candidate user count."""
    space = parse_space(DEFAULT_SPACE)
    fitted = {param.key: param for param in fit_to_users(space, 100)}
    assert fitted["engine.max_num_seqs"].choices == (128, 256, 512)
    assert fitted["engine.max_num_batched_tokens"].choices == (2048, 4096, 8192, 16384)
    ranged = fit_to_users([Param("engine.max_num_seqs", low=8, high=512, step=8)], 100)
    assert ranged[0].low == 100
    with pytest.raises(ConfigError, match="seed 004"):
        fit_to_users(space, 1000)
    with pytest.raises(ConfigError):
        fit_to_users([Param("engine.max_num_seqs", low=8, high=64)], 100)


def test_the_users_a_search_may_try() -> None:
    fixed = {"kind": "fixed", "users": [4, 32, 8], "start_users": 7, "max_users": 256}
    bracket = {"kind": "bracket", "users": [], "start_users": 7, "max_users": 300}
    assert min_num_seqs(fixed, max_users_follows_engine=True) == 32
    # A ceiling that follows engine.max_num_seqs moves with each trial's value.
    assert min_num_seqs(bracket, max_users_follows_engine=True) == 7
    assert min_num_seqs(bracket, max_users_follows_engine=False) == 300


def test_an_override_of_a_tuned_key_is_refused() -> None:
    space = parse_space(DEFAULT_SPACE)
    check_overrides(space, ["+hw=rtx5090", "kv=nvfp4", "engine.max_model_len=16384"])
    with pytest.raises(ConfigError, match="engine.max_num_seqs"):
        check_overrides(space, ["engine.max_num_seqs=64"])


def sweep_jobs(name: str, extra: list[str]) -> list[list[str]]:
    """The overrides of every job the sweep file's grid launches, as Hydra expands them."""
    with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
        cfg = compose(
            name,
            overrides=[f"hydra.searchpath=[file://{config_dir()}]", "results.dir=/tmp", *extra],
            return_hydra_config=True,
        )
    assert cfg.hydra.mode.name == "MULTIRUN"
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] for o in parsed]
    return [list(job) for job in itertools.product(*axes)]


@pytest.mark.parametrize("name", SWEEP_NAMES)
def test_every_sweep_job_is_a_valid_gpu_run_with_its_own_config_id(
    name: str, tmp_path: Path
) -> None:
    """Seed 004 §10: every changed server setup is a new config_id, and max-num-seqs
    stays at or above every user count the search tries."""
    jobs = sweep_jobs(name, RECIPE)
    assert len(jobs) >= 2
    ids = set()
    for job in jobs:
        with initialize_config_dir(config_dir=str(SWEEPS), version_base="1.3"):
            cfg = compose(
                name,
                overrides=[
                    f"hydra.searchpath=[file://{config_dir()}]",
                    f"results.dir={tmp_path}",
                    *RECIPE,
                    *job,
                ],
            )
        config = build_config(to_plain(cfg))
        validate.validate(config)
        assert config.search.max_users <= config.engine.max_num_seqs
        assert config.search.kind == "bracket" and config.search.window_s == 300.0
        ids.add(identity.config_id(config))
    assert len(ids) == len(jobs)


def test_the_seed_004_tuning_steps_each_have_a_sweep_file() -> None:
    """Seed 004 §10 tunes in this order: batched tokens, sequences, prefill, memory share."""
    assert SWEEP_NAMES == [
        "gpu_memory_utilization", "max_num_batched_tokens", "max_num_seqs", "prefill"
    ]


def test_sweep_files_comment_every_key_and_cite_the_seed() -> None:
    assert SWEEP_NAMES, f"no sweep files in {SWEEPS}"
    for path in SWEEPS.glob("*.yaml"):
        text = path.read_text()
        assert "seed 004 §10" in text, path
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                assert "#" in line, f"{path.name}: uncommented key: {line}"
