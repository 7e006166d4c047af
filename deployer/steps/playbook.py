"""Load a playbook file into typed steps and the bytes it ships, with errors that point into the file."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from deployer.agent.protocol import GET_MAX
from deployer.config import yamlsrc
from deployer.config.models import Playbook
from deployer.config.validation import Problem, collect, did_you_mean, indent_hint
from deployer.errors import ConfigError
from deployer.steps.base import Effect, Step
from deployer.steps.context import LoadedPlaybook
from deployer.steps.kinds import KINDS
from deployer.steps.optional import Ordered, needs


def parse_playbook(path: Path) -> tuple[Playbook, list[Step], yamlsrc.Document]:
    """The playbook's model and steps, without reading the files it ships."""
    doc = yamlsrc.load(path)
    if not isinstance(doc.data, dict):
        raise ConfigError(f"{path}:1:1: a playbook is a mapping (name, files or patch, steps)")
    problems: list[Problem] = []
    model = collect(Playbook, doc.data, doc, problems)
    if model is not None:  # checked against the batches once the hosts are known (Rollout.check_steps)
        model.rollout.locate([str(doc.mark(("rollout", "steps", i))) for i in range(len(model.rollout.steps))])
    items = doc.data.get("steps")
    steps = build_steps(items if isinstance(items, list) else [], doc, problems)
    if model is None or problems:
        raise ConfigError(yamlsrc.in_line_order(problems))
    check_order(steps)
    shipping = [s for s in steps if s.effect in (Effect.changes_files, Effect.commits)]
    if shipping and not model.files and model.patch is None:
        raise ConfigError(f"{shipping[0].where}: {shipping[0].name}: give exactly one of 'files' or 'patch' "
                          "(a playbook without either only restarts and checks services)")
    return model, steps, doc


def load_playbook(path: Path) -> tuple[LoadedPlaybook, list[Step]]:
    model, steps, doc = parse_playbook(path)
    base = path.parent
    sources: dict[str, bytes] = {}
    for i, spec in enumerate(model.files):
        sources[spec.dest] = _read(base / spec.src, doc.mark(("files", i, "src")), f"files.{i}.src")
    patch = _read(base / model.patch, doc.mark(("patch",)), "patch") if model.patch else None
    return LoadedPlaybook(path=path, raw=path.read_bytes(), model=model, sources=sources, patch=patch), steps


# git's own test for a binary file: a NUL byte in the first 8000 bytes.
BINARY_PROBE = 8000


def _read(path: Path, mark: yamlsrc.Mark, field: str) -> bytes:
    """The bytes of a src or patch, which must be text: the compile, the diffs and git apply read them so."""
    try:
        with path.open("rb") as stream:
            # Sized before it is read: a 50 MB file cost a minute and 365 MB before anything refused it.
            size = os.fstat(stream.fileno()).st_size
            data = b"" if size > GET_MAX else stream.read(GET_MAX + 1)  # bounded: a pipe has no size
    except OSError as exc:
        raise ConfigError(f"{mark}: {field}: cannot read {path}: {exc.strerror}") from None
    if (size := max(size, len(data))) > GET_MAX:
        # A later run reads the pre-run bytes of its dests with a get: a larger file could not be restored.
        raise ConfigError(f"{mark}: {field}: {path} is {size:,} bytes, over the {GET_MAX >> 20} MiB "
                          f"({GET_MAX:,} bytes) a shipped file may have")
    try:
        if b"\0" in data[:BINARY_PROBE]:
            raise ValueError("it holds a NUL byte")
        data.decode("utf-8")
    except (ValueError, UnicodeDecodeError) as exc:
        why = f"not UTF-8 at byte {exc.start}" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise ConfigError(f"{mark}: {field}: {path} is a binary file ({why}); deployer ships UTF-8 text "
                          "files") from None
    return data


def build_steps(items: list[Any], doc: yamlsrc.Document, problems: list[Problem]) -> list[Step]:
    """The steps of items that are valid; what is wrong with the others is added to problems."""
    steps: list[Step] = []
    seen: Counter[str] = Counter()
    for i, item in enumerate(items):
        loc: yamlsrc.Loc = ("steps", i)
        params: Any
        if isinstance(item, str):
            kind, params = item, {}
        elif isinstance(item, dict) and len(item) == 1:
            kind, params = next(iter(item.items()))
            params = {} if params is None else params
            loc = (*loc, kind)
        else:
            problems.extend(_not_a_step(item, loc, doc))
            continue
        cls = KINDS.get(kind)
        if cls is None:  # point at the kind itself, not at its (possibly flow-style) parameters
            guess = did_you_mean(str(kind), list(KINDS))
            problems.append((doc.key_mark(loc), f"steps.{i}: unknown step kind {kind!r}{guess} "
                                                f"(known: {', '.join(sorted(KINDS))})"))
            continue
        if not isinstance(params, dict):
            problems.append((doc.mark(loc), f"steps.{i}.{kind}: parameters must be a mapping"))
            continue
        seen[kind] += 1
        name = kind if seen[kind] == 1 else f"{kind}#{seen[kind]}"
        valid = collect(cls.Params, params, doc, problems, loc)
        if valid is not None:
            steps.append(cls(valid, name, str(doc.mark(("steps", i)))))
    return steps


def _not_a_step(item: Any, loc: yamlsrc.Loc, doc: yamlsrc.Document) -> list[Problem]:
    """Why an item is no step; a mapping of several keys is most often a step whose parameters lost their indentation
    (`- co_restart:` with `services:` under it, as deep as `co_restart`)."""
    keys = list(item) if isinstance(item, dict) else []
    found = []
    for key in keys[1:]:
        hint = indent_hint(doc, (*loc, key))
        if not hint and keys[0] in KINDS and key in KINDS[keys[0]].Params.model_fields:
            hint = f" (a parameter of {keys[0]}: indent it as deep as {keys[0]}'s other parameters)"
        if hint:
            found.append((doc.key_mark((*loc, key)), f"{'.'.join(map(str, loc))}.{key}: not a step's key{hint}"))
    return found or [(doc.mark(loc), f"{'.'.join(map(str, loc))}: a step is a kind name or {{kind: {{params}}}}")]


def check_order(steps: list[Step]) -> None:
    """In a playbook that changes files, refuse orders that would make a failure unrecoverable.

    A co_restart before the commit would leave services running code that a restore then
    removes from disk; a local_compile after the upload would check what was already sent.
    """
    kinds = [s.kind for s in steps]
    for index, step in enumerate(steps):
        for kind, why in needs(step).items():
            if kind not in kinds[:index]:
                raise ConfigError(f"{step.where}: {step.name} needs an earlier {kind} step: {why}")
    if "upload" not in kinds:
        return
    for index, step in enumerate(steps):
        if not isinstance(step, Ordered):
            continue
        for earlier in step.after:
            if earlier not in kinds[:index]:
                raise ConfigError(f"{step.where}: {step.name} must come after {earlier} "
                                  f"(a playbook that uploads files needs {earlier} before {step.kind})")
        for later in step.before:
            if later in kinds[:index]:
                raise ConfigError(f"{step.where}: {step.name} must come before {later}")
