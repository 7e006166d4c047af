"""Step kinds by name; a playbook's `steps:` list refers to them.

Each kind is named here with the module that holds it, and imported the first time it is looked up: a playbook
names a few kinds, and the others (the restart, the storm, the canary, with their own imports) cost an apply's
start-up for nothing. Iterating the registry names every kind without importing one; its values (`schema`)
import them all."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from deployer.steps.base import Scope, Step
from deployer.steps.optional import SpansUnit

# kind -> (module, class); a new kind is its module and one line here (docs/explanation/extending.md).
WHERE: dict[str, tuple[str, str]] = {
    "local_compile": ("deployer.steps.compile", "LocalCompile"),
    "upload": ("deployer.steps.upload", "Upload"),
    "remote_compile": ("deployer.steps.compile", "RemoteCompile"),
    "diff_bounds": ("deployer.steps.git", "DiffBounds"),
    "commit": ("deployer.steps.git", "Commit"),
    "co_restart": ("deployer.steps.services.co_restart", "CoRestart"),
    "baseline": ("deployer.steps.metrics", "Baseline"),
    "storm": ("deployer.steps.storm", "Storm"),
    "drain": ("deployer.steps.metrics", "Drain"),
    "canary": ("deployer.steps.canary", "Canary"),
    "analysis_baseline": ("deployer.steps.analysis", "AnalysisBaseline"),
    "analysis": ("deployer.steps.analysis", "Analysis"),
}


class Kinds(Mapping[str, "type[Step]"]):
    """The registry: each kind's class, its module imported on first lookup."""

    def __init__(self, where: dict[str, tuple[str, str]]) -> None:
        self._where = where
        self._loaded: dict[str, type[Step]] = {}

    def __getitem__(self, kind: str) -> type[Step]:
        module, name = self._where[kind]  # KeyError: no such kind (one taken out of WHERE is gone)
        found = self._loaded.get(kind)
        if found is None:
            found = getattr(importlib.import_module(module), name)
            assert found.kind == kind, (kind, found)
            # A unit runs a step of scope unit across its hosts: only through SpansUnit's members.
            assert found.scope != Scope.unit or issubclass(found, SpansUnit), (kind, found)
            self._loaded[kind] = found
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


KINDS: Mapping[str, type[Step]] = Kinds(WHERE)
