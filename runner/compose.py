"""The Hydra side of runner: where the config groups live and how a composed config
becomes the plain data :func:`runner.config.build_config` validates.

Only the commands (``runner.cli``, ``runner.tune``) and the tuner's study compose
configs; nothing below them sees a ``DictConfig``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.errors import ConfigError


def config_dir() -> str:
    """The packaged config folder: the repo's ``conf/`` or the installed ``runner.conf``.

    Hydra resolves a relative ``config_path`` against the calling module, which breaks
    for ``python -m runner`` from an installed package; an absolute path works in both.
    """
    repo_conf = Path(__file__).resolve().parent.parent / "conf"
    if (repo_conf / "runner.yaml").exists():
        return str(repo_conf)
    return str(files("runner.conf"))


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain data, interpolations resolved, Hydra's own node dropped."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(
            f"The composed config cannot be resolved: {exc}. Check the ${{...}} "
            "interpolations and the keys marked ??? in your overrides and option files."
        ) from exc
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    return plain
