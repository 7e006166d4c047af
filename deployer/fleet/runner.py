"""A fleet run: one playbook over many hosts, one Engine (one sub-run, lock, state, log) per host.

Hosts run in rolling batches (`rollout` in the playbook; the first batch is the canary), each batch on
a bounded thread pool so connections open concurrently. When more hosts than `max_failures` fail, no
further batch starts; with `on_failure: rollback_fleet` every host of the run that committed is rolled
back (restarted and verified again) through the single-host rollback. Each host's run dir stays where a
single-host run puts it, so `runs verify`, `rollback` and `recover` work per host; the fleet itself is
`<runs>/<fleet id>/fleet.json`, naming its sub-runs and their status.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deployer.config.models import Rollout, Unit
from deployer.errors import ConfigError, ConnectError, DeployerError, Interrupted
from deployer.fleet.unit import ABORTED, UnitRun, steps_for
from deployer.run import recover as recovery
from deployer.run import rollback as rollbacks
from deployer.run.engine import Engine, RunResult, as_failure
from deployer.run.shown import REFUSED, shown_state_of
from deployer.run.state import Phase, RunRecord
from deployer.runlog import EVENTS, list_runs, new_run_id, read_run, utc_now
from deployer.runlog import verify as runlog_problems
from deployer.steps.base import Effect
from deployer.steps.context import CancelToken, Listener

FLEET = "fleet.json"
DEFAULT_PARALLEL = 16
UNTOUCHED = "untouched"


class FleetCancel(CancelToken):
    """The fleet's token: a signal cancels every host's run. Each engine keeps its own token, so one
    host's broken run log stops that host, not the fleet."""

    def __init__(self) -> None:
        super().__init__()
        self.children: list[CancelToken] = []

    def child(self) -> CancelToken:
        token = CancelToken()
        self.children.append(token)
        if self.cancelled:
            token.cancel(self.reason)
        return token

    def cancel(self, reason: str = "interrupted", failure: DeployerError | None = None) -> None:
        super().cancel(reason, failure)
        for token in self.children:
            token.cancel(reason, failure)


@dataclass
class HostRun:
    """One host of a fleet run, as fleet.json records it."""

    host: str
    batch: int
    status: str = UNTOUCHED  # untouched | running | successful | failed | canceled
    state: str = UNTOUCHED  # untouched | running | the README's state of the sub-run, from its record
    run_id: str | None = None
    exit_code: int | None = None
    error: str | None = None
    phase: str | None = None
    git_before: str | None = None
    git_after: str | None = None
    elapsed_s: float | None = None
    rollback_run_id: str | None = None
    rollback_status: str | None = None
    rollback_error: str | None = None

    @property
    def committed(self) -> bool:
        """The host's run left its commit on the target (not already undone by its own on_failure)."""
        return bool(self.git_after) and self.phase not in (Phase.rolled_back.value, Phase.failed_restored.value)


@dataclass
class FleetState:
    fleet_id: str
    kind: str  # apply | rollback | recover
    playbook: str
    operator: str
    started: str
    parallel: int
    hosts: dict[str, HostRun]
    batches: list[list[str]]
    status: str = "running"  # running | successful | failed | canceled
    exit_code: int | None = None
    error: str | None = None
    ended: str | None = None
    stopped_after_batch: int | None = None  # the batch after which no further batch started
    of_fleet: str | None = None  # rollback/recover: the fleet run it acts on
    rolled_back_by: list[str] = field(default_factory=list)
    units: dict[str, list[str]] = field(default_factory=dict)

    def untouched(self) -> list[str]:
        return [name for name, run in self.hosts.items() if run.status == UNTOUCHED]


class FleetRecord:
    """fleet.json in its own directory of the runs dir, rewritten whole (atomically) on every change."""

    def __init__(self, runs_dir: Path, state: FleetState) -> None:
        self.dir = runs_dir / state.fleet_id
        self.state = state
        self._lock = threading.Lock()

    @classmethod
    def create(cls, runs_dir: Path, state: FleetState) -> FleetRecord:
        record = cls(runs_dir, state)
        runs_dir.mkdir(parents=True, exist_ok=True)
        record.dir.mkdir(mode=0o700)
        record.save()
        return record

    @classmethod
    def load(cls, runs_dir: Path, fleet_id: str) -> FleetRecord:
        path = runs_dir / fleet_id / FLEET
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"no fleet run {fleet_id!r} in {runs_dir} ({exc})") from None
        hosts = {name: HostRun(**run) for name, run in data.pop("hosts").items()}
        return cls(runs_dir, FleetState(hosts=hosts, **data))

    def save(self) -> None:
        with self._lock:
            tmp = self.dir / f".{FLEET}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(asdict(self.state), out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.dir / FLEET)


def is_fleet(runs_dir: Path, run_id: str) -> bool:
    return (runs_dir / run_id / FLEET).is_file()


def list_fleets(runs_dir: Path) -> list[FleetState]:
    if not runs_dir.is_dir():
        return []
    return [FleetRecord.load(runs_dir, p.name).state for p in sorted(runs_dir.iterdir()) if (p / FLEET).is_file()]


HostTask = Callable[[str, str], RunResult]  # (host, fleet id) -> the host's sub-run
# (unit, fleet id, report) -> None: runs every host of the unit, reporting each host's sub-run as it ends.
UnitTask = Callable[[str, str, Callable[[str, RunResult], None]], None]


class Slots:
    """--parallel counts hosts: a unit, whose hosts are worked on together, takes a slot for each of them
    (all the slots when it has more hosts than that)."""

    def __init__(self, count: int) -> None:
        self._count = self._free = count
        self._changed = threading.Condition()

    def run(self, hosts: int, work: Callable[[], None]) -> None:
        needed = min(hosts, self._count)
        with self._changed:
            self._changed.wait_for(lambda: self._free >= needed)
            self._free -= needed
        try:
            work()
        finally:
            with self._changed:
                self._free += needed
                self._changed.notify_all()


@dataclass
class FleetRunner:
    """Runs one task per host, batch after batch, and keeps fleet.json and the listeners up to date."""

    record: FleetRecord
    parallel: int = DEFAULT_PARALLEL
    max_failures: int = 0
    pause_s: float = 0.0
    cancel: FleetCancel = field(default_factory=FleetCancel)
    listeners: list[Listener] = field(default_factory=list)

    def emit(self, kind: str, /, **data: Any) -> None:
        event = {"type": kind, "fleet": self.record.state.fleet_id, "time": utc_now(), **data}
        for listener in self.listeners:
            listener(event)

    def run(self, task: HostTask, unit_task: UnitTask | None = None) -> None:
        """Batch after batch; in a batch, each unit is one piece of work (unit_task) and each other host one."""
        state = self.record.state
        slots = Slots(max(1, self.parallel))
        with ThreadPoolExecutor(max_workers=max(1, self.parallel), thread_name_prefix="deployer-host") as pool:
            for number, batch in enumerate(state.batches):
                if number and self.pause_s:
                    with contextlib.suppress(Interrupted):  # a signal ends the pause; the check below stops
                        self.cancel.wait(self.pause_s)
                failed = sum(run.status in ("failed", "canceled") for run in state.hosts.values())
                if failed > self.max_failures or self.cancel.cancelled:
                    state.stopped_after_batch = number - 1
                    self.emit("fleet_stopped", batch=number, failed=failed, untouched=state.untouched())
                    break
                self.emit("batch_start", batch=number, hosts=batch)
                in_units = {h for hosts in state.units.values() for h in hosts}
                work: list[tuple[int, Callable[[], None]]] = [
                    (len(hosts), functools.partial(self._unit, unit_task, unit))
                    for unit, hosts in state.units.items() if unit_task is not None and hosts[0] in batch]
                work += [(1, functools.partial(self._one, task, host)) for host in batch if host not in in_units]
                list(pool.map(lambda item: slots.run(*item), work))
        self.record.save()

    def _start(self, host: str) -> None:
        self.record.state.hosts[host].status = self.record.state.hosts[host].state = "running"
        self.record.save()
        self.emit("host_status", host=host, status="running")

    def _one(self, task: HostTask, host: str) -> None:
        self._start(host)
        started = time.monotonic()
        try:
            result: RunResult | DeployerError = task(host, self.record.state.fleet_id)
        except (Exception, KeyboardInterrupt) as exc:  # a task that could not even start its run
            result = as_failure(exc)
        self._ended(host, result, time.monotonic() - started)

    def _unit(self, unit_task: UnitTask | None, unit: str) -> None:
        assert unit_task is not None
        hosts = self.record.state.units[unit]
        for host in hosts:
            self._start(host)
        started = time.monotonic()
        try:
            unit_task(unit, self.record.state.fleet_id,
                      lambda host, result: self._ended(host, result, time.monotonic() - started))
        except (Exception, KeyboardInterrupt) as exc:
            for host in hosts:
                self._ended(host, as_failure(exc), time.monotonic() - started)
        for host in hosts:  # a host after the one whose lock was refused: its lock was never even tried
            if self.record.state.hosts[host].status == "running" and self.record.state.hosts[host].run_id is None:
                self.record.state.hosts[host].status = UNTOUCHED
                self.emit("host_status", host=host, status=UNTOUCHED)
        self.record.save()

    def _ended(self, host: str, result: RunResult | DeployerError, elapsed: float) -> None:
        run = self.record.state.hosts[host]
        if isinstance(result, DeployerError):  # no run was started: nothing of it reached the host
            run.status, run.state, run.exit_code, run.error = "failed", REFUSED, result.exit_code, str(result)
        else:
            run.run_id, run.status, run.exit_code, run.error = (result.run_id, result.status, result.exit_code,
                                                                 result.error)
            run.phase, run.git_before, run.git_after = result.phase, result.git_before, result.git_after
            run.state = shown_state_of(self.record.dir.parent, result.run_id, result.phase)
        run.elapsed_s = round(elapsed, 3)
        self.record.save()
        self.emit("host_status", host=host, status=run.status, run_id=run.run_id, exit_code=run.exit_code,
                  error=run.error, elapsed_s=run.elapsed_s)


def new_state(kind: str, playbook: str, operator: str, hosts: list[str], batches: list[list[str]], parallel: int,
              **extra: Any) -> FleetState:
    index = {host: number for number, batch in enumerate(batches) for host in batch}
    return FleetState(fleet_id=new_run_id(), kind=kind, playbook=playbook, operator=operator, started=utc_now(),
                      parallel=parallel, hosts={h: HostRun(h, index[h]) for h in hosts}, batches=batches, **extra)


def finish(record: FleetRecord, cancel: CancelToken) -> None:
    """The fleet's status and exit code: the canary's failure speaks first (batch order, then host order)."""
    state = record.state
    failed = [run for run in state.hosts.values() if run.status not in ("successful", UNTOUCHED)]
    rollback_failed = [run for run in state.hosts.values() if run.rollback_status not in (None, "successful")]
    if rollback_failed:
        state.status, state.exit_code = "failed", 6
        state.error = "; ".join(f"{r.host}: the rollback failed: {r.rollback_error}" for r in rollback_failed)
    elif failed:
        # A host that only stopped because another host of its unit failed is not the cause.
        first = min(failed, key=lambda r: (r.batch, ABORTED in (r.error or ""), list(state.hosts).index(r.host)))
        state.status = "canceled" if cancel.cancelled and first.status == "canceled" else "failed"
        state.exit_code = first.exit_code or 1
        state.error = f"{len(failed)} of {len(state.hosts)} host(s) failed; first: {first.host}: {first.error}"
    else:
        state.status, state.exit_code = "successful", 0
    if cut := [run for run in state.hosts.values() if run.state == Phase.interrupted.value]:
        state.error = (f"{state.error}\n" if state.error else "") + (
            f"interrupted on {', '.join(f'{run.host} (run {run.run_id})' for run in cut)}: the target may hold part "
            f"of the run, its intent record and lock; end {'it' if len(cut) == 1 else 'them'} with: "
            f"deployer recover {state.fleet_id}")
    state.ended = utc_now()
    record.save()


@dataclass
class FleetApply:
    """`deployer apply` over several hosts."""

    engines: dict[str, Engine]  # host -> its engine, in selection order
    runs_dir: Path
    rollout: Rollout
    on_failure: str
    parallel: int = DEFAULT_PARALLEL
    cancel: FleetCancel = field(default_factory=FleetCancel)
    listeners: list[Listener] = field(default_factory=list)
    units: dict[str, Unit] = field(default_factory=dict)  # every unit a host of the run belongs to (whole)

    def run(self) -> FleetState:
        members = {name: sorted(unit.hosts()) for name, unit in self.units.items()}
        for_units(self.engines, self.units)
        for engine in self.engines.values():  # every host's config is sound before any host connects
            engine.check_host()
        hosts = list(self.engines)
        first = next(iter(self.engines.values()))
        state = new_state("apply", first.playbook.model.name, first.operator, hosts,
                          unit_batches(self.rollout.split(hosts), members), self.parallel, units=members)
        record = FleetRecord.create(self.runs_dir, state)
        for engine in self.engines.values():
            engine.cancel = self.cancel.child()
            tagged(engine, state.fleet_id, self.listeners)
        runner = FleetRunner(record, self.parallel, self.rollout.max_failures, self.rollout.pause_s, self.cancel,
                             self.listeners)
        runner.emit("fleet_start", hosts=hosts, batches=state.batches, kind="apply")
        runner.run(lambda host, _: self.engines[host].apply(), self._unit)
        if self.on_failure == "rollback_fleet" and any(r.status != "successful" for r in state.hosts.values()
                                                       if r.status != UNTOUCHED):
            roll_back_hosts(record, runner, self.engines, self.units, force=False)
        finish(record, self.cancel)
        runner.emit("fleet_end", status=state.status, exit_code=state.exit_code)
        return state


    def _unit(self, name: str, fleet_id: str, report: Callable[[str, RunResult], None]) -> None:
        unit = self.units[name]
        UnitRun(name, unit, {h: self.engines[h] for h in unit.hosts()}, self.on_failure).run(report)


def for_units(engines: dict[str, Engine], units: dict[str, Unit]) -> None:
    """Each unit host's engine keeps the steps it runs itself: the unit's checks only on its metrics host."""
    for name, unit in units.items():
        for host in unit.hosts():
            engine = engines[host]
            if not any(s.effect == Effect.commits for s in engine.steps):
                raise ConfigError(f"unit {name}: the playbook has no commit step; a unit restarts after its "
                                  "hosts' commits")
            engine.steps = steps_for(engine.steps, name, unit, host)


def unit_batches(batches: list[list[str]], units: dict[str, list[str]]) -> list[list[str]]:
    """The rollout's batches with each unit's hosts together, in the batch of its earliest host."""
    where = {host: number for number, batch in enumerate(batches) for host in batch}
    moved = [list(batch) for batch in batches]
    for hosts in units.values():
        target = min(where[h] for h in hosts)
        for host in hosts:
            if where[host] != target:
                moved[where[host]].remove(host)
                moved[target].append(host)
    return [batch for batch in moved if batch]


def roll_back_hosts(record: FleetRecord, runner: FleetRunner, engines: dict[str, Engine],
                    units: dict[str, Unit], *, force: bool) -> None:
    """Every host of the fleet run that holds its run's commit: a revert commit, restart, checks again;
    the hosts of a unit reverted together and the unit restarted as one."""
    committed = {run.host: run for run in record.state.hosts.values() if run.committed and run.host in engines}
    runner.emit("fleet_rollback", hosts=list(committed))

    def report(host: str, result: RunResult | DeployerError) -> None:
        run = committed[host]
        if isinstance(result, DeployerError):
            run.rollback_status, run.rollback_error = "failed", str(result)
        else:
            run.rollback_run_id, run.rollback_status, run.rollback_error = (result.run_id, result.status,
                                                                            result.error)
        record.save()
        runner.emit("host_status", host=host, status=f"rollback {run.rollback_status}", run_id=run.rollback_run_id,
                    error=run.rollback_error)

    def one(host: str) -> None:
        engine = engines[host]
        engine.cancel = CancelToken()  # the rollback must finish even when a signal stopped the fleet
        runner.emit("host_status", host=host, status="rolling back")
        try:
            result: RunResult | DeployerError = rollbacks.rollback(
                engine, read_run(engine.runs_dir, str(committed[host].run_id)), force=force)
        except DeployerError as exc:
            result = exc
        report(host, result)

    def unit(name: str, hosts: list[str]) -> None:
        for host in hosts:
            engines[host].cancel = CancelToken()
            runner.emit("host_status", host=host, status="rolling back")
        runs = {h: read_run(engines[h].runs_dir, str(committed[h].run_id)) for h in hosts}
        UnitRun(name, units[name], {h: engines[h] for h in hosts}, "restore").rollback(runs, force=force,
                                                                                       on_result=report)

    work: list[Callable[[], None]] = []
    in_units: set[str] = set()
    for name, members in record.state.units.items():
        hosts = [h for h in members if h in committed]
        in_units.update(hosts)
        if hosts:
            work.append(functools.partial(unit, name, hosts))
    work += [functools.partial(one, host) for host in committed if host not in in_units]
    with ThreadPoolExecutor(max_workers=max(1, runner.parallel), thread_name_prefix="deployer-rollback") as pool:
        list(pool.map(lambda item: item(), work))


def follow_up(kind: str, runs_dir: Path, original: FleetRecord, hosts: list[str], task: HostTask, *,
              parallel: int, listeners: list[Listener], cancel: FleetCancel,
              units: dict[str, list[str]] | None = None, unit_task: UnitTask | None = None) -> FleetRecord:
    """A fleet run of its own (rollback, recover) over some hosts of an earlier one; both name each other."""
    state = new_state(kind, original.state.playbook, original.state.operator, hosts, [hosts], parallel,
                      of_fleet=original.state.fleet_id, units=units or {})
    record = FleetRecord.create(runs_dir, state)
    if kind == "rollback":
        original.state.rolled_back_by.append(state.fleet_id)
        original.save()
    runner = FleetRunner(record, parallel, len(hosts), 0.0, cancel, listeners)
    runner.emit("fleet_start", hosts=hosts, batches=[hosts], kind=kind)
    runner.run(task, unit_task)
    finish(record, cancel)
    runner.emit("fleet_end", status=state.status, exit_code=state.exit_code)
    return record


def rollback_fleet(runs_dir: Path, fleet_id: str, engine_for: Callable[[str, str], Engine], *,
                   hosts: list[str] | None, force: bool, parallel: int, listeners: list[Listener],
                   cancel: FleetCancel, units: dict[str, Unit]) -> FleetState:
    """`deployer rollback FLEET_ID`: roll back each host (or each of `hosts`) whose sub-run committed."""
    original = FleetRecord.load(runs_dir, fleet_id)
    if hosts is not None and (unknown := sorted(set(hosts) - set(original.state.hosts))):
        raise ConfigError(f"fleet run {fleet_id} did not run on {', '.join(unknown)} "
                          f"(its hosts: {', '.join(original.state.hosts)})")
    runs = {run.host: run.run_id for run in original.state.hosts.values()
            if run.committed and run.rollback_status != "successful" and (hosts is None or run.host in hosts)}
    if not runs:
        raise ConfigError(f"fleet run {fleet_id} left no commit to roll back"
                          f"{' on ' + ', '.join(hosts) if hosts else ''} (see 'deployer runs list')")

    def task(host: str, fleet_id: str) -> RunResult:
        run_id = runs[host]
        assert run_id is not None
        engine = tagged(engine_for(host, run_id), fleet_id, listeners)
        return rollbacks.rollback(engine, read_run(runs_dir, run_id), force=force)

    def unit_task(name: str, fleet_id: str, report: Callable[[str, RunResult], None]) -> None:
        members = [h for h in original.state.units[name] if h in runs]
        engines = {h: tagged(engine_for(h, str(runs[h])), fleet_id, listeners) for h in members}
        UnitRun(name, units[name], engines, "restore").rollback(
            {h: read_run(runs_dir, str(runs[h])) for h in members}, force=force, on_result=report)

    chosen_units = {name: [h for h in members if h in runs] for name, members in original.state.units.items()
                    if any(h in runs for h in members)}
    for name, chosen in chosen_units.items():
        left = [h for h in original.state.units[name] if h not in chosen and original.state.hosts[h].committed
                and original.state.hosts[h].rollback_status != "successful"]
        if left:
            raise ConfigError(f"--host takes part of unit {name} ({', '.join(original.state.units[name])}) but "
                              f"not {', '.join(left)}: a unit is rolled back and restarted whole")
    missing = sorted(set(chosen_units) - set(units))
    if missing:
        raise ConfigError(f"unit {', '.join(missing)} of fleet run {fleet_id} is no longer in the inventory; "
                          "roll its hosts back one by one with: deployer rollback RUN_ID")
    done = follow_up("rollback", runs_dir, original, list(runs), task, parallel=parallel, listeners=listeners,
                     cancel=cancel, units=chosen_units, unit_task=unit_task)
    for name, run in done.state.hosts.items():  # the original says which of its hosts were rolled back, by what
        if run.status == "successful":
            original.state.hosts[name].rollback_run_id = run.run_id
            original.state.hosts[name].rollback_status = "successful"
    original.save()
    return done.state


def sub_runs(runs_dir: Path, fleet_id: str) -> dict[str, str]:
    """Host -> its apply sub-run of the fleet, from the run logs themselves: a fleet killed mid-run never
    wrote the ids of the runs it had started into fleet.json."""
    found = {}
    for run in list_runs(runs_dir):
        start = run.start
        if start.get("fleet") == fleet_id and not start.get("rollback_of") and not start.get("recover_of"):
            found[str(start.get("host"))] = run.run_id
    return found


def needs_recovery(runs_dir: Path, run_id: str) -> bool:
    """The sub-run was cut: its record stops short of a settled phase, or its log of its run_end."""
    if not (runs_dir / run_id / EVENTS).is_file():
        return False
    return not recovery.ended(runs_dir, run_id, RunRecord.load(runs_dir / run_id))


def cut_sub_runs(runs_dir: Path, fleet_id: str) -> dict[str, str]:
    """Host -> its sub-run of the fleet that `recover FLEET_ID` has to end (empty: nothing to recover)."""
    return {host: run_id for host, run_id in sub_runs(runs_dir, fleet_id).items()
            if needs_recovery(runs_dir, run_id)}


def recover_fleet(runs_dir: Path, fleet_id: str, engine_for: Callable[[str, str], Engine], *, rollback: bool,
                  parallel: int, listeners: list[Listener], cancel: FleetCancel) -> FleetState:
    """`deployer recover FLEET_ID`: recover each sub-run that was cut (its record is not settled)."""
    original = FleetRecord.load(runs_dir, fleet_id)
    cut = sub_runs(runs_dir, fleet_id)
    runs = cut_sub_runs(runs_dir, fleet_id)
    if not runs:
        raise ConfigError(f"fleet run {fleet_id}: no sub-run needs recovering (every host's record is settled)")

    def task(host: str, follow_id: str) -> RunResult:
        run_id = runs[host]
        assert run_id is not None
        engine = tagged(engine_for(host, run_id), follow_id, listeners)
        return recovery.recover(engine, run_id, rollback=rollback)[0]

    done = follow_up("recover", runs_dir, original, list(runs), task, parallel=parallel, listeners=listeners,
                     cancel=cancel).state
    # The cut fleet's record learns what its hosts' runs were and where recover left them.
    for host, run_id in cut.items():
        entry = original.state.hosts[host]
        record = RunRecord.load(runs_dir / run_id)
        entry.run_id = run_id
        if entry.status == "running":
            entry.status = "failed"
            entry.error = f"the fleet run was cut; recovered by fleet run {done.fleet_id}"
        if record is not None:
            entry.phase = record.state.phase.value
            entry.state = shown_state_of(runs_dir, run_id, entry.phase)
    if original.state.status == "running":
        original.state.status, original.state.exit_code, original.state.ended = "failed", 1, utc_now()
        original.state.error = f"the fleet run was cut; recovered by fleet run {done.fleet_id}"
    original.save()
    return done


def tagged(engine: Engine, fleet_id: str, listeners: list[Listener]) -> Engine:
    engine.run_tags = {"fleet": fleet_id}
    engine.listeners.extend(listeners)
    return engine


def verify_fleet(runs_dir: Path, fleet_id: str,
                 verify_run: Callable[[Path, str], list[str]]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Problems per host: each sub-run's own log, and that it says it belongs to this fleet; and, apart, the
    hosts whose history could not be read (unreachable is not tampered)."""
    state = FleetRecord.load(runs_dir, fleet_id).state
    problems: dict[str, list[str]] = {}
    unreachable: dict[str, str] = {}
    for name, run in state.hosts.items():
        if run.run_id is None:
            if run.status != UNTOUCHED:
                problems[name] = [f"{name} is recorded as {run.status} but names no run"]
            continue
        try:
            found = verify_run(runs_dir, run.run_id)
            tag = read_run(runs_dir, run.run_id).start.get("fleet")
        except ConnectError as exc:
            unreachable[name] = str(exc)
            found, tag = runlog_problems(runs_dir, run.run_id), read_run(runs_dir, run.run_id).start.get("fleet")
        except DeployerError as exc:
            found, tag = [str(exc)], fleet_id
        if tag != fleet_id:
            found.append(f"run {run.run_id} does not name fleet {fleet_id} in its run_start (names {tag!r})")
        if found:
            problems[name] = [f"run {run.run_id}: {p}" for p in found]
    return problems, unreachable
