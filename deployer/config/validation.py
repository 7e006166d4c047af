"""Validating YAML data with a model, and pydantic's errors said as file:line:col, the field and what is wrong."""

from __future__ import annotations

import difflib
import os
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, Tag, ValidationError
from pydantic.plugin import _loader

from deployer.config import yamlsrc
from deployer.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

# pydantic looks for plugins the first time it builds a validator: it reads the entry points of every installed
# distribution (~10 ms of an apply's start-up). deployer's models take none; PYDANTIC_DISABLE_PLUGINS, when set,
# still decides as pydantic documents it. Here, not in the package's __init__: every model module of config/
# imports this one before a validator is built (their models defer theirs), and config/paths.py must stay cheap.
if _loader._plugins is None and "PYDANTIC_DISABLE_PLUGINS" not in os.environ:
    _loader._plugins = {}

# The error a tagged union (a host's kind, by `transport:`) reports for a tag it lacks; its context names the key.
UNKNOWN_KIND = "unknown_kind"


def validate(model: type[M], data: Any, doc: yamlsrc.Document, base: yamlsrc.Loc = ()) -> M:
    """Validate data with the model; errors name file:line:column and the field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, doc, base, model)) from None


def format_errors(exc: ValidationError, doc: yamlsrc.Document, base: yamlsrc.Loc = (),
                  model: type[BaseModel] | None = None) -> str:
    lines: list[tuple[yamlsrc.Mark, str]] = []
    for error in exc.errors():
        kept: list[str | int] = list(base)
        raw = error["loc"]
        if error["type"] == UNKNOWN_KIND:  # reported at the mapping; the key that chose the kind is at fault
            raw = (*raw, error["ctx"]["key"])
        for i, part in enumerate(raw):
            # Union branches add type names (and tags) to the location; keep only real keys.
            candidate = (*kept, part)
            if candidate in doc.marks or (i == len(raw) - 1 and error["type"] == "missing"):
                kept.append(part)
        field = ".".join(str(p) for p in kept) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = unknown_key(str(raw[-1]), model, raw) if model else "unknown key"
        elif error["type"] == "value_error":
            message = str(error.get("ctx", {}).get("error", message))
        elif error["type"] == "missing":
            message = "required field is missing"
        lines.append((doc.mark(tuple(kept)), f"{field}: {message}"))
    return yamlsrc.in_line_order(lines)


def unknown_key(key: str, model: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    """An unknown key, and the close one meant; or, under a tagged union, the kinds that take it."""
    kinds = _choices(model, loc)
    tag = next((part for part in reversed(loc[:-1]) if part in kinds), None)
    takes = [other for other, chosen in kinds.items() if other != tag and key in chosen.model_fields]
    if tag is not None and takes:
        return (f"unknown key for transport: {tag} ({key!r} is a key of transport: "
                f"{' and '.join(map(str, takes))} only)")
    return "unknown key" + did_you_mean(key, known_keys(model, loc))


def did_you_mean(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def known_keys(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys the model takes where loc's last key stands (the models on the way found by field)."""
    found = _walk(model, loc)
    return [] if found is None else list(found[0].model_fields)


def _choices(model: type[BaseModel], loc: tuple[str | int, ...]) -> dict[str | int, type[BaseModel]]:
    found = _walk(model, loc)
    return {} if found is None else found[1]


def _walk(model: type[BaseModel], loc: tuple[str | int, ...]
          ) -> tuple[type[BaseModel], dict[str | int, type[BaseModel]]] | None:
    """The model where loc's last key stands, and the tagged models it was chosen among (by the tag in loc)."""
    current: type[BaseModel] = model
    choices: dict[str | int, type[BaseModel]] = {}
    for part in loc[:-1]:
        if part in choices:  # a tag pydantic put in loc: the union's member it validated with
            current = choices[part]
            continue
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:  # a list index or a mapping's own key (a host name): same model below
            continue
        nested = _models_in(field.annotation)
        if not nested:
            return None
        current = nested[0][1]
        choices = {tag: found for tag, found in nested if tag is not None}
    return current, choices


def _models_in(annotation: Any, tag: str | None = None) -> list[tuple[str | None, type[BaseModel]]]:
    """The models inside an annotation such as `Host`, `list[FileSpec]`, `dict[str, Host] | None`, each with
    its union tag where it has one (the host kinds are a union tagged by `transport:`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(tag, annotation)]
    args = typing.get_args(annotation)
    tag = next((arg.tag for arg in args if isinstance(arg, Tag)), tag)
    return [found for arg in args for found in _models_in(arg, tag)]
