"""`recover`: end a cut run (killed, disconnected, disk full) in a consistent state, as a run of its own that
adopts the cut one's lock; safe to run twice. A fleet run's cut sub-runs each; a run this machine never saw, from
its host's intent record."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.outcome import FleetOutcome, RunOutcome
from deployer.app.setting import RevertSetting, build_of
from deployer.app.watch import Watch, Watched, watching
from deployer.errors import ConfigError

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.config.notify import Notify
    from deployer.run.recover import Recovered
    from deployer.steps.context import Listener


@dataclass(frozen=True, kw_only=True)
class RecoverOptions(RevertSetting):
    """run_id: the cut run or fleet run: `last` (the newest cut run, on host if given; with none: nothing to do),
    any unique beginning of an id, or a whole id this runs dir never saw (recovered from host's intent record);
    host alone: the run its intent record names. rollback: if the run's commit exists, revert it, restart and
    prove the revert."""

    run_id: str | None = None
    host: str | None = None
    rollback: bool = False
    parallel: int | None = None  # hosts of a fleet run recovered at once (None: the fleet's default)


@dataclass(frozen=True)
class RecoveredRun(RunOutcome):
    """A recover's run, and what it found of the cut one (said before its report)."""

    found: Recovered


SHOWN_CUT = 5  # cut runs named when no run was given; `runs list` marks every one


def which_run(runs_dir: Path) -> str:
    """What to give when no run was: the runs among the newest of this runs dir that never ended and whose
    process is gone (or that this machine cannot judge), each with the command that recovers it (a fleet's
    sub-run: its fleet run, whose hosts are recovered together)."""
    from deployer.run.unended import NEWEST, unended_runs

    said = "give a RUN_ID, or --host H to recover the run its intent record names"
    found = unended_runs(runs_dir, None)
    if not found:
        return f"{said} (none of the newest {NEWEST} runs in {runs_dir} was cut: each ended, or still runs)"
    lines = []
    for run, gone in found[::-1]:
        fleet = run.start.get("fleet")
        what = f"deployer recover {fleet}  # its fleet run (host run {run.run_id})" if isinstance(fleet, str) else \
            f"deployer recover {run.run_id}"
        lines.append(f"  {what}" + ("" if gone else "  # its process: another boot or machine, cannot tell"))
    shown = list(dict.fromkeys(lines))  # a fleet's hosts: its one command
    more = f" ({len(shown) - SHOWN_CUT} older: deployer runs list)" if len(shown) > SHOWN_CUT else ""
    return (f"{said}. Runs in {runs_dir} that never ended and whose process is gone, newest first{more}; add "
            f"--rollback to revert a run's commit too:\n" + "\n".join(shown[:SHOWN_CUT]))


def last_cut(runs_dir: Path, host: str | None) -> str | None:
    """What `recover last` recovers: the newest cut run, not the newest run: after a cut apply, the apply run again
    to be refused, or the recover that was cut, is newer. One whose process is known gone before one this machine
    cannot judge; a fleet's sub-run: its fleet run, unless a host is given (then that host's run alone). None when
    none of the newest runs was cut."""
    from deployer.run.unended import unended_runs
    from deployer.runlog import is_run_id

    found = sorted(unended_runs(runs_dir, host), key=lambda one: one[1])  # stable: newest last within each
    if not found:
        return None
    run, _ = found[-1]
    fleet = run.start.get("fleet")
    return fleet if host is None and isinstance(fleet, str) and is_run_id(fleet) else run.run_id


@dataclass(frozen=True)
class NothingToRecover:
    """Nothing was left to end (every record and log ended): exit 0."""

    message: str
    ids: dict[str, str | None] = field(default_factory=dict)
    exit_code: int = 0
    changed: bool = False

    def document(self) -> dict[str, Any]:
        return {**self.ids, "exit_code": 0, "error": None, "message": self.message}


def recover(options: RecoverOptions, *, listener: Listener | None = None,
            watch: Watch | None = None) -> RecoveredRun | FleetOutcome | NothingToRecover:
    """Recover as options say. A refusal before the recover starts (no such run, a config error) raises its
    DeployerError; once it started, its outcome says how it went."""
    from deployer import runlog
    from deployer.app.runs import LAST, UnknownRun, resolve
    from deployer.fleet.record import is_fleet
    from deployer.run import recover as recovery

    build = build_of(options, listener, options.health_timeout_s, options.revert_checks())
    if not options.run_id and not options.host:
        raise ConfigError(which_run(build.runs_dir))
    runs_path, run_id, host = build.runs_dir, options.run_id, options.host
    if run_id == LAST and (newest_cut := last_cut(runs_path, host)) is not None:
        run_id = newest_cut
    elif run_id == LAST:
        from deployer.run.unended import NEWEST

        newest = resolve(runs_path, LAST, host)  # no run at all: the usage error every `last` gives
        on = f" on {host}" if host is not None else ""
        if options.rollback:  # asked to revert, and nothing of it would happen: never a quiet exit 0
            raise ConfigError(f"none of the newest {NEWEST} runs{on} in {runs_path} was cut: nothing to recover. To "
                              f"undo a run's commit: deployer rollback last{f' --host {host}' if host else ''}")
        return NothingToRecover(f"none of the newest {NEWEST} runs{on} in {runs_path} was cut (the newest, "
                                f"{newest}, ended): nothing to recover", {"host": host, "run_id": None})
    if run_id:
        with contextlib.suppress(UnknownRun):  # a run this runs dir never saw: its host's intent record may name it
            run_id = resolve(runs_path, run_id, host)
    if run_id and is_fleet(runs_path, run_id):
        return recover_fleet(build, options, run_id, listener, watch)
    if run_id and (origin := recovery.unfinished_origin(runs_path, run_id)) is not None:
        # A recover cut in turn holds, at most, the lock it took over for that run: that run is what to finish.
        if listener is not None:
            listener({"type": "notice", "message": f"run {run_id} is a recover of run {origin}, which is not "
                                                   f"finished: recovering run {origin}"})
        run_id = origin
    if run_id and (runs_path / run_id / runlog.EVENTS).is_file():
        engine = build.to_recover(runlog.read_run(runs_path, run_id), host)
    elif host:
        engine = build.bare(host)
        run_id = run_id or recovery.pending_run(engine)
        if run_id is None:  # as `recover RUN` says of a run with nothing left: exit 0
            return NothingToRecover(f"{host}: {recovery.NOTHING}", {"host": host, "run_id": None})
        if (runs_path / run_id / runlog.EVENTS).is_file():
            # The run the target names was made here: recovered with its own playbook (its restart and its checks,
            # the drain too), as `recover RUN_ID` would, not with the bare restart another machine must make do with.
            engine = build.to_recover(runlog.read_run(runs_path, run_id), host)
    else:
        raise ConfigError(f"no run {run_id!r} in {runs_path}: pass --host H to recover it from the target's "
                          "intent record")
    from deployer.app.rollbacks import watched_run

    cut: str = run_id
    result, found = watched_run(build, engine, notify_of(options), watch,
                                lambda: recovery.recover(engine, cut, rollback=options.rollback))
    return RecoveredRun(result, found)


def notify_of(options: RecoverOptions) -> Notify | None:
    """The inventory's notify: a recover is heard as an apply is. Read without listing a selector's pods: a
    recover names its hosts itself."""
    from deployer.config.models import load_inventory
    from deployer.config.paths import find_inventory

    return load_inventory(find_inventory(str(options.inventory) if options.inventory is not None else None)).notify


def recover_fleet(build: Build, options: RecoverOptions, fleet_id: str, listener: Listener | None,
                  watch: Watch | None) -> FleetOutcome | NothingToRecover:
    from deployer.fleet import followup
    from deployer.fleet.record import FleetRecord, claimed
    from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel

    runs_path = build.runs_dir
    if not followup.cut_sub_runs(runs_path, fleet_id):  # as a single run with nothing left says: exit 0
        return NothingToRecover(f"fleet run {fleet_id}: nothing to recover (every host's record and log ended)",
                                {"fleet_id": fleet_id})
    from deployer.fleet.notify import notifying

    cancel = FleetCancel()
    listeners: list[Listener] = [listener] if listener is not None else []
    # Under the fleet run's claim: a cut run is recovered only once nothing else (an apply or resume whose host
    # runs only look cut because they are still going) acts on the fleet run.
    with claimed(runs_path, fleet_id, "deployer recover"), \
            notifying(notify_of(options), "fleet", listeners, runs_dir=runs_path, say=build.listeners), \
            watching(watch, Watched("fleet", list(FleetRecord.load(runs_path, fleet_id).state.hosts), cancel,
                                    listeners)):
        return FleetOutcome(followup.recover_fleet(runs_path, fleet_id, build.sub_run, rollback=options.rollback,
                                                   parallel=options.parallel or DEFAULT_PARALLEL, listeners=listeners,
                                                   cancel=cancel))
