"""Sequential engine tuning with Optuna (seed 004 §10): one full search per trial.

    python -m runner.tune --trials 20 --study llama8b-nvfp4 \\
        --storage sqlite:///mlruns/optuna.db +hw=rtx5090 kv=nvfp4

Each trial suggests engine flags from a search space (:data:`DEFAULT_SPACE`, or a YAML
file given with ``--space``), composes runner's config with them on top of the
overrides given, and runs a whole capacity search (:func:`runner.run.execute`): a new
``config_id``, a restarted engine, a full bracket. The objective is the decision's
median aggregate output tok/s; a setup with no user count that meets the floor scores
0.0, a measured fact that steers the sampler away from it. A setup that cannot be run
at all (it does not start, a config rule refuses it) is pruned, which the sampler
ranks below every scored trial, and the study goes on.

The study lives in the storage given (sqlite by default), so a tuner that is killed
starts again where it stopped: ``--trials`` is the total the study should reach, and
a trial cut short is run again with the same flags. Its run id is
``<study>-<config_id>`` with results under ``<results-dir>/<config_id>``, so the
repeated trial resumes the interrupted search window by window, and a setup already
searched (samplers do repeat themselves) replays its decision without starting an
engine. One tuner per study: trials run one after another on this host's engine.

The Hydra Optuna sweeper plugin is not used: it pins Optuna 2 and its sqlite storage
fails under SQLAlchemy 2.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from hydra import compose
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from optuna.trial import TrialState
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError

from runner.compose import to_plain
from runner.config import Results, RunConfig, build_config
from runner.errors import ConfigError, RunnerError
from runner.prepare import identity
from runner.run.context import pin_model
from runner.run.pipeline import execute
from runner.run.resume import prior_windows
from runner.run.summary import RunSummary
from runner.search.history import observation
from runner.search.policy import SearchParams, decide, next_step

log = logging.getLogger("runner")

# A grid-free version of the sweeps in sweeps/, for one GPU serving seed 004's mix:
# the step budget (and chunk size), the request ceiling, the memory share moved
# cautiously from 0.92 toward 0.96, and the long-prefill cap (0: none).
DEFAULT_SPACE: dict[str, dict[str, Any]] = {
    "engine.max_num_batched_tokens": {"choices": [2048, 4096, 8192, 16384]},
    "engine.max_num_seqs": {"choices": [64, 128, 256, 512]},
    "engine.gpu_memory_utilization": {"low": 0.92, "high": 0.96, "step": 0.01},
    "engine.long_prefill_token_threshold": {"choices": [0, 1024, 2048, 4096]},
}

MAX_NUM_SEQS = "engine.max_num_seqs"
INTERRUPTED = "interrupted"
RETRY_OF = "retry_of"


@dataclass(frozen=True)
class Param:
    """One tuned config key: a list of choices, or an int or float range."""

    key: str
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    @property
    def is_int(self) -> bool:
        return all(isinstance(value, int) for value in (self.low, self.high, self.step or 1))


def parse_space(data: Mapping[str, Any]) -> list[Param]:
    """The search space from plain values (the YAML file's content)."""
    if not data:
        raise ConfigError("The tuning space is empty: name at least one config key to tune.")
    space = []
    for key, spec in data.items():
        if not isinstance(spec, Mapping):
            raise ConfigError(
                f"The tuning space entry {key!r} is {spec!r}; give either "
                "{choices: [...]} or {low: A, high: B} with optional step and log."
            )
        unknown = set(spec) - {"choices", "low", "high", "step", "log"}
        if unknown:
            raise ConfigError(
                f"The tuning space entry {key!r} has unknown fields {sorted(unknown)}; "
                "the fields are choices, or low, high, step and log."
            )
        if "choices" in spec:
            if not spec["choices"] or len(spec) > 1:
                raise ConfigError(
                    f"The tuning space entry {key!r} needs a non-empty choices list and "
                    "nothing else (low/high describe a range instead)."
                )
            space.append(Param(key, choices=tuple(spec["choices"])))
            continue
        low, high = spec.get("low"), spec.get("high")
        if not _is_number(low) or not _is_number(high) or low > high:
            raise ConfigError(
                f"The tuning space entry {key!r} needs numbers low <= high, got "
                f"low={low!r} high={high!r}."
            )
        space.append(
            Param(key, low=low, high=high, step=spec.get("step"), log=bool(spec.get("log")))
        )
    return space


def fit_to_users(space: Sequence[Param], min_num_seqs: int) -> list[Param]:
    """The space with ``engine.max_num_seqs`` never below the users the search may try
    (seed 004 §10): smaller choices are dropped, a range is raised to start there."""
    fitted = []
    for param in space:
        if param.key != MAX_NUM_SEQS:
            fitted.append(param)
        elif param.choices:
            kept = tuple(value for value in param.choices if value >= min_num_seqs)
            if not kept:
                raise ConfigError(
                    f"Every choice of {MAX_NUM_SEQS} {list(param.choices)} is below "
                    f"{min_num_seqs}, the most users the search may try; the engine would "
                    "queue users instead of serving them (seed 004 §10). Add larger "
                    "choices or search fewer users."
                )
            fitted.append(Param(param.key, choices=kept))
        else:
            if param.high is not None and param.high < min_num_seqs:
                raise ConfigError(
                    f"{MAX_NUM_SEQS} is tuned up to {param.high:g}, below {min_num_seqs}, "
                    "the most users the search may try (seed 004 §10). Raise high or "
                    "search fewer users."
                )
            low = max(param.low or 1, min_num_seqs)
            fitted.append(
                Param(param.key, low=low, high=param.high, step=param.step, log=param.log)
            )
    return fitted


def suggest(trial: Any, space: Sequence[Param]) -> dict[str, Any]:
    """The trial's values, one per tuned key (an Optuna trial, FixedTrial included)."""
    values: dict[str, Any] = {}
    for param in space:
        if param.choices:
            values[param.key] = trial.suggest_categorical(param.key, list(param.choices))
        elif param.is_int:
            values[param.key] = trial.suggest_int(
                param.key, int(param.low), int(param.high), step=int(param.step or 1), log=param.log
            )
        else:
            value = trial.suggest_float(
                param.key, float(param.low), float(param.high), step=param.step, log=param.log
            )
            # 0.92 + 3 * 0.01 is 0.9500000000000001; the same setup must get the same
            # config_id as a grid run that wrote 0.95.
            values[param.key] = round(value, _decimals(param.step)) if param.step else value
    return values


def to_overrides(values: Mapping[str, Any]) -> list[str]:
    """Hydra command-line overrides for the suggested values."""
    return [f"{key}={_override_text(value)}" for key, value in values.items()]


def check_overrides(space: Sequence[Param], overrides: Sequence[str]) -> None:
    """Refuse an override of a key the tuner sets: one of the two would silently lose."""
    tuned = {param.key for param in space}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in tuned:
            raise ConfigError(
                f"The override {override!r} sets {key}, which the tuner chooses in every "
                "trial. Remove it from the overrides, or drop the key from the space "
                "(--space FILE) to hold it fixed."
            )


def min_num_seqs(search: Mapping[str, Any], max_users_follows_engine: bool) -> int:
    """The most users the composed search may try, as far as it is known up front.

    A bracket search whose ceiling is ``${engine.max_num_seqs}`` follows each trial's
    value, so only its start counts; a fixed search tries its largest user count.
    """
    if search["kind"] == "fixed":
        return max(search["users"])
    if max_users_follows_engine:
        return int(search["start_users"])
    return max(int(search["start_users"]), int(search["max_users"]))


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step)) + 1) if step < 1 else 0


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _override_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | list):
        # Quoted, so a value holding '=' or ',' is never read as a sweep or a key.
        return json.dumps(value)
    return str(value)


# --- I/O: Hydra composition, the Optuna study and the runs ----------------------------


class Tuner:
    """Composes, runs and scores one trial at a time; see the module docstring."""

    def __init__(
        self, study: str, space: Sequence[Param], overrides: Sequence[str], results_dir: Path
    ):
        self.study = study
        self.space = list(space)
        self.overrides = list(overrides)
        self.results_dir = results_dir

    def compose(self, extra: Sequence[str]) -> Any:
        """The composed config (a DictConfig, or a RunConfig via :meth:`run_config`)."""

        overrides = [*self.overrides, *extra, f"results.dir={self.results_dir}"]
        try:
            return compose("runner", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as exc:
            raise ConfigError(
                f"The overrides {overrides} do not compose: {exc}. Check the group and "
                "key names (python -m runner --help lists the groups)."
            ) from exc

    def fit_space_to_users(self) -> None:
        """Keep engine.max_num_seqs at or above the users the composed search tries."""
        base = self.compose([])
        ceiling = OmegaConf.to_container(base.search).get("max_users")
        follows = ceiling == "${engine.max_num_seqs}"
        search = OmegaConf.to_container(base.search, resolve=True)
        self.space = fit_to_users(self.space, min_num_seqs(search, follows))

    def run_config(self, values: Mapping[str, Any]) -> Any:
        """The trial's RunConfig, its run id and results folder named by its config_id."""

        config = build_config(to_plain(self.compose(to_overrides(values))))
        # The id the run itself reports: a branch revision is pinned to its commit first.
        config, _ = pin_model(config, [])
        config_id = identity.config_id(config)
        return config.model_copy(
            update={
                "run_id": f"{self.study}-{config_id}",
                "results": Results(dir=str(self.results_dir / config_id)),
            }
        )

    def objective(self, trial: Any) -> float:
        values = suggest(trial, self.space)
        console = Console(highlight=False, soft_wrap=True)
        try:
            config = self.run_config(values)
            trial.set_user_attr("run_id", config.run_id)
            trial.set_user_attr("results_dir", config.results.dir)
            console.print(f"[bold]trial {trial.number}[/]: {' '.join(to_overrides(values))}")
            summary = replayed_summary(config) or execute(config, console)
        except RunnerError as exc:
            trial.set_user_attr("error", str(exc))
            raise optuna.TrialPruned(f"runner could not run this setup: {exc}") from exc
        except KeyboardInterrupt:
            trial.set_user_attr(INTERRUPTED, True)
            raise
        for key in ("config_id", "best_users", "decision"):
            trial.set_user_attr(key, getattr(summary, key))
        return float(summary.objective or 0.0)


def replayed_summary(config: RunConfig) -> RunSummary | None:
    """The decision of a search this setup already finished, without an engine."""

    params = SearchParams.from_config(config.search, config.slo)
    history = [
        observation(result.row, result.detail)
        for result in prior_windows(Path(config.results.dir), config.run_id)
    ]
    if not history or next_step(history, params) is not None:
        return None
    decision = decide(history, params)
    log.info("setup %s was already searched; replaying its decision", identity.config_id(config))
    return RunSummary(
        kind="search",
        run_id=config.run_id or "",
        config_id=identity.config_id(config),
        family=identity.family(config),
        results_dir=config.results.dir,
        best_users=decision.best_users,
        median_aggregate_tok_s=decision.median_aggregate_tok_s,
        min_user_tok_s=decision.min_user_tok_s,
        mean_user_tok_s=decision.mean_user_tok_s,
        decision=decision.reason,
        windows=len(history),
        floor_tok_s=config.slo.min_user_tok_s,
    )


def open_study(name: str, storage: str, seed: int | None) -> Any:
    if storage.startswith("sqlite:///"):
        Path(storage.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    try:
        return optuna.create_study(
            study_name=name,
            storage=storage,
            direction="maximize",
            sampler=optuna.samplers.TPESampler(seed=seed),
            load_if_exists=True,
        )
    except (optuna.exceptions.OptunaError, SQLAlchemyError, ValueError, OSError) as exc:
        raise ConfigError(
            f"The Optuna study {name!r} cannot be opened in {storage} ({exc}). Check the "
            "--storage URL (e.g. sqlite:///mlruns/optuna.db) and that its folder is writable."
        ) from exc


def requeue_interrupted(study: Any) -> int:
    """Queue again every trial a killed or interrupted tuner left unfinished.

    A trial still RUNNING when the tuner starts was killed (one tuner per study): it is
    closed as failed. It, and every trial stopped by Ctrl-C or SIGTERM, is queued once
    with the same values, so its search resumes from the windows already on disk.
    """

    trials = study.get_trials(deepcopy=False)
    retried = {trial.user_attrs.get(RETRY_OF) for trial in trials}
    queued = 0
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            study.tell(trial.number, state=TrialState.FAIL)
        elif not (trial.state == TrialState.FAIL and trial.user_attrs.get(INTERRUPTED)):
            continue
        if trial.number not in retried:
            study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number})
            queued += 1
    return queued


def trials_done(study: Any) -> int:
    """Trials that count toward --trials: scored, or pruned because runner could not
    run the setup (an answer too); interrupted ones are run again instead."""

    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    return sum(1 for trial in study.get_trials(deepcopy=False) if trial.state in finished)









