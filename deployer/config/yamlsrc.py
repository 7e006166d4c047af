"""Safe YAML loading that remembers where every value came from (file:line:column).

We compose the node graph ourselves instead of calling yaml.safe_load so that:
- every value's position is known, for errors that point at the exact field;
- any tag that would construct an object (`!!python/...`, custom tags) is refused;
- duplicate mapping keys are errors instead of silently keeping the last one;
- a file cannot make us spend more than it is worth: files over MAX_BYTES, nesting deeper
  than MAX_DEPTH and aliases that expand to more than MAX_ALIAS_VALUES values (billion laughs)
  are refused while composing, before anything is expanded or recursed into.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deployer.errors import ConfigError

Loc = tuple[str | int, ...]

MAX_BYTES = 1024 * 1024  # a playbook or inventory is a page of text; 1 MiB is far beyond any real one
MAX_DEPTH = 64
MAX_ALIAS_VALUES = 10_000  # values that aliases may add in all; shared step params take a few dozen

# PyYAML's words for a line indented as deep as no block above it (or deeper than a plain value allows).
_INDENT_PROBLEMS = ("expected <block end>", "mapping values are not allowed here")
_INDENT_HINT = " (check this line's indentation: a key lines up with the other keys of its mapping)"

_PLAIN_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}


@dataclass(frozen=True)
class Mark:
    """Where a value sits in its YAML file: file:line:column for error messages."""
    path: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


def in_line_order(problems: list[tuple[Mark, str]]) -> str:
    """Problems found in any order, one per line as they appear in the file (`file:line:col: ...`)."""
    return "\n".join(f"{mark}: {text}" for mark, text in sorted(problems, key=lambda p: (p[0].line, p[0].column)))


@dataclass
class Document:
    """A parsed YAML file: plain Python data plus the position of every value by its path."""

    path: Path
    data: Any
    marks: dict[Loc, Mark]  # where each value starts
    key_marks: dict[Loc, Mark] = field(default_factory=dict)  # where the key of each mapping value starts

    def mark(self, loc: Loc) -> Mark:
        """The position of loc, or of its nearest ancestor that exists in the file."""
        for cut in range(len(loc), -1, -1):
            found = self.marks.get(tuple(loc[:cut]))
            if found is not None:
                return found
        return Mark(str(self.path), 1, 1)

    def key_mark(self, loc: Loc) -> Mark:
        """The position of the key that holds loc (of the value where there is no key)."""
        return self.key_marks.get(loc) or self.mark(loc)

    def empty_key_above(self, loc: Loc) -> str | None:
        """The key just above loc's key in the file, at its column or deeper, when that key has no value (in any
        mapping): loc's key was most likely meant to be under it, and lost its indentation."""
        mine = self.key_marks.get(loc)
        if mine is None:
            return None
        before = [(mark.line, mark.column, where) for where, mark in self.marks.items()
                  if where and (mark.line, mark.column) < (mine.line, mine.column)]
        if not before:
            return None
        where = max(before, key=lambda found: found[:2])[2]
        key = self.key_marks.get(where)
        if not isinstance(where[-1], str) or key is None or key.column < mine.column:
            return None
        value = self.data
        for part in where:
            value = value[part]
        return where[-1] if value is None else None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses deep nesting and alias expansion beyond a budget.

    The composer shares an anchored node between its aliases, so composing stays cheap; it is the
    walk in _build that would expand them. Counting each alias's expanded size here stops a
    billion-laughs file after a few thousand values, and the depth limit stops before the
    recursive composer (and _build) hit Python's recursion limit.
    """

    def __init__(self, text: str, path: Path) -> None:
        super().__init__(text)
        self._path = path
        self._depth = 0
        self._open_anchors: set[str] = set()
        self._sizes: dict[int, int] = {}  # id(node) -> values in its expansion
        self._aliased = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise self._refuse(event, "a YAML alias refers to a node that contains it")
            node = super().compose_node(parent, index)
            assert node is not None  # an alias always names a composed node
            self._aliased += self._size(node)
            if self._aliased > MAX_ALIAS_VALUES:
                raise self._refuse(event, f"YAML aliases expand to more than {MAX_ALIAS_VALUES:,} values "
                                          "(a billion-laughs file?)")
            return node
        if not isinstance(event, yaml.CollectionStartEvent):
            return super().compose_node(parent, index)
        if self._depth == MAX_DEPTH:
            raise self._refuse(event, f"nested deeper than {MAX_DEPTH} levels")
        self._depth += 1
        if event.anchor is not None:
            self._open_anchors.add(event.anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if event.anchor is not None:
                self._open_anchors.discard(event.anchor)

    def _refuse(self, event: yaml.Event, problem: str) -> ConfigError:
        where = event.start_mark
        pos = f"{self._path}:{where.line + 1}:{where.column + 1}" if where else str(self._path)
        return ConfigError(f"{pos}: {problem}")

    def _size(self, node: yaml.Node) -> int:
        known = self._sizes.get(id(node))
        if known is None:
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [part for pair in node.value for part in pair]
            known = self._sizes[id(node)] = 1 + sum(self._size(child) for child in children)
        return known


def load(path: Path) -> Document:
    try:
        with path.open("rb") as stream:
            raw = stream.read(MAX_BYTES + 1)  # bounded: the path may even be a pipe or /dev/zero
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path}:1:1: the file is larger than 1 MiB ({MAX_BYTES:,} bytes), the limit for "
                          "a playbook or an inventory")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    loader = _BoundedLoader(text, path)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        where = exc.problem_mark
        pos = f"{path}:{where.line + 1}:{where.column + 1}" if where else str(path)
        hint = _INDENT_HINT if exc.problem and exc.problem.startswith(_INDENT_PROBLEMS) else ""
        raise ConfigError(f"{pos}: invalid YAML: {exc.problem}{hint}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    doc = Document(path, None, {})
    if node is not None:
        doc.data = _build(node, (), str(path), doc)
    return doc


def _mark(node: yaml.Node, path: str) -> Mark:
    return Mark(path, node.start_mark.line + 1, node.start_mark.column + 1)


def _build(node: yaml.Node, loc: Loc, path: str, doc: Document | None) -> Any:
    """Plain data for node; with doc, record where each value (and each mapping key) starts."""
    if doc is not None:
        doc.marks[loc] = _mark(node, path)
    if node.tag not in _PLAIN_TAGS:
        raise ConfigError(f"{_mark(node, path)}: YAML tag {node.tag!r} is not allowed "
                          "(deployer files are plain data)")
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _build(key_node, loc, path, None)
            if not isinstance(key, str):
                raise ConfigError(f"{_mark(key_node, path)}: keys must be strings, got {key!r}")
            if key in result:
                raise ConfigError(f"{_mark(key_node, path)}: duplicate key {key!r}")
            if doc is not None:
                doc.key_marks[(*loc, key)] = _mark(key_node, path)
            result[key] = _build(value_node, (*loc, key), path, doc)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*loc, i), path, doc) for i, item in enumerate(node.value)]
    return yaml.SafeLoader(  # a scalar: let the safe constructor resolve int/bool/null/...
        "").construct_object(node, deep=True)
