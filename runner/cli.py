"""The entry point: Hydra composes the config groups, runner takes it from there.

Below this module nothing sees Hydra's ``DictConfig``: it is turned into one
validated :class:`runner.config.RunConfig`. Anything a user can cause ends as one
paragraph on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from runner import shutdown
from runner.commandline import check_command_line
from runner.compose import config_dir, to_plain
from runner.config import build_config
from runner.errors import RunnerError
from runner.secret import RedactingFilter, redact

log = logging.getLogger("runner")


# Slot locks this process holds, kept open for its lifetime: the lock is what tells
# a parallel job on the same host that the slot is taken.
_held_slots: dict[int, tuple[int, Any]] = {}


def host_slot(count: int, base: int = 0) -> int:
    """``${runner.slot:COUNT[,BASE]}``: BASE plus a slot in [0, COUNT) that no other
    runner process on this host holds.

    Parallel jobs of a multirun (joblib launcher) need distinct GPUs and engine ports.
    ``hydra.job.num`` cannot provide them: a worker that finishes early takes the next
    job while its neighbours still run, so ``job.num % COUNT`` can collide. A slot is
    an flock'ed file held until the process exits; a worker that runs several jobs in
    turn keeps the same slot for all of them.
    """
    count, base = int(count), int(base)
    if count in _held_slots:
        return base + _held_slots[count][0]
    folder = Path(tempfile.gettempdir()) / f"runner-slots-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(count):
        handle = open(folder / f"{count}-{slot}.lock", "w")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _held_slots[count] = (slot, handle)
        return base + slot
    raise RunnerError(
        f"All {count} slots of ${{runner.slot:{count}}} are held by other runner processes "
        "on this host, so this job would share a GPU or port with one of them. Run at most "
        f"{count} jobs at once (hydra.launcher.n_jobs={count}) or raise the slot count."
    )


OmegaConf.register_new_resolver("runner.slot", host_slot, replace=True)


@hydra.main(config_path=config_dir(), config_name="runner", version_base="1.3")
def app(cfg: DictConfig) -> Any:
    # Hydra sets the root logger to INFO; one log line per HTTP request would bury the
    # one console line per window that users read.
    for noisy in ("httpx", "httpcore", "urllib3", "docker", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Font fallbacks of the report's figures are not the user's concern.
    logging.getLogger("matplotlib").setLevel(logging.ERROR)
    redact_logs()
    console = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    shutdown.install()
    try:
        config = build_config(to_plain(cfg))
        # Imported once the config is valid: the pipeline brings transformers and
        # MLflow, seconds of imports a refused override should not wait for.
        from runner.run.pipeline import execute

        job = HydraConfig.get().job.num if _in_multirun() else None
        summary = execute(config, console, job)
    except RunnerError as exc:
        print_error(err, exc)
        if _in_multirun():
            # Hydra marks the job failed, runs the remaining jobs of the sweep (one
            # setup that cannot start must not cancel the others) and exits non-zero.
            raise
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("[bold red]runner:[/] interrupted; the engine was stopped and rows written so far are kept.")
        sys.exit(130)
    return summary.objective


def print_error(err: Console, exc: RunnerError) -> None:
    """The one paragraph a user reads for anything runner refuses or could not do."""
    err.print(f"[bold red]runner:[/] {escape(redact(str(exc)))}", soft_wrap=True)


def redact_logs() -> None:
    """Every log handler (console and runner.log) shows URLs without their credentials."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(item, RedactingFilter) for item in handler.filters):
            handler.addFilter(RedactingFilter())


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def main() -> None:
    try:
        check_command_line(sys.argv[1:])
    except RunnerError as exc:
        print_error(Console(stderr=True, highlight=False, soft_wrap=True), exc)
        sys.exit(exc.exit_code)
    app()


if __name__ == "__main__":
    main()
