"""Result families keep incomparable workloads apart; config_id stays about the engine."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from runner.config import RunConfig, build_config
from runner.prepare.identity import config_id, family

CONF = Path(__file__).resolve().parents[2] / "conf"


@functools.lru_cache(maxsize=None)
def compose_config(*overrides: str) -> RunConfig:
    """What `python -m runner OVERRIDES` builds, from the tracked YAML."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        composed = compose("runner", overrides=[*overrides, "results.dir=results/test"])
    return build_config(OmegaConf.to_container(composed, resolve=True))


FORCED = [(), ("workload=context_mix",), ("+hw=rtx5090", "kv=nvfp4"), ("+hw=h200", "kv=fp8")]


@pytest.mark.parametrize("base", FORCED)
@pytest.mark.parametrize(
    "workload", ["workload=context_mix_natural_eos", "workload=context_mix_cpu_natural_eos",
                 "workload=sharegpt"],  # fmt: skip
)
def test_other_workloads_never_share_a_family_with_the_forced_length_mix(
    base: tuple[str, ...], workload: str
) -> None:
    """seed 004 §12: natural-EOS results are kept apart from the forced 512-token ones
    (published as `*-natural-eos`); seed 000's ShareGPT figures are another kind again.
    The served engine is the same, so the config_id is too."""
    forced = compose_config(*base)
    other = compose_config(*base, workload)
    assert forced.workload.ignore_eos is True
    assert family(other) != family(forced)
    assert family(other).startswith(family(forced) + "-")
    assert config_id(other) == config_id(forced)


def test_the_family_names_follow_seed_004s_publish_names() -> None:
    """seed 004 §12 publishes `bf16-natural-eos/` beside the forced-length results; the
    CPU default's tiny model has random weights, which lead its family's name."""
    assert family(compose_config()) == "dummy-weights-bf16"
    natural = compose_config("workload=context_mix_cpu_natural_eos")
    assert family(natural) == "dummy-weights-bf16-natural-eos"
    assert family(compose_config("workload=sharegpt")) == "dummy-weights-bf16-sharegpt-natural-eos"
    forced_sharegpt = compose_config("workload=sharegpt", "workload.ignore_eos=true")
    assert family(forced_sharegpt) == "dummy-weights-bf16-sharegpt"
    assert family(compose_config("+hw=h200")) == "fp8-fp8kv"
    nvfp4 = compose_config("+hw=rtx5090", "kv=nvfp4", "workload=context_mix_natural_eos")
    assert family(nvfp4) == "nvfp4-w4a4-nvfp4kv-natural-eos"


def test_the_natural_eos_mix_keeps_the_forced_mix_except_its_output_limiter() -> None:
    """seed 004 §6: nothing but the output limiter changes between the two variants, and
    max_tokens stays explicit (seed 004 §12)."""
    pairs = [
        ("context_mix", "context_mix_natural_eos"),
        ("context_mix_cpu", "context_mix_cpu_natural_eos"),
    ]
    for forced_name, natural_name in pairs:
        forced = compose_config(f"workload={forced_name}").workload.model_dump()
        natural = compose_config(f"workload={natural_name}").workload.model_dump()
        changed = {key for key in forced if forced[key] != natural[key]}
        assert changed == {"name", "ignore_eos"}
        assert natural["max_tokens"] is not None and natural["ignore_eos"] is False


@pytest.mark.parametrize("base", [(), ("+hw=rtx5090", "kv=nvfp4")])
def test_prefix_caching_is_off_by_default_and_on_means_another_config_id(
    base: tuple[str, ...],
) -> None:
    """seed 004 §6: prefix caching is disabled for the primary result; cache-enabled
    results are collected separately under a different config_id."""
    off = compose_config(*base)
    on = compose_config(*base, "engine.enable_prefix_caching=true")
    assert off.engine.enable_prefix_caching is False
    assert config_id(on) != config_id(off)
    assert family(on) == family(off)
