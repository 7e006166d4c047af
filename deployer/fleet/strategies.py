"""Rollout strategies: which hosts of a fleet run go next, and when no further hosts start.

The runner asks a strategy for its batches once, up front (fleet.json records them, and each host its batch),
then, before each batch, whether it starts. A new strategy (issue 22's router-drained rolling restart) is one
class here and one branch of `strategy_for`, where a playbook's `rollout:` picks it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from deployer.config.models import Unit
from deployer.config.rollout import Rollout, share_of
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

    def pause_before(self, number: int, state: FleetState) -> Hold | None:
        """The pause before batch `number` starts (number len(batches): after the last batch), if any."""
        return None


@dataclass(frozen=True)
class Hold:
    """A pause of a fleet run between batches: for duration_s, or (None) until a person resumes it."""

    reason: str
    duration_s: float | None = None


class Batches(Strategy):
    """The playbook's `rollout:`: its batch sizes in order (the first batch is the canary), a pause between
    batches, and no further batch once more hosts than `max_failures` failed."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    def batches(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        """The batches, refused where the rollout's steps reach past them (plan and apply both ask here)."""
        found = self.arrange(hosts, units)
        self.rollout.check_steps(len(found), len(hosts))
        return found

    def arrange(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        return unit_batches(self.rollout.split(hosts), units)

    def proceed(self, number: int, state: FleetState, cancel: CancelToken) -> bool:
        if number and self.rollout.pause_s:
            with contextlib.suppress(Interrupted):  # a signal ends the pause; the runner sees the cancel
                cancel.wait(self.rollout.pause_s)
        return len(set(state.failed()) - set(self.held(state))) <= self.rollout.max_failures

    def held(self, state: FleetState) -> list[str]:
        """The hosts an inconclusive analysis holds for a person (on_inconclusive: pause), not counted as failed."""
        return state.held() if self.rollout.on_inconclusive == "pause" else []

    def pause_before(self, number: int, state: FleetState) -> Hold | None:
        if held := self.held(state):
            return Hold(f"the analysis was inconclusive on {', '.join(held)} (on_inconclusive: pause): its "
                        "commit is held for a person to approve (resume) or roll back (abort)")
        pause = self.rollout.pauses().get(number) if number < len(state.batches) else None
        if pause is None:
            return None
        after = f"batch {number} ({', '.join(state.batches[number - 1])})"  # as people count them, from 1
        return Hold(f"the rollout pauses after {after}" + ("" if pause.duration is not None else
                                                           ": resume to go on, abort to roll back"), pause.duration)


ROLES = ("prefill", "decode", "regular")  # a router worker's types, in the order plan shows them


@dataclass(frozen=True)
class Serving:
    """A unit as its router sees it: the router (None: behind none) and its workers there by role."""

    router: str | None
    roles: Mapping[str, int]  # worker_type (prefill, decode, regular) -> how many of the unit's workers

    @classmethod
    def of(cls, unit: Unit) -> Serving:
        return cls(unit.router, Counter(worker.worker_type for worker in unit.workers))


class Rolling(Batches):
    """`rollout: {strategy: rolling}`: max_unavailable units (or hosts outside a unit) per batch, in selection order,
    so every other unit behind the same router serves while a batch is out of it (rolling_batches);
    max_failures and pause_s as Batches. serving: each unit of the run as its router sees it."""

    def __init__(self, rollout: Rollout, serving: Mapping[str, Serving] | None = None) -> None:
        super().__init__(rollout)
        self.serving = serving or {}

    def arrange(self, hosts: list[str], units: Mapping[str, list[str]]) -> list[list[str]]:
        item = {host: host for host in hosts} | {host: name for name, members in units.items() for host in members}
        order = list(dict.fromkeys(item[host] for host in hosts))
        chosen = rolling_batches(order, self.serving, share_of(self.rollout.max_unavailable, len(order)))
        return [[host for host in hosts if item[host] in batch] for batch in chosen]


def rolling_batches(order: list[str], serving: Mapping[str, Serving], limit: int) -> list[list[str]]:
    """The units (a name outside `serving`: behind no router) in batches of at most `limit`, each batch led by the
    first unit still waiting, so the rollout moves in order. Its other units are those that keep every role behind
    their router serving (one of its workers outside the batch), the one that keeps the roles' shares out of the
    router closest together first (prefill and decode leave in their ratio), then in order. A unit that alone takes
    a role's last worker out still gets its batch (floor 1): refuse_downtime judges that. Only the run's units count
    as capacity: a unit outside the run serves too, so this errs on the side of smaller batches."""
    total = Counter[tuple[str, str]]()
    for name in order:
        total.update(workers_of(serving.get(name)))
    waiting, batches = list(order), []
    while waiting:
        batch = [waiting.pop(0)]
        out = workers_of(serving.get(batch[0]))
        while len(batch) < limit:
            fits = [name for name in waiting
                    if all(out[key] + count < total[key] for key, count in workers_of(serving.get(name)).items())]
            if not fits:
                break
            best = min(fits, key=lambda name: (spread(out + workers_of(serving.get(name)), total,
                                                      serving.get(name)), waiting.index(name)))
            batch.append(best)
            waiting.remove(best)
            out.update(workers_of(serving.get(best)))
        batches.append(batch)
    return batches


@dataclass(frozen=True)
class BatchPlan:
    """One batch as `plan` shows it: its units (a plain host outside a unit by its name), its hosts, and what each
    router it touches keeps serving meanwhile, by role: (workers serving, of all the run's workers there)."""

    units: list[str]
    hosts: list[str]
    left: dict[str, dict[str, tuple[int, int]]]

    def document(self) -> dict[str, object]:
        return {"units": self.units, "hosts": self.hosts,
                "serving": {router: {role: {"serving": n, "of": of} for role, (n, of) in roles.items()}
                            for router, roles in self.left.items()}}

    def describe(self) -> str:
        keeps = "; ".join(f"router {router} keeps " + ", ".join(f"{role} {n}/{of}" for role, (n, of) in roles.items())
                          for router, roles in self.left.items())
        return ", ".join(self.units) + (f" — {keeps}" if keeps else "")


def batch_plans(batches: list[list[str]], units: Mapping[str, list[str]],
                serving: Mapping[str, Serving]) -> list[BatchPlan]:
    """The batches as units, and the capacity each leaves behind the routers it touches."""
    item = {host: name for name, members in units.items() for host in members}
    named = [list(dict.fromkeys(item.get(host, host) for host in batch)) for batch in batches]
    total = Counter[tuple[str, str]]()
    for batch in named:
        for name in batch:
            total.update(workers_of(serving.get(name)))
    plans = []
    for batch, hosts in zip(named, batches, strict=True):
        out = Counter[tuple[str, str]]()
        for name in batch:
            out.update(workers_of(serving.get(name)))
        routers = dict.fromkeys(router for router, _ in out)
        left = {router: {role: (count - out[router, role], count) for (r, role), count in
                         sorted(total.items(), key=lambda entry: ROLES.index(entry[0][1])) if r == router}
                for router in routers}
        plans.append(BatchPlan(batch, hosts, left))
    return plans


def mixed_pairing(plans: list[BatchPlan], serving: Mapping[str, Serving]) -> list[str]:
    """What `plan` says of each router that may pair a patched prefill with an unpatched decode: one with prefill
    and decode workers whose units restart in more than one batch. No router API here routes by a worker's build
    (no labels, no worker groups), and a PD router picks the prefill and the decode of a request apart (the demo's
    at random), so two units behind one router pair across each other, whatever each unit holds."""
    batches_of: dict[str, set[int]] = {}
    roles: dict[str, set[str]] = {}
    for number, plan in enumerate(plans):
        for name in plan.units:
            if (one := serving.get(name)) is not None and one.router is not None:
                batches_of.setdefault(one.router, set()).add(number)
                roles.setdefault(one.router, set()).update(role for role, n in one.roles.items() if n)
    return [f"router {router} cannot tell a patched worker from an unpatched one (it routes by no build label or "
            f"worker group): between batches it may pair a patched prefill with an unpatched decode, and the "
            f"reverse; give each build its own router to keep them apart"
            for router, numbers in batches_of.items() if len(numbers) > 1 and {"prefill", "decode"} <= roles[router]]


def workers_of(one: Serving | None) -> Counter[tuple[str, str]]:
    """(router, role) -> the unit's workers there."""
    if one is None or one.router is None:
        return Counter()
    return Counter({(one.router, role): count for role, count in one.roles.items()})


def spread(out: Mapping[tuple[str, str], int], total: Mapping[tuple[str, str], int], one: Serving | None) -> float:
    """How far apart the shares of each role out of one's router are (0: the prefill:decode ratio kept)."""
    if one is None or one.router is None:
        return 0.0
    shares = [out.get(key, 0) / count for key, count in total.items() if key[0] == one.router]
    return max(shares) - min(shares) if shares else 0.0


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


def strategy_for(rollout: Rollout, serving: Mapping[str, Serving] | None = None) -> Strategy:
    """The one place a playbook's `rollout:` chooses how its fleet run spreads over the hosts. serving: each unit
    of the run as its router sees it (Serving.of)."""
    return Rolling(rollout, serving) if rollout.strategy == "rolling" else Batches(rollout)


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
