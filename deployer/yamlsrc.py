"""Safe YAML loading that remembers where every value came from (file:line:column).

We compose the node graph ourselves instead of calling yaml.safe_load so that:
- every value's position is known, for errors that point at the exact field;
- any tag that would construct an object (`!!python/...`, custom tags) is refused;
- duplicate mapping keys are errors instead of silently keeping the last one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deployer.errors import ConfigError

Loc = tuple[str | int, ...]

_PLAIN_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}


@dataclass(frozen=True)
class Mark:
    path: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


@dataclass
class Document:
    """A parsed YAML file: plain Python data plus the position of every value by its path."""

    path: Path
    data: Any
    marks: dict[Loc, Mark]

    def mark(self, loc: Loc) -> Mark:
        """The position of loc, or of its nearest ancestor that exists in the file."""
        for cut in range(len(loc), -1, -1):
            found = self.marks.get(tuple(loc[:cut]))
            if found is not None:
                return found
        return Mark(str(self.path), 1, 1)


def load(path: Path) -> Document:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        where = exc.problem_mark
        pos = f"{path}:{where.line + 1}:{where.column + 1}" if where else str(path)
        raise ConfigError(f"{pos}: invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    marks: dict[Loc, Mark] = {}
    if node is None:
        return Document(path, None, marks)
    return Document(path, _build(node, (), str(path), marks), marks)


def _mark(node: yaml.Node, path: str) -> Mark:
    return Mark(path, node.start_mark.line + 1, node.start_mark.column + 1)


def _build(node: yaml.Node, loc: Loc, path: str, marks: dict[Loc, Mark]) -> Any:
    marks[loc] = _mark(node, path)
    if node.tag not in _PLAIN_TAGS:
        raise ConfigError(f"{_mark(node, path)}: YAML tag {node.tag!r} is not allowed "
                          "(deployer files are plain data)")
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _build(key_node, loc, path, {})
            if not isinstance(key, str):
                raise ConfigError(f"{_mark(key_node, path)}: keys must be strings, got {key!r}")
            if key in result:
                raise ConfigError(f"{_mark(key_node, path)}: duplicate key {key!r}")
            result[key] = _build(value_node, (*loc, key), path, marks)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*loc, i), path, marks) for i, item in enumerate(node.value)]
    return yaml.SafeLoader(  # a scalar: let the safe constructor resolve int/bool/null/...
        "").construct_object(node, deep=True)
