"""Shared test helpers: the config folder and Hydra composition of the real config."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONF_DIR = REPO / "conf"


@pytest.fixture(scope="session")
def conf_dir() -> Path:
    return CONF_DIR


def compose(overrides: list[str] | None = None) -> dict:
    """Compose the real config as ``python -m runner`` would, as a plain dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="runner", overrides=[*(overrides or []), "results.dir=/tmp/runner-test"])
        plain = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(plain, dict)
    return plain
