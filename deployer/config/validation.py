"""Validating YAML data with a model, and pydantic's errors said as file:line:col, the field and what is wrong."""

from __future__ import annotations

import difflib
import os
import typing
from typing import Any, TypeVar

from pydantic import BaseModel, Tag, ValidationError
from pydantic.plugin import _loader
from pydantic_core import ErrorDetails

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


Problem = tuple[yamlsrc.Mark, str]


def validate(model: type[M], data: Any, doc: yamlsrc.Document, base: yamlsrc.Loc = ()) -> M:
    """Validate data with the model; errors name file:line:column and the field."""
    problems: list[Problem] = []
    found = collect(model, data, doc, problems, base)
    if found is None:
        raise ConfigError(yamlsrc.in_line_order(problems))
    return found


def collect(model: type[M], data: Any, doc: yamlsrc.Document, problems: list[Problem],
            base: yamlsrc.Loc = ()) -> M | None:
    """The model; or None, with what is wrong added to problems, so that the caller goes on to find the other
    problems of the file and the user fixes them all in one go."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems.extend(problems_of(exc, doc, base, model))
        return None


def problems_of(exc: ValidationError, doc: yamlsrc.Document, base: yamlsrc.Loc = (),
                model: type[BaseModel] | None = None) -> list[Problem]:
    """Each error at its place: an unknown key at the key, a missing one at the key of the mapping that lacks it,
    a bad value at the value; a value that matched no member of a union is one problem, its members' ways joined."""
    found: dict[tuple[yamlsrc.Loc, int], tuple[yamlsrc.Mark, dict[str, str], str]] = {}
    for index, error in enumerate(exc.errors()):
        kept: list[str | int] = list(base)
        raw = error["loc"]
        if error["type"] == UNKNOWN_KIND:  # reported at the mapping; the key that chose the kind is at fault
            raw = (*raw, error["ctx"]["key"])
        for i, part in enumerate(raw):
            # Union branches add type names (and tags) to the location; keep only real keys.
            candidate = (*kept, part)
            if candidate in doc.marks or (i == len(raw) - 1 and error["type"] == "missing"):
                kept.append(part)
        loc = tuple(kept)
        got = ""
        if error["type"] == "extra_forbidden":
            message = unknown_key(str(raw[-1]), model, raw) if model else "unknown key"
            if message == "unknown key":  # no key close to it here: perhaps its block lost its indentation
                message += indent_hint(doc, loc)
            mark = doc.key_mark(loc)
        elif error["type"] == "missing":
            message, mark = "required key is missing", doc.key_mark(loc[:-1])
        else:
            message, mark, got = plain(error), doc.mark(loc), "" if _in_env(loc) else _got(error)
        # A union tries each of its members, and each adds its name to the location: one problem, its ways joined.
        alternative = bool(raw) and tuple(raw[-1:]) != loc[-1:]
        mark, said, got = found.setdefault((loc, -1 if alternative else index), (mark, {}, got))
        said.setdefault(message, error["type"])
    # A member the value got into (a mapping given for `str | SecretValue`) reports deeper, and knows better than
    # the members whose type the value is not.
    deeper = {loc[:cut] for loc, _ in found for cut in range(len(loc))}
    return [(mark, f"{'.'.join(str(p) for p in loc) or '(top level)'}: {_either(said)}{got}")
            for (loc, _), (mark, said, got) in found.items()
            if not (loc in deeper and all(_not_its_type(kind) for kind in said.values()))]


def _either(said: dict[str, str]) -> str:
    """What a union's members said, as one sentence; a member the value got into knows better than one whose
    type it is not (a mapping given for `str | SecretValue` is a SecretValue with a problem, not a bad string)."""
    closer = [way for way, kind in said.items() if not _not_its_type(kind)]
    ways = closer or list(said)
    if len(ways) > 1 and all(way.startswith("must be ") for way in ways):
        return "must be " + " or ".join(way.removeprefix("must be ") for way in ways)
    return ", or ".join(ways)


def _not_its_type(kind: str) -> bool:
    return kind.endswith(("_type", "_parsing"))


def indent_hint(doc: yamlsrc.Document, loc: yamlsrc.Loc) -> str:
    """Why a key may be where it is not known: its block was dedented out of the empty key just above it."""
    above = doc.empty_key_above(loc)
    if above is None:
        return ""
    return (f" ({above!r} just above it has no value: to put {str(loc[-1])!r} under {above!r}, indent it deeper "
            f"than {above!r})")


def plain(error: ErrorDetails) -> str:
    """What is wrong with a value, in the words of a YAML file's author (pydantic's name Python's types)."""
    kind, ctx = error["type"], {k: _number(v) for k, v in (error.get("ctx") or {}).items()}
    if kind in _OURS:
        return str(ctx.get("error", error["msg"]))
    if kind in ("too_short", "too_long", "string_too_short", "string_too_long"):
        least = kind.endswith("short")
        count = ctx["min_length" if least else "max_length"]
        unit = "character" if kind.startswith("string") else "item"
        if least and count == 1:
            return "must not be empty"
        has = f", not {ctx['actual_length']}" if ctx.get("actual_length") is not None else ""
        return f"must have {'at least' if least else 'at most'} {count} {unit}{'s' if count != 1 else ''}{has}"
    if kind in _PLAIN:
        return _PLAIN[kind].format(**ctx)
    # An error type none of our models raises today: pydantic's sentence, in the same voice as the others.
    return error["msg"].replace("Input should be", "must be").replace("Input should", "must")


def _got(error: ErrorDetails) -> str:
    """The value that was refused, where it is short enough to show; an empty one is most often a dedented block.
    Our own validators' words say what is wrong with the value already."""
    if error["type"] in _OURS:
        return ""
    value = error["input"]
    if value is None and error["type"] in _BLOCKS:
        return ", got nothing (the lines meant to be under this key must be indented deeper than it)"
    if value is None:
        return ", got nothing"
    if isinstance(value, (str, int, float)):
        shown = repr(value)
        return f", got {shown if len(shown) <= 40 else shown[:37] + '...'}"
    return ""


def _in_env(loc: yamlsrc.Loc) -> bool:
    """Whether loc is inside a host's or a service's `env:`, whose values may be secrets: named, never shown."""
    return any(part == "env" and loc[i - 1] not in ("hosts", "services") for i, part in enumerate(loc) if i)


def _number(value: Any) -> Any:
    """A float field's bound as its author wrote it (`gt=0`, which pydantic hands back as 0.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


_OURS = ("value_error", "assertion_error")  # raised by our models' validators, in our words

# What a key whose value is a block (a mapping or a list) reports when the block lost its indentation.
_BLOCKS = frozenset({"dict_type", "model_type", "model_attributes_type", "list_type", "tuple_type", "set_type"})

# The pydantic error types our models raise, said plainly.
_PLAIN = {
    "string_type": "must be a string",
    "int_type": "must be a whole number", "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "list_type": "must be a list", "tuple_type": "must be a list", "set_type": "must be a list",
    "dict_type": "must be a mapping (key: value)", "model_type": "must be a mapping (key: value)",
    "model_attributes_type": "must be a mapping (key: value)",
    "literal_error": "must be {expected}", "enum": "must be {expected}",
    "greater_than": "must be greater than {gt}", "greater_than_equal": "must be {ge} or more",
    "less_than": "must be less than {lt}", "less_than_equal": "must be {le} or less",
    "string_pattern_mismatch": "must match the pattern {pattern}",
}


def unknown_key(key: str, model: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    """An unknown key, and the close one meant; or, under a tagged union, the kinds that take it."""
    kinds = _choices(model, loc)
    tag = next((part for part in reversed(loc[:-1]) if part in kinds), None)
    takes = [other for other, chosen in kinds.items() if other != tag and key in chosen.model_fields]
    if tag is not None and takes:
        return (f"unknown key for transport: {tag} ({key!r} is a key of transport: "
                f"{' and '.join(map(str, takes))} only)")
    return "unknown key" + (did_you_mean(key, known_keys(model, loc)) or belongs_under(key, model, loc))


def belongs_under(key: str, model: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    """Where an unknown key is known one level down (`on_inconclusive:` written beside `rollout:`, not under it)."""
    found = _walk(model, loc)
    fields = {} if found is None else found[0].model_fields
    owner = next((name for name, field in fields.items()
                  if any(key in nested.model_fields for _, nested in _models_in(field.annotation))), None)
    return f" ({key!r} belongs under {owner!r}: indent it there)" if owner else ""


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
