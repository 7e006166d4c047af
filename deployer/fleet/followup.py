"""What follows a fleet run: rolling back the hosts that committed (within the run, for `on_failure:
rollback_fleet`, or later as `deployer rollback FLEET_ID`), recovering its cut sub-runs (`deployer recover
FLEET_ID`), and verifying every sub-run's log. A follow-up is a fleet run of its own; both records name each other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deployer.config.models import Host, Unit
from deployer.config.units import units_behind
from deployer.errors import ConfigError, ConnectError, DeployerError
from deployer.fleet.record import UNTOUCHED, FleetRecord, FleetState, new_state, sub_runs
from deployer.fleet.router import Routers
from deployer.fleet.runner import FleetCancel, FleetRunner, HostTask, UnitTask, finish, tagged
from deployer.fleet.strategies import Strategy, TakingTurns, Together, refuse_downtime
from deployer.fleet.unit import UnitRun
from deployer.run import recover as recovery
from deployer.run import rollback as rollbacks
from deployer.run.engine import Engine, RunResult
from deployer.run.shown import shown_state_of
from deployer.runlog import EVENTS, read_run, utc_now
from deployer.runlog import verify as runlog_problems
from deployer.runstate import Phase, RunRecord
from deployer.steps.context import Listener
from deployer.steps.gitops import differ_argv, names, touched_argv
from deployer.transport.base import Transport
from deployer.waiting import all_done


def roll_back_hosts(record: FleetRecord, runner: FleetRunner, engines: dict[str, Engine],
                    units: dict[str, Unit], *, force: bool, routers: Routers | None = None) -> None:
    """Every host of the fleet run that holds its run's commit: a revert commit, restart, checks again;
    the hosts of a unit reverted together and the unit restarted as one (out of its router meanwhile, the units
    behind one router one after the other)."""
    routers = routers or Routers()
    committed = {run.host: run for run in record.state.hosts.values() if run.committed and run.host in engines}
    runner.emit("fleet_rollback", hosts=list(committed))

    def report(host: str, result: RunResult | DeployerError) -> None:
        if host not in committed:  # held the fix: restarted with its unit's rollback, nothing of it rolled back
            runner.emit("host_status", host=host, status="restarted with its unit",
                        run_id=None if isinstance(result, DeployerError) else result.run_id)
            return
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
        engine.cancel = runner.cancel.finisher()  # the rollback must finish even when a signal stopped the fleet
        runner.emit("host_status", host=host, status="rolling back")
        try:
            result: RunResult | DeployerError = rollbacks.rollback(
                engine, read_run(engine.runs_dir, str(committed[host].run_id)), force=force)
        except DeployerError as exc:
            result = exc
        report(host, result)

    def unit(name: str, hosts: list[str]) -> None:
        for host in hosts:
            engines[host].cancel = runner.cancel.finisher()
            runner.emit("host_status", host=host, status="rolling back")
        runs = {h: read_run(engines[h].runs_dir, str(record.state.hosts[h].run_id)) for h in hosts}
        chosen = {h: engines[h] for h in hosts}
        UnitRun(name, units[name], chosen, "restore", routing=routers.for_unit(name, units[name], chosen)).rollback(
            runs, force=force, held=held, on_result=report)

    held = held_with_units(record.state, set(committed))
    members = {name: [h for h in hosts if h in committed or h in held] for name, hosts in record.state.units.items()
               if any(h in committed for h in hosts)}
    in_units = {host for hosts in members.values() for host in hosts}
    # The units behind one router take turns, as `deployer rollback FLEET_ID` does. A turn takes one unit out of
    # its router: downtime only for a unit alone behind it, which the apply already needed --allow-downtime for.
    with ThreadPoolExecutor(max_workers=max(1, runner.parallel), thread_name_prefix="deployer-rollback") as pool:
        for batch in taking_turns(units).batches([*committed, *sorted(held)], members):
            work: list[Callable[[], None]] = [functools.partial(unit, name, hosts) for name, hosts in members.items()
                                              if hosts[0] in batch]
            work += [functools.partial(one, host) for host in batch if host not in in_units]
            all_done([pool.submit(item) for item in work])


def held_with_units(state: FleetState, rolled_back: set[str]) -> set[str]:
    """The hosts of the units being rolled back that held the fix already: they made no commit, but restarted with
    their unit's apply, so they restart with its rollback too (a unit restarts as one), reverting nothing."""
    return {host for hosts in state.units.values() if rolled_back & set(hosts)
            for host in hosts if state.hosts[host].phase == Phase.unchanged.value}


def taking_turns(units: dict[str, Unit]) -> TakingTurns:
    """A rollback's strategy over these units: those behind one router one at a time."""
    return TakingTurns({name: unit.router for name, unit in units.items()})


def follow_up(kind: str, runs_dir: Path, original: FleetRecord, hosts: list[str], task: HostTask, *,
              parallel: int, listeners: list[Listener], cancel: FleetCancel,
              units: dict[str, list[str]] | None = None, unit_task: UnitTask | None = None,
              strategy: Strategy | None = None) -> FleetRecord:
    """A fleet run of its own (rollback, recover) over some hosts of an earlier one; both name each other.
    strategy: default every host at once."""
    strategy, units = strategy or Together(), units or {}
    state = new_state(kind, original.state.playbook, original.state.operator, hosts, strategy.batches(hosts, units),
                      parallel, of_fleet=original.state.fleet_id, units=units)
    record = FleetRecord.create(runs_dir, state)
    if kind == "rollback":
        original.state.rolled_back_by.append(state.fleet_id)
        original.save()
    runner = FleetRunner(record, strategy, parallel, cancel, listeners)
    runner.emit("fleet_start", hosts=hosts, batches=state.batches, kind=kind)
    if kind == "rollback":  # heard as an apply's own rollback is (rollout.rollback), naming the run it undoes
        runner.emit("fleet_rollback", hosts=hosts, of_fleet=original.state.fleet_id)
    runner.run(task, unit_task)
    finish(record, cancel)
    runner.emit("fleet_end", status=state.status, exit_code=state.exit_code)
    return record


def rollback_fleet(runs_dir: Path, fleet_id: str, engine_for: Callable[[str, str], Engine], *,
                   hosts: list[str] | None, force: bool, parallel: int, listeners: list[Listener],
                   cancel: FleetCancel, units: dict[str, Unit], routers: Routers | None = None,
                   allow_downtime: bool = False) -> FleetState:
    """`deployer rollback FLEET_ID`: roll back each host (or each of `hosts`) whose sub-run committed; a unit
    behind a router is out of it around its restart, and the units behind one router take turns (a unit alone
    behind its router is downtime: refused unless allow_downtime). units: the inventory's."""
    routers = routers or Routers()
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

    def unit_task(shared: Routers, name: str, fleet_id: str, report: Callable[[str, RunResult], None]) -> None:
        members = {h: str(original.state.hosts[h].run_id) for h in chosen_units[name]}
        engines = {h: tagged(engine_for(h, run_id), fleet_id, listeners) for h, run_id in members.items()}
        UnitRun(name, units[name], engines, "restore", routing=shared.for_unit(name, units[name], engines)).rollback(
            {h: read_run(runs_dir, run_id) for h, run_id in members.items()}, force=force, held=held,
            on_result=report)

    held = held_with_units(original.state, set(runs))
    chosen_units = {name: [h for h in members if h in runs or h in held]
                    for name, members in original.state.units.items() if any(h in runs for h in members)}
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
    strategy = taking_turns(units)
    hosts = [*runs, *sorted(held)]
    refuse_downtime(strategy.batches(hosts, chosen_units), chosen_units, units_behind(routers.specs, units),
                    allow_downtime)
    with routers.sharing() as shared:  # one connection to each router's host for the whole rollback
        done = follow_up("rollback", runs_dir, original, hosts, task, parallel=parallel, listeners=listeners,
                         cancel=cancel, units=chosen_units, unit_task=functools.partial(unit_task, shared),
                         strategy=strategy)
    for name, run in done.state.hosts.items():  # the original says which of its hosts were rolled back, by what
        if run.status == "successful" and name in runs:
            original.state.hosts[name].rollback_run_id = run.run_id
            original.state.hosts[name].rollback_status = "successful"
    original.save()
    return done.state


def abort_fleet(runs_dir: Path, fleet_id: str, engine_for: Callable[[str, str], Engine], *, force: bool,
                parallel: int, listeners: list[Listener], cancel: FleetCancel, units: dict[str, Unit],
                routers: Routers | None = None, allow_downtime: bool = False) -> tuple[FleetState, FleetState | None]:
    """`deployer rollout abort FLEET_ID`: a paused fleet run ends aborted, every host of it that committed rolled
    back as `deployer rollback FLEET_ID` does (None: none had). Returns the aborted run and its rollback."""
    original = FleetRecord.load(runs_dir, fleet_id)
    pause = original.state.pause
    if pause is None:
        raise ConfigError(f"fleet run {fleet_id} is not paused (it is {original.state.status}): only a paused "
                          f"rollout is aborted; roll back any fleet run with: deployer rollback {fleet_id}")
    done = None
    if any(run.committed and run.rollback_status != "successful" for run in original.state.hosts.values()):
        done = rollback_fleet(runs_dir, fleet_id, engine_for, hosts=None, force=force, parallel=parallel,
                              listeners=listeners, cancel=cancel, units=units, routers=routers,
                              allow_downtime=allow_downtime)
        original = FleetRecord.load(runs_dir, fleet_id)  # the rollback wrote what it undid into it
        pause = original.state.pause
        assert pause is not None
    state = original.state
    pause.ended, pause.ended_by = utc_now(), "abort"
    rolled = "nothing had committed" if done is None else f"rolled back by fleet run {done.fleet_id} ({done.status})"
    state.status, state.exit_code, state.ended = "aborted", done.exit_code if done is not None else 0, utc_now()
    state.error = f"aborted while paused before batch {pause.before_batch + 1}: {rolled}"
    original.save()
    event = {"type": "fleet_aborted", "fleet": fleet_id, "time": utc_now(), "batch": pause.before_batch,
             "status": "aborted", "rolled_back_by": None if done is None else done.fleet_id,
             "exit_code": state.exit_code}
    for listener in listeners:
        listener(event)
    return state, done


def drifted(state: FleetState, connect: Callable[[str], tuple[Host, Transport]]) -> dict[str, str]:
    """Before a paused fleet run goes on: each host that committed in an earlier batch and no longer holds its fix
    (its commit gone, or a file the commit changed no longer as it left it), and what differs. Read-only."""
    found = {}
    for name, run in state.hosts.items():
        if run.phase != Phase.succeeded.value or run.status != "successful" or run.rollback_status == "successful":
            continue
        commit = str(run.git_after)
        host, transport = connect(name)
        with transport:
            repo = host.repo
            touched = transport.run(touched_argv(commit), cwd=repo, timeout=60)
            if not touched.ok:
                found[name] = f"its run's commit {commit[:12]} is not in its repo ({touched.err.strip()})"
                continue
            files = names(touched.out)
            differ = transport.run(differ_argv(commit, "HEAD", files), cwd=repo, timeout=60) if files else None
            if differ is not None and (not differ.ok or names(differ.out)):
                found[name] = (f"{', '.join(names(differ.out)) or differ.err.strip()} no longer as its run "
                               f"{run.run_id} left {'it' if len(files) == 1 else 'them'} (commit {commit[:12]})")
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
