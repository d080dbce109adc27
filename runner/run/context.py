"""What a run knows about itself before any engine starts: its config, identity and folder.

:func:`prepare` validates the config, pins the model revision, names the run and finds
its results folder; the rest of this module turns that into the engine's launch plan
and checks its flags. Nothing here starts an engine.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runner.config import RunConfig
from runner.engines.base import LaunchPlan
from runner.errors import ConfigError, ResultsError
from runner.output.tracking import config_tags
from runner.prepare import flags, identity, launch, validate
from runner.prepare.generated import definition_hash, ensure_generated_model, load_architecture
from runner.prepare.host import machine_memory
from runner.prepare.modelref import ResolvedModel, resolve_revision
from runner.prepare.torchstack import check_companions
from runner.run.resume import resume_folder
from runner.secret import redact_data

log = logging.getLogger("runner")

CONTAINER_HF_HOME = "/root/.cache/huggingface"
CONTAINER_TINY_MODEL = "/models/tiny"


@dataclass
class RunContext:
    """What one run knows about itself; written to manifest.json."""

    config: RunConfig
    config_id: str
    family: str
    run_id: str
    results_dir: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def cache_dir(self) -> Path:
        return Path(self.config.cache_dir).expanduser()

    def write_manifest(self) -> Path:
        """Write manifest.json, and config.yaml: the validated config as runner read it.

        Hydra's own copy (.hydra/) is switched off in conf/runner.yaml because Hydra
        writes it before runner has validated anything, so a refused secret would be
        on disk already; both files here are written after validation, redacted.
        """
        path = self.results_dir / "manifest.json"
        write_atomically(path, json.dumps(redact_data(self.manifest), indent=2, sort_keys=True, default=str))
        resolved = redact_data(self.config.model_dump(mode="json"))
        write_atomically(self.results_dir / "config.yaml", yaml.safe_dump(resolved, sort_keys=False))
        return path

    def tracking_tags(self) -> dict[str, str]:
        """The tags that identify this run's setup in MLflow."""
        config = self.config
        return {
            **config_tags(config),
            "config_id": self.config_id,
            "run_id": self.run_id,
            "model_repo": f"{config.model.repo}@{config.model.revision or 'unresolved'}",
            "kv_cache_dtype": config.kv.cache_dtype,
            "family": self.family,
            "backend": config.backend.kind,
        }


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole through a temporary file that never stays behind; a failure
    is one paragraph (rows already written are intact)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise ResultsError(
            f"{path.name} could not be written to {path.parent} ({exc}). Free disk space or "
            "fix the folder's permissions (results.dir), then resume the run with its "
            "run_id; rows already written are intact."
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)


def prepare(config: RunConfig, job: int | None = None) -> tuple[RunContext, list[str]]:
    """Validate, pin the model revision and name the run (``job``: a multirun's job
    number, part of a generated run_id); raises ConfigError early."""
    config = load_architecture(config)  # model.hf_config is validated by its content
    warnings = validate.validate(config, machine_memory())
    config, resolved = pin_model(config, warnings)
    config_id = identity.config_id(config)
    run_id = config.run_id or identity.new_run_id(config, job=job)
    results_dir = Path(config.results.dir).expanduser().resolve()
    if config.run_id is not None:
        results_dir = resume_folder(results_dir, run_id)
    context = RunContext(
        config=config,
        config_id=config_id,
        family=identity.family(config),
        run_id=run_id,
        results_dir=results_dir,
    )
    context.manifest.update(
        run_id=run_id,
        config_id=config_id,
        family=context.family,
        pinned=config.image.pinned and resolved.pinned,
        image=config.image.model_dump(),
        model=config.model.model_dump(),
        model_revision={"requested": resolved.requested, "commit": resolved.commit, "source": resolved.source},
        kv=config.kv.model_dump(),
        engine=config.engine.model_dump(),
        hardware=config.hw.model_dump() if config.hw else "cpu (no GPU profile)",
        measurement=measurement_settings(config),
        warnings=warnings,
    )
    return context, warnings


def measurement_settings(config: RunConfig) -> dict[str, Any]:
    """What a run's windows measure besides the engine: a resumed run must match it."""
    return {
        "workload": config.workload.model_dump(mode="json"),
        "search": config.search.model_dump(mode="json"),
        "slo": config.slo.model_dump(mode="json"),
    }


def pin_model(config: RunConfig, warnings: list[str]) -> tuple[RunConfig, ResolvedModel]:
    """Resolve the model revision to a commit before anything is downloaded (seed 004 §4).

    The resolved commit replaces the requested branch in the config, so config_id
    names the exact checkpoint. A measured run with an unresolved revision is refused
    unless ``model.allow_unresolved_revision`` is set; such results are tagged unpinned.
    """
    if config.model.generated:
        config = load_architecture(config)  # config_id names the file's content, not its path
        definition = definition_hash(config.model.architecture)
        return config, ResolvedModel(config.model.repo, None, None, f"generated locally (definition {definition})")
    model = config.model
    hf_cache = Path(config.backend.hf_cache).expanduser() if config.backend.hf_cache else None
    resolved = resolve_revision(model, hf_cache, ask_hub=not config.dry_run)
    if resolved.commit is None:
        message = (
            f"The revision {model.revision or 'main'!r} of {model.repo} could not be resolved to a "
            f"commit ({resolved.source})."
        )
        if not (model.allow_unresolved_revision or config.dry_run):
            raise ConfigError(
                message + " A measured run must name the exact checkpoint (seed 004 §4): set "
                "model.revision to the commit (the snapshot folder name in your Hugging Face "
                "cache), make the Hub reachable, or set model.allow_unresolved_revision=true to "
                "run anyway with results tagged unpinned."
            )
        warnings.append(message + " Results are tagged unpinned.")
        return config, resolved
    pinned_model = model.model_copy(update={"revision": resolved.commit})
    return config.model_copy(update={"model": pinned_model}), resolved


def model_location(context: RunContext) -> tuple[Path | None, str]:
    """The model folder on this host (if local) and the path the engine is given."""
    config = context.config
    if config.model.generated:
        folder = ensure_generated_model(context.cache_dir, config.model)
        if config.backend.kind == "docker":
            return folder, CONTAINER_TINY_MODEL
        return folder, str(folder)
    if config.backend.kind == "docker":
        host_folder = None
        if config.backend.hf_cache and config.model.revision:
            host_folder = Path(config.backend.hf_cache).expanduser() / launch.container_model_path(
                config.model, hf_home=""
            ).lstrip("/")
        return host_folder, launch.container_model_path(config.model, hf_home=CONTAINER_HF_HOME)
    return None, config.model.repo


def build_plan(context: RunContext, engine_model_path: str, host_model_dir: Path | None) -> LaunchPlan:
    config = context.config
    host = "0.0.0.0" if config.backend.kind == "docker" else "127.0.0.1"
    plan = launch.build_launch_plan(config, model_path=engine_model_path, host=host)
    if config.model.generated and config.backend.kind == "docker" and host_model_dir is not None:
        plan = LaunchPlan(
            image=plan.image,
            argv=plan.argv,
            env=plan.env,
            secret_env=plan.secret_env,
            mounts=[*plan.mounts, (str(host_model_dir), CONTAINER_TINY_MODEL, "ro")],
            port=plan.port,
            gpus=plan.gpus,
            model_path=plan.model_path,
        )
    return plan


def check_engine_flags(context: RunContext, plan: LaunchPlan) -> str:
    """Check every engine flag against the engine's own --help=all; say what was checked."""
    config = context.config
    flags_cache = context.cache_dir
    if config.backend.kind == "external":
        return "unchecked (backend=external: runner does not launch the engine)"
    if config.backend.kind == "process":
        # Before --help=all, which a torchvision built for another torch already breaks.
        check_companions(config.backend.python or sys.executable, flags_cache)
        supported = flags.local_supported_flags(config.backend.python or sys.executable, flags_cache)
        flags.check_flags(plan.argv, supported, "the local vLLM")
        return "checked against the local vLLM's --help=all"
    image = plan.image or config.image.reference
    if not flags.image_present(image):
        return f"unchecked: the image {image} is not present on this host"
    supported = flags.supported_flags(image, cache_dir=flags_cache)
    flags.check_flags(plan.argv, supported, image)
    return f"checked against {image} --help=all"


def engine_api_key(config: RunConfig) -> str | None:
    """The engine's API key, read from the variable the config names (never stored)."""
    return os.environ.get(config.engine.api_key_env) if config.engine.api_key_env else None
