"""Runs one task per host of a fleet run, batch after batch as its rollout strategy says, and keeps fleet.json
and the listeners up to date.

Each batch runs on a bounded thread pool so connections open concurrently; a unit (hosts worked on together)
is one piece of work that reports each of its hosts' sub-runs as it ends. A signal cancels every host's run.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import DeployerError, Interrupted, RolloutPaused
from deployer.fleet.record import UNTOUCHED, FleetRecord, Paused
from deployer.fleet.strategies import Strategy
from deployer.fleet.unit import ABORTED
from deployer.run.engine import Engine, RunResult, as_failure
from deployer.run.shown import REFUSED, shown_state_of
from deployer.runlog import utc_now
from deployer.runstate import Phase
from deployer.steps.cancel import CancelToken
from deployer.steps.context import Listener
from deployer.waiting import all_done

DEFAULT_PARALLEL = 16
# Why a run that a signal stopped between its batches is paused (resume goes on, abort rolls back).
INTERRUPTED_PAUSE = "interrupted during a timed pause"
INTERRUPTED_BETWEEN = "interrupted between batches"

HostTask = Callable[[str, str], RunResult]  # (host, fleet id) -> the host's sub-run
# (unit, fleet id, report) -> None: runs every host of the unit, reporting each host's sub-run as it ends.
UnitTask = Callable[[str, str, Callable[[str, RunResult], None]], None]


class FleetCancel(CancelToken):
    """The fleet's token: a signal cancels every host's run. Each engine keeps its own token, so one
    host's broken run log stops that host, not the fleet."""

    def __init__(self) -> None:
        super().__init__()
        self.children: list[CancelToken] = []
        self.finishers: list[CancelToken] = []  # see finisher

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

    def finisher(self) -> CancelToken:
        """A host's token for a rollback that must finish even when a signal stopped the fleet: never cancelled by
        the fleet, which still says, to a first signal, that the rollback goes on to its end (finishing)."""
        token = CancelToken()
        self.finishers.append(token)
        return token

    def finishing(self) -> str | None:
        """A host's rollback that goes on to its end first (its own token knows)."""
        return next((what for token in [*self.children, *self.finishers] if (what := token.finishing())),
                    super().finishing())

    def forced(self) -> bool:
        """Held back once while any host's run puts its target back (its own token knows)."""
        return not self._hold_back([token._undoing for token in self.children])


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
    strategy: Strategy
    parallel: int = DEFAULT_PARALLEL
    cancel: FleetCancel = field(default_factory=FleetCancel)
    listeners: list[Listener] = field(default_factory=list)

    def emit(self, kind: str, /, **data: Any) -> None:
        event = {"type": kind, "fleet": self.record.state.fleet_id, "time": utc_now(), **data}
        for listener in self.listeners:
            listener(event)

    def run(self, task: HostTask, unit_task: UnitTask | None = None, start: int = 0) -> None:
        """Batch after batch from batch `start` (a resumed run: the one it paused before, approved); in a batch,
        each unit is one piece of work (unit_task) and each other host one. A pause until a person resumes stops
        here, between batches, once every host started has ended: the record says paused, and why."""
        state = self.record.state
        slots = Slots(max(1, self.parallel))
        with ThreadPoolExecutor(max_workers=max(1, self.parallel), thread_name_prefix="deployer-host") as pool:
            for number in range(start, len(state.batches)):
                if not self._proceeds(number):
                    break
                hold = self.strategy.pause_before(number, state) if number > start else None
                if hold is not None and hold.duration_s is None:
                    self._hold(number, hold.reason)
                    break
                if hold is not None and self._wait(number, hold.reason, hold.duration_s or 0.0):
                    break
                batch = state.batches[number]
                self.emit("batch_start", batch=number, hosts=batch)
                in_units = {h for hosts in state.units.values() for h in hosts}
                # Only the hosts not done yet: a run a signal stopped inside this batch did some of them already.
                todo = [host for host in batch if state.hosts[host].status == UNTOUCHED]
                work: list[tuple[int, Callable[[], None]]] = [
                    (len(hosts), functools.partial(self._unit, unit_task, unit))
                    for unit, hosts in state.units.items() if unit_task is not None and hosts[0] in todo]
                work += [(1, functools.partial(self._one, task, host)) for host in todo if host not in in_units]
                all_done([pool.submit(slots.run, *item) for item in work])
            else:  # every batch ran: a host of the last one may still be held for a person
                end = self.strategy.pause_before(len(state.batches), state) if start < len(state.batches) else None
                if end is not None and end.duration_s is None:
                    self._hold(len(state.batches), end.reason)
        self.record.save()

    def _proceeds(self, number: int) -> bool:
        """Whether batch `number` may start; when not, the record and the listeners say the run stopped."""
        state = self.record.state
        if self.strategy.proceed(number, state, self.cancel) and not self.strategy.stops_on(number, self.cancel):
            return True
        if self.strategy.stops_on(number, self.cancel) and not state.failed():
            # A signal between batches, every host started having ended well: paused there, as in a timed pause.
            state.pauses.append(Paused(number, INTERRUPTED_BETWEEN, utc_now()))
            state.status = "paused"
        state.stopped_after_batch = number - 1
        self.emit("fleet_stopped", batch=number, failed=len(state.failed()), untouched=state.untouched())
        return False

    def _wait(self, number: int, reason: str, seconds: float) -> bool:
        """A timed pause before batch `number`, recorded as it starts; True when a signal cut it short: the run
        stops there paused (and interrupted), for `rollout resume` or `rollout abort` to end, as a pause until
        resumed is."""
        state = self.record.state
        pause = Paused(number, reason, utc_now())
        state.pauses.append(pause)
        self.record.save()
        self.emit("fleet_paused", batch=number, reason=reason, duration_s=seconds)
        with contextlib.suppress(Interrupted):  # a signal ends the pause; the check below sees the cancel
            self.cancel.wait(seconds)
        if self.strategy.stops_on(number, self.cancel):
            pause.reason = f"{INTERRUPTED_PAUSE} ({reason}, {seconds:g}s)"
            state.status, state.stopped_after_batch = "paused", number - 1
            self.emit("fleet_stopped", batch=number, failed=len(state.failed()), untouched=state.untouched())
            return True
        pause.ended, pause.ended_by = utc_now(), "timer"
        self.record.save()
        self.emit("fleet_resumed", batch=number, reason=f"{seconds:g}s passed")
        return False

    def _hold(self, number: int, reason: str) -> None:
        """Paused until a person resumes: recorded (which batch is next, why), then said."""
        state = self.record.state
        state.pauses.append(Paused(number, reason, utc_now()))
        state.status = "paused"
        self.record.save()
        self.emit("fleet_paused", batch=number, reason=reason, done=[h for h, r in state.hosts.items()
                                                                     if r.status == "successful"],
                  held=state.held(), untouched=state.untouched())

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
            run.changed = result.document()["changed"]
        run.elapsed_s = round(elapsed, 3)
        self.record.save()
        self.emit("host_status", host=host, status=run.status, run_id=run.run_id, exit_code=run.exit_code,
                  error=run.error, elapsed_s=run.elapsed_s)


def finish(record: FleetRecord, cancel: CancelToken) -> None:
    """The fleet's status and exit code: the canary's failure speaks first (batch order, then host order)."""
    state = record.state
    if (pause := state.pause) is not None:
        # A signal that cut a timed pause short, or came between batches: paused, with an interrupted run's exit code.
        state.status = "paused"
        state.exit_code = Interrupted.exit_code if cancel.cancelled else RolloutPaused.exit_code
        where = (f"before batch {pause.before_batch + 1}" if pause.before_batch < len(state.batches) else
                 "after its last batch")
        state.error = (f"paused {where}: {pause.reason}\n"
                       f"go on with: deployer rollout resume {state.fleet_id}; or roll back every host that "
                       f"committed: deployer rollout abort {state.fleet_id}")
        record.save()
        return
    failed = [run for run in state.hosts.values() if run.status not in ("successful", UNTOUCHED) and not run.approved]
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
    if state.status == "canceled" and state.kind == "apply":  # stopped by a signal: it goes on, or back
        state.error = (f"{state.error}\n" if state.error else "") + (
            f"{'then ' if cut else ''}go on with: deployer rollout resume {state.fleet_id}; or roll back every host "
            f"that committed: deployer rollout abort {state.fleet_id}")
    state.ended = utc_now()
    record.save()


def tagged(engine: Engine, fleet_id: str, listeners: list[Listener]) -> Engine:
    """A host's engine as a sub-run of the fleet: its run_start names the fleet, its events reach the fleet's."""
    engine.run_tags = {**engine.run_tags, "fleet": fleet_id}
    engine.listeners.extend(listeners)
    return engine
