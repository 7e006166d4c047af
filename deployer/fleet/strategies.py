"""Rollout strategies: which hosts of a fleet run go next, and when no further hosts start.

The runner asks a strategy for its batches once, up front (fleet.json records them, and each host its batch),
then, before each batch, whether it starts. A new strategy (issue 22's router-drained rolling restart) is one
class here and one branch of `strategy_for`, where a playbook's `rollout:` picks it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping

from deployer.config.models import Rollout
from deployer.errors import ConfigError, Interrupted
from deployer.fleet.record import FleetState
from deployer.steps.cancel import CancelToken


class Strategy(ABC):
    @abstractmethod
    def batches(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        """The hosts in the batches they start in; a unit's hosts are worked on together, so in one batch."""

    @abstractmethod
    def proceed(self, number: int, state: FleetState, cancel: CancelToken) -> bool:
        """Whether batch `number` starts, given how the earlier ones went (False: no further batch starts)."""

    def stops_on(self, number: int, cancel: CancelToken) -> bool:
        """Whether a signal keeps batch `number` from starting (and every later one)."""
        return cancel.cancelled


class Batches(Strategy):
    """The playbook's `rollout:`: its batch sizes in order (the first batch is the canary), a pause between
    batches, and no further batch once more hosts than `max_failures` failed."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def batches(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        return unit_batches(self.rollout.split(hosts), units)

    def proceed(self, number: int, state: FleetState, cancel: CancelToken) -> bool:
        if number and self.rollout.pause_s:
            with contextlib.suppress(Interrupted):  # a signal ends the pause; the runner sees the cancel
                cancel.wait(self.rollout.pause_s)
        return len(state.failed()) <= self.rollout.max_failures


class Rolling(Batches):
    """`rollout: {strategy: rolling}`: one unit (or one host outside a unit) per batch, in selection order, so
    every other unit behind the same router serves while one is out of it; max_failures and pause_s as Batches."""

    def batches(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        return unit_batches([[host] for host in hosts], units)


class Together(Strategy):
    """Every host in one batch, whatever fails: a recover of a fleet run ends each host it names."""

    def batches(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        return [hosts]

    def proceed(self, number: int, state: FleetState, cancel: CancelToken) -> bool:
        return True

    def stops_on(self, number: int, cancel: CancelToken) -> bool:
        # A signal before anything started stops the follow-up; once it started, every batch runs, as when all
        # hosts were one batch (a rollback stopped between units would leave the fleet half on each code).
        return number == 0 and cancel.cancelled


class TakingTurns(Together):
    """A rollback of a fleet run: every host it names is rolled back whatever fails, as Together, but the units
    behind one router take turns, one out of it at a time in the order the hosts are given (the apply's rolling
    order), so the others serve meanwhile. Everything else goes in the first batch, beside each router's first unit.
    routers: unit -> the router it is behind (None: none)."""

    def __init__(self, routers: Mapping[str, str | None]) -> None:
        self.routers = routers

    def batches(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        order = {host: number for number, host in enumerate(hosts)}
        turns: dict[str, int] = {}  # router -> the turns given so far
        where: dict[str, int] = {}  # host -> its batch; a host in no router's unit goes first
        for name in sorted(units, key=lambda unit: min(order[h] for h in units[unit])):
            router = self.routers.get(name)
            if router is not None:
                turn = turns[router] = turns.get(router, -1) + 1
                where.update(dict.fromkeys(units[name], turn))
        batches: list[list[str]] = [[] for _ in range(max(turns.values(), default=0) + 1)]
        for host in hosts:
            batches[where.get(host, 0)].append(host)
        return [batch for batch in batches if batch]


def strategy_for(rollout: Rollout) -> Strategy:
    """The one place a playbook's `rollout:` chooses how its fleet run spreads over the hosts."""
    return Rolling(rollout) if rollout.strategy == "rolling" else Batches(rollout)


def no_unit_serves(router: str, units: list[str]) -> str:
    return (f"router {router}: no other unit serves behind it while {' and '.join(units)} restart"
            f"{'s' if len(units) == 1 else ''}")


def refuse_downtime(batches: list[list[str]], units: Mapping[str, list[str]], behind: Mapping[str, list[str]],
                    allowed: bool) -> None:
    """Unless --allow-downtime: refuse batches that leave a router with no unit behind it, before anything starts."""
    if not allowed and (down := downtime(batches, units, behind)):
        raise ConfigError("; ".join(no_unit_serves(router, names) for router, names in down.items())
                          + ": that is downtime; pass --allow-downtime to accept it")


def downtime(batches: list[list[str]], units: Mapping[str, list[str]],
             behind: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """router -> the units behind it that one batch takes out all at once: nothing else serves through it then.
    behind: each router's units in the whole inventory (a unit outside this run still serves)."""
    found: dict[str, list[str]] = {}
    for router, names in behind.items():
        for batch in batches:
            out = [name for name in names if name in units and units[name][0] in batch]
            if out and len(out) == len(names):
                found[router] = out
    return found


def unit_batches(batches: list[list[str]], units: Mapping[str, list[str]]) -> list[list[str]]:
    """The batches with each unit's hosts together, in the batch of its earliest host."""
    where = {host: number for number, batch in enumerate(batches) for host in batch}
    moved = [list(batch) for batch in batches]
    for hosts in units.values():
        target = min(where[h] for h in hosts)
        for host in hosts:
            if where[host] != target:
                moved[where[host]].remove(host)
                moved[target].append(host)
    return [batch for batch in moved if batch]
