"""The command line, checked before Hydra acts on it.

Hydra prints and saves a multirun's overrides, and reports a mistyped key or option
in its own words, before runner sees any of it. :func:`check_command_line` runs
first: it refuses secrets given on the command line without echoing them, and
composes the config as Hydra is about to, so that anything a user can get wrong ends
as runner's one paragraph with nothing started.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import OmegaConf

from runner.compose import config_dir
from runner.config import did_you_mean
from runner.errors import ConfigError
from runner.prepare.launch import SECRET_FLAGS, owned_flag
from runner.secret import API_KEY_VARIABLE, has_credentials, is_env_name, is_secret_name

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


