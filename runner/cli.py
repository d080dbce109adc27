"""The entry point: Hydra composes the config groups, runner takes it from there.

Below this module nothing sees Hydra's ``DictConfig``: it is turned into one
validated :class:`runner.config.RunConfig`. Anything a user can cause ends as one
paragraph on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from runner.config import build_config
from runner.errors import RunnerError

log = logging.getLogger("runner")


def config_dir() -> str:
    """The packaged config folder: the repo's ``conf/`` or the installed ``runner.conf``.

    Hydra resolves a relative ``config_path`` against the calling module, which breaks
    for ``python -m runner`` from an installed package; an absolute path works in both.
    """
    repo_conf = Path(__file__).resolve().parent.parent / "conf"
    if (repo_conf / "runner.yaml").exists():
        return str(repo_conf)
    from importlib.resources import files

    return str(files("runner.conf"))


def to_plain(cfg: DictConfig) -> dict[str, Any]:
    plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert isinstance(plain, dict)
    plain.pop("hydra", None)
    return plain


def _terminate(signum: int, frame: Any) -> None:
    # SIGTERM unwinds like Ctrl-C, so every context manager stops its engine.
    raise KeyboardInterrupt(f"signal {signum}")


@hydra.main(config_path=config_dir(), config_name="runner", version_base="1.3")
def app(cfg: DictConfig) -> Any:
    from runner.run import execute

    # Hydra sets the root logger to INFO; one log line per HTTP request would bury the
    # one console line per window that users read.
    for noisy in ("httpx", "httpcore", "urllib3", "docker", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    console = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        config = build_config(to_plain(cfg))
        summary = execute(config, console)
    except RunnerError as exc:
        err.print(f"[bold red]runner:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[bold red]runner:[/] interrupted; the engine was stopped and rows written so far are kept.")
        sys.exit(130)
    return summary.get("median_aggregate_tok_s")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
