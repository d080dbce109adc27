"""The entry point: Hydra composes the config groups, runner takes it from there.

Below this module nothing sees Hydra's ``DictConfig``: it is turned into one
validated :class:`runner.config.RunConfig`. Anything a user can cause ends as one
paragraph on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.markup import escape

from runner.config import build_config, did_you_mean
from runner.errors import ConfigError, RunnerError
from runner.prepare.launch import API_KEY_VARIABLE, SECRET_FLAGS, owned_flag
from runner.secret import RedactingFilter, has_credentials, is_env_name, is_secret_name, redact

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


def _terminate(signum: int, frame: Any) -> None:
    # SIGTERM unwinds like Ctrl-C, so every context manager stops its engine.
    raise KeyboardInterrupt(f"signal {signum}")


@hydra.main(config_path=config_dir(), config_name="runner", version_base="1.3")
def app(cfg: DictConfig) -> Any:
    from runner.run.pipeline import execute

    # Hydra sets the root logger to INFO; one log line per HTTP request would bury the
    # one console line per window that users read.
    for noisy in ("httpx", "httpcore", "urllib3", "docker", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    redact_logs()
    console = Console(highlight=False, soft_wrap=True)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        config = build_config(to_plain(cfg))
        summary = execute(config, console)
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
    return summary.get("median_aggregate_tok_s")


def print_error(err: Console, exc: RunnerError) -> None:
    """The one paragraph a user reads for anything runner refuses or could not do."""
    err.print(f"[bold red]runner:[/] {escape(redact(str(exc)))}", soft_wrap=True)


def redact_logs() -> None:
    """Every log handler (console and runner.log) shows URLs without their credentials."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(item, RedactingFilter) for item in handler.filters):
            handler.addFilter(RedactingFilter())


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


# Hydra's flags that take a value as the next word (or after "=").
_VALUE_FLAGS = {"--config-dir": "config_dir", "-cd": "config_dir",
                "--config-name": "config_name", "-cn": "config_name"}
_MULTIRUN_FLAGS = {"-m", "--multirun"}


def split_hydra_flags(args: list[str]) -> tuple[dict[str, str], set[str], list[str]]:
    """``(values of --config-dir/--config-name, other flags, overrides)`` of a command line."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    overrides: list[str] = []
    words = iter(args)
    for word in words:
        name, has_value, value = word.partition("=")
        if name in _VALUE_FLAGS:
            values[_VALUE_FLAGS[name]] = value if has_value else next(words, "")
        elif word.startswith("-"):
            flags.add(word)
        else:
            overrides.append(word)
    return values, flags, overrides


def refuse_secrets(overrides: list[str], *, multirun: bool) -> None:
    """Refuse a secret on the command line before Hydra prints or saves any override.

    Hydra writes a multirun's overrides to multirun.yaml and logs each job's before
    runner sees them, so secrets are caught here, and never echoed: the paragraph
    names the key, not the value. Raises :class:`ConfigError`.
    """
    problems = []
    for override in overrides:
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key.startswith("engine.env.") and is_secret_name(key.removeprefix("engine.env.")):
            problems.append(f"{key} looks like a secret")
        elif key == "engine.env" and any(
            is_secret_name(name) for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*:", value)
        ):
            problems.append("engine.env holds a secret-looking name")
        elif key.startswith("engine.extra_args"):
            for word in re.split(r"[\[\],\s'\"]+", value):
                if flag := owned_flag(word, SECRET_FLAGS):
                    problems.append(f"engine.extra_args passes {flag}")
        elif (
            key == "engine.api_key_env"
            and value not in (API_KEY_VARIABLE, "null", "")
            # A name is left to validation (which refuses it without echoing); anything
            # else, or anything Hydra would print, may be the key itself.
            and (multirun or not is_env_name(value))
        ):
            problems.append(
                f"engine.api_key_env holds something other than {API_KEY_VARIABLE}, "
                "perhaps the key itself (not shown)"
            )
        if multirun and has_credentials(value):
            problems.append(f"{key} holds a URL with credentials")
    if problems:
        where = (
            "a multirun, whose overrides Hydra prints and saves before runner starts"
            if multirun
            else "the command line, which shell history and process lists keep"
        )
        raise ConfigError(
            f"What looks like a secret was given on {where}: "
            f"{'; '.join(dict.fromkeys(problems))}. runner "
            "reads secrets from your environment only: export HF_TOKEN (with "
            f"model.needs_hf_token=true) or {API_KEY_VARIABLE} (with engine.api_key_env="
            f"{API_KEY_VARIABLE}); for an MLflow server that needs a login, export "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead of writing them "
            "into tracking.uri. Nothing was started or written."
        )


def check_command_line(args: list[str]) -> None:
    """Check a command line before Hydra acts on it; raises :class:`ConfigError`.

    Secrets are refused first. Then the config is composed as Hydra is about to, so
    that a missing --config-dir, a malformed option file or an override Hydra refuses
    (a mistyped key or option) ends as runner's one paragraph instead of Hydra's
    report. Each swept value is composed on its own (a multirun's, or a sweep file's
    that sets ``hydra.mode: MULTIRUN``). With any other Hydra flag (``--cfg``,
    ``--info``, ...) Hydra's own handling stays in charge.
    """
    values, flags, overrides = split_hydra_flags(args)
    multirun = bool(flags & _MULTIRUN_FLAGS) or "hydra.mode=MULTIRUN" in overrides
    refuse_secrets(overrides, multirun=multirun)
    extra_dir = values.get("config_dir")
    if extra_dir is not None and not Path(extra_dir).expanduser().is_dir():
        raise ConfigError(
            f"The config folder given with --config-dir, {extra_dir}, is not a folder on "
            "this machine (looked for "
            f"{Path(extra_dir).expanduser().resolve()}). Check the path; nothing was started."
        )
    if flags - _MULTIRUN_FLAGS:
        return
    jobs, sweeps = _jobs(overrides)
    modes = {_compose(job, values.get("config_name", "runner"), extra_dir) for job in jobs}
    if "MULTIRUN" in modes and not multirun:
        # A sweep file that sets hydra.mode itself: Hydra will print every override.
        refuse_secrets(overrides, multirun=True)
    elif sweeps and not multirun:
        raise ConfigError(
            f"{', '.join(sweeps)} names several values, which only a multirun runs: add -m "
            "for one job per value (or write [a,b] for a list, 'a,b' for text); nothing "
            "was started."
        )


def _jobs(overrides: list[str]) -> tuple[list[list[str]], list[str]]:
    """One override list per swept value (each sweep alone), so every option file is
    read; and the keys that are swept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError(_override_paragraph(exc)) from exc
    fixed = [item.input_line for item in parsed if not item.is_sweep_override()]
    jobs, sweeps = [fixed], []
    for item in parsed:
        if item.is_sweep_override():
            key = item.get_key_element()
            sweeps.append(key)
            jobs += [[*fixed, f"{key}={value}"] for value in item.sweep_string_iterator()]
    return jobs, sweeps


def _compose(overrides: list[str], config_name: str, extra_dir: str | None) -> str | None:
    """Compose as ``python -m runner [--config-dir D] [--config-name N] OVERRIDES`` would;
    returns the composed ``hydra.mode`` (a sweep file may set MULTIRUN itself)."""
    import yaml
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode

    search_path = create_config_search_path(config_dir())
    if extra_dir is not None:
        # Where Hydra itself puts --config-dir: after the packaged groups.
        search_path.prepend(
            provider="command-line",
            path=f"file://{Path(extra_dir).expanduser().resolve()}",
            anchor=SearchPathQuery(provider="schema"),
        )
    GlobalHydra.instance().clear()
    try:
        hydra_app = Hydra.create_main_hydra2(task_name="runner", config_search_path=search_path)
        cfg = hydra_app.compose_config(
            config_name, overrides, run_mode=RunMode.RUN, with_log_configuration=False
        )
    except HydraException as exc:
        raise ConfigError(_override_paragraph(exc)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"An option file is not valid YAML: {' '.join(str(exc).split())}. Fix the file "
            "at the line named; nothing was started."
        ) from exc
    finally:
        GlobalHydra.instance().clear()
    mode = OmegaConf.select(cfg, "hydra.mode")
    return getattr(mode, "name", None)


def _override_paragraph(exc: Exception) -> str:
    message = " ".join(str(exc).split("Config search path:")[0].split())
    cause = str(exc.__cause__ or "")
    hint = (
        "`python -m runner --help` lists every group's options and "
        "`python -m runner --cfg job` every key"
    )
    found = re.search(r"Could not override '([^']+)'", message)
    if found and "not in struct" in cause:
        named = found.group(1)
        message = f"'{named}' is not a key runner knows{did_you_mean(named.split('.'))}"
        hint = "`python -m runner --cfg job` lists every key"
    return (
        f"The command line does not compose into a config: {message.rstrip('. ')}. "
        f"{hint}; nothing was started."
    )


def main() -> None:
    try:
        check_command_line(sys.argv[1:])
    except RunnerError as exc:
        print_error(Console(stderr=True, highlight=False, soft_wrap=True), exc)
        sys.exit(exc.exit_code)
    app()


if __name__ == "__main__":
    main()
