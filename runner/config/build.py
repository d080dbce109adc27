"""From Hydra's plain data to a :class:`RunConfig`, or one paragraph that names the key
a user got wrong (and the key they probably meant)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from runner.config.run import RunConfig
from runner.errors import ConfigError


def build_config(data: dict[str, Any]) -> RunConfig:
    """Turn the composed (plain) config into a :class:`RunConfig` or raise ConfigError."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(_where(error))}: {error['msg']}"
            + (did_you_mean(error["loc"]) if error["type"] == "extra_forbidden" else "")
            for error in exc.errors()
        )
        raise ConfigError(
            f"The configuration does not match runner's schema ({problems}). "
            "Check the spelling of the key in your YAML or override; unknown keys are "
            "refused so that a typo never silently falls back to a default."
        ) from exc


def _where(error: Any) -> list[str]:
    """The key a validation error is about, as a user writes it; a union's unknown or
    missing ``kind`` is about its ``kind`` key."""
    path = user_path(error["loc"])
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        path.append("kind")
    return path


def known_keys(path: Sequence[str | int]) -> list[str]:
    """The keys runner's schema allows under ``path`` (e.g. ``("engine",)``); [] if none.

    Under a union told apart by ``kind`` (``search``, ``workload``) the keys of every kind
    count, unless the path names the kind, as pydantic's error locations do.
    """
    models: list[Any] = [RunConfig]
    for part in user_path(path):
        if part.isdigit():
            continue  # an item of a list of models, e.g. workload.buckets.0
        models = [
            found
            for model in models
            if (field := model.model_fields.get(part)) is not None
            for found in _models_in(field.annotation)
        ]
        if not models:
            return []
    return list(dict.fromkeys(key for model in models for key in model.model_fields))


def user_path(loc: Sequence[str | int]) -> list[str]:
    """A validation error's location as a user writes the key: list indices and the
    ``kind`` tags pydantic inserts for a union (``search.bracket.window_s``) dropped."""
    models: list[Any] = [RunConfig]
    path: list[str] = []
    for part in loc:
        if isinstance(part, int):
            path.append(str(part))  # an item of a list, e.g. search.users.0
            continue
        fields = [model.model_fields.get(part) for model in models]
        found = [field for field in fields if field is not None]
        if not found:
            tagged = [model for model in models if part in _kinds(model)]
            if tagged:
                models = tagged
                continue
            path.append(str(part))
            models = []
            continue
        path.append(str(part))
        models = [model for field in found for model in _models_in(field.annotation)]
    return path


def _kinds(model: Any) -> tuple[Any, ...]:
    field = model.model_fields.get("kind") if _is_model(model) else None
    return get_args(field.annotation) if field is not None else ()


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _models_in(annotation: Any) -> list[Any]:
    """The model classes inside ``X``, ``X | None``, ``list[X]`` or a union of models."""
    if _is_model(annotation):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)]


def did_you_mean(loc: Sequence[str | int]) -> str:
    """ " (did you mean engine.max_num_seqs?)" for an unknown key ``loc``; "" if nothing is close."""
    path = user_path(loc)
    if not path:
        return ""
    keys = known_keys(path[:-1])
    if path[-1] in keys:
        # A key of another kind of the same union: the kind given does not take it.
        tags = [str(part) for part in loc if isinstance(part, str) and part not in path]
        kind = f" {path[-2]}.kind={tags[-1]}" if tags and len(path) > 1 else " this kind"
        return f" ({'.'.join(path)} belongs to another kind; with{kind} it does not apply)"
    close = difflib.get_close_matches(path[-1], keys, n=1)
    return f" (did you mean {'.'.join([*path[:-1], close[0]])}?)" if close else ""
