"""``python -m runner.tune``: sequential engine tuning with Optuna (seed 004 §10).

    python -m runner.tune --trials 20 --study llama8b-nvfp4 \\
        --storage sqlite:///mlruns/optuna.db +hw=rtx5090 kv=nvfp4

The study and its trials are :mod:`runner.run.tune`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from hydra import initialize_config_dir
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from optuna.trial import TrialState
from rich.console import Console

from runner import shutdown
from runner.commandline import refuse_secrets
from runner.compose import config_dir
from runner.errors import ConfigError, RunnerError
from runner.run.tune import (
    DEFAULT_SPACE,
    Tuner,
    check_overrides,
    open_study,
    parse_space,
    requeue_interrupted,
    to_overrides,
    trials_done,
)
from runner.secret import redact

log = logging.getLogger("runner")


def tune(args: argparse.Namespace) -> int:
    # Every trial's overrides are logged and stored in the study: no secret among them.
    refuse_secrets(args.overrides, multirun=True)
    space = parse_space(load_space(args.space) if args.space else DEFAULT_SPACE)
    check_overrides(space, args.overrides)
    results_dir = Path(args.results_dir or f"results/tune/{args.study}").expanduser().resolve()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        tuner = Tuner(args.study, space, args.overrides, results_dir)
        tuner.fit_space_to_users()
        study = open_study(args.study, args.storage, args.seed)
        queued = requeue_interrupted(study)
        if queued:
            log.info("re-queued %d trial(s) an interrupted tuner left unfinished", queued)
        remaining = max(0, args.trials - trials_done(study))
        log.info("study %s: %d trial(s) to run", args.study, remaining)
        shutdown.install()
        study.optimize(tuner.objective, n_trials=remaining)
    print_best(study)
    return 0


def load_space(path: str) -> dict[str, Any]:
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (OSError, yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ConfigError(f"The tuning space file {path} cannot be read ({exc}).") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"The tuning space file {path} must map config keys to ranges.")
    return data


def print_best(study: Any) -> None:
    console = Console(highlight=False, soft_wrap=True)
    scored = [
        trial for trial in study.get_trials(deepcopy=False) if trial.state == TrialState.COMPLETE
    ]
    if not scored:
        console.print(f"study {study.study_name}: no trial scored yet")
        return
    best = max(scored, key=lambda trial: trial.value)
    console.print(
        f"[bold green]best trial {best.number}[/]: {best.value:.1f} tok/s median aggregate at "
        f"N={best.user_attrs.get('best_users')} config_id={best.user_attrs.get('config_id')} "
        f"with {' '.join(to_overrides(best.params))}\n"
        f"{len(scored)} scored trial(s); compare them with: python -m runner.compare"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.tune",
        description="Tune engine flags with Optuna: one full capacity search per trial.",
    )
    parser.add_argument(
        "--trials", type=int, required=True, help="total trials the study should reach"
    )
    parser.add_argument("--study", required=True, help="study name; also prefixes each run id")
    parser.add_argument(
        "--storage", default="sqlite:///mlruns/optuna.db", help="Optuna storage URL"
    )
    parser.add_argument(
        "--space", default=None, help="YAML file: config key -> {choices} or {low, high, step, log}"
    )
    parser.add_argument("--results-dir", default=None, help="default: results/tune/<study>")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m runner")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s] %(message)s")
    for noisy in ("httpx", "httpcore", "urllib3", "docker", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Font fallbacks of the report's figures are not the user's concern.
    logging.getLogger("matplotlib").setLevel(logging.ERROR)

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return tune(args)
    except RunnerError as exc:
        err.print(f"runner.tune: {redact(str(exc))}", markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("runner.tune: interrupted; run the same command again to resume the study.")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
