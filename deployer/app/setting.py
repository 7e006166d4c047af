"""What every use case that works on targets is given and made with: the inventory, runs dir and host-key
choice it names (Setting), the Build its engines and connections come from, and the hosts a name selects."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.config.models import Inventory
    from deployer.run.revert_checks import RevertChecks
    from deployer.steps.context import Listener


@dataclass(frozen=True, kw_only=True)
class Setting:
    """Where a use case looks: the inventory file (None: $DEPLOYER_INVENTORY, then ./hosts.yaml), the runs dir
    (None: $DEPLOYER_RUNS_DIR, then ./.deployer/runs where there is one, then this user's history), and whether
    an unknown SSH host key is pinned (a changed one is always refused)."""

    inventory: str | Path | None = None
    runs_dir: str | Path | None = None
    accept_new_host_key: bool = False


@dataclass(frozen=True, kw_only=True)
class RevertSetting(Setting):
    """A rollback's say over the checks it runs on the reverted build (rollback, recover with a rollback): the
    checks left out (`all`: every check after the restart) and each metric's baseline instead of the run's."""

    health_timeout_s: float | None = None  # every service's health budget, for this run only
    skip_checks: frozenset[str] = frozenset()
    baselines: Mapping[str, float] = field(default_factory=dict)

    def revert_checks(self) -> RevertChecks | None:
        """The RevertChecks these give (None: the playbook's, as they are)."""
        from deployer.run.revert_checks import RevertChecks

        if not self.skip_checks and not self.baselines:
            return None
        return RevertChecks(skip=frozenset(self.skip_checks), baseline=dict(self.baselines))


def build_of(setting: Setting, listener: Listener | None, health_timeout_s: float | None = None,
             revert_checks: RevertChecks | None = None) -> Build:
    """What the use case's engines and connections are made with; listener hears every engine's events, and a
    bare connection's (a pinned host key)."""
    from deployer.build import Build

    inventory = str(setting.inventory) if setting.inventory is not None else None
    return Build(runs_dir_of(setting.runs_dir), inventory, setting.accept_new_host_key,
                 (listener,) if listener is not None else (), health_timeout_s, revert_checks)


def runs_dir_of(given: str | Path | None, notice: Callable[[str], object] | None = None) -> Path:
    """The runs dir a use case works in: given, else $DEPLOYER_RUNS_DIR, else the cwd's .deployer/runs where
    there is one (notice is told so: its runs stay found where they were made), else this user's history."""
    from deployer import runlog

    return runlog.runs_dir_from(str(given) if given is not None else None, notice)


def inventory_of(setting: Setting, *specs: str | None) -> Inventory:
    """The inventory the setting names, loaded and checked (a ConfigError says where it is wrong); the pods of the
    selector hosts that specs (--host, --limit) may name listed now (none given: every selector's)."""
    from deployer.config.models import load_inventory
    from deployer.config.paths import find_inventory
    from deployer.transport.kubernetes import expand_selectors  # a selector's pods are hosts, listed now

    return expand_selectors(load_inventory(find_inventory(str(setting.inventory) if setting.inventory is not None
                                                          else None)),
                            [spec for spec in specs if spec is not None] if specs else None)


def select_hosts(setting: Setting, spec: str, limit: str | None = None) -> tuple[Inventory, list[str]]:
    """The inventory, and the hosts spec (a host, group, unit, comma list or glob) and limit name, in order."""
    from deployer.config import targets

    loaded = inventory_of(setting, spec, limit)
    return loaded, targets.resolve(loaded, spec, limit=limit)


@contextmanager
def setting_up() -> Iterator[None]:
    """No garbage collection while a use case sets up: its imports and models make several hundred thousand
    objects and free almost no cycles, and each full collection walks them all again (about 3% of an apply's
    start-up). The collector is back on when the set-up ends, however it ends, before anything runs, with what
    the set-up made frozen out of its reach: otherwise its first collection walks all of that (~20 ms, on the
    way to the first command)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.freeze()
            gc.enable()
