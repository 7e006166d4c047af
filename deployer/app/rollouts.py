"""`rollout resume` and `rollout abort`: a fleet run that paused (a `pause: {}` step of its rollout, or an
inconclusive analysis under `on_inconclusive: pause`) goes on from the batch it paused before, or ends aborted
with every host that committed rolled back. Both work from any directory and after a reboot of this machine: the
paused run's record (fleet.json in the runs dir) names its playbook and inventory by absolute path, with the
playbook's sha256 (a playbook changed since is refused: resuming would ship another fix)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.outcome import FleetOutcome
from deployer.app.setting import RevertSetting, Setting, build_of, inventory_of
from deployer.app.watch import Watch, Watched, watching
from deployer.errors import ConfigError

if TYPE_CHECKING:
    from deployer.build import Build
    from deployer.fleet.record import FleetRecord, FleetState
    from deployer.steps.context import Listener, LoadedPlaybook


def source_of(playbook: str | Path, inventory: str | Path | None, **options: Any) -> dict[str, Any]:
    """What a fleet apply records for its resume: where its playbook and inventory are (absolute: a resume may
    run from any directory), the playbook's sha256, and the apply's options that shape each host's run."""
    from deployer.config.paths import find_inventory

    path = Path(playbook).resolve()
    return {"playbook": str(path), "playbook_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "inventory": str(find_inventory(str(inventory) if inventory is not None else None).resolve()),
            **options}


@dataclass(frozen=True, kw_only=True)
class ResumeOptions(Setting):
    """fleet_id: the paused fleet run (`last` or any unique beginning of its id). inventory: default the one the
    apply used (its path is recorded). lock_wait_s: how long each host's run waits for a lock another run holds
    (0: refused at once). parallel: hosts worked on at once (None: as the apply)."""

    fleet_id: str
    lock_wait_s: float = 0.0
    parallel: int | None = None


@dataclass(frozen=True, kw_only=True)
class AbortOptions(RevertSetting):
    """fleet_id: the paused fleet run to abort; force: roll back even over files changed since; allow_downtime:
    even when no other unit serves behind a router meanwhile."""

    fleet_id: str
    force: bool = False
    allow_downtime: bool = False
    parallel: int | None = None


@dataclass(frozen=True)
class Aborted:
    """A paused fleet run aborted: its record (status aborted) and the fleet rollback of what it had committed
    (None: no host had)."""

    state: FleetState
    rollback: FleetState | None

    @property
    def run_id(self) -> str:
        return self.state.fleet_id

    @property
    def exit_code(self) -> int:
        return self.rollback.exit_code or 0 if self.rollback is not None else 0

    @property
    def error(self) -> str | None:
        return self.rollback.error if self.rollback is not None else None

    @property
    def changed(self) -> bool:
        return self.rollback is not None and any(host.changed for host in self.rollback.hosts.values())

    def document(self) -> dict[str, Any]:
        return {"fleet_id": self.state.fleet_id, "status": self.state.status, "message": self.state.error,
                "rollback": self.rollback.document() if self.rollback is not None else None,
                "exit_code": self.exit_code, "error": self.error}


def fleet_named(runs_dir: Path, given: str) -> str:
    """The fleet run a person names: `last`, its id, or the beginning of exactly one fleet run's id (its own first
    sub-run begins with the same second: only fleet runs are matched). A ConfigError when it names no fleet run."""
    from deployer.app.runs import LAST, resolve
    from deployer.fleet.record import is_fleet

    if given != LAST:
        ids = sorted(p.name for p in runs_dir.iterdir() if is_fleet(runs_dir, p.name)) if runs_dir.is_dir() else []
        found = [given] if given in ids else [fleet_id for fleet_id in ids if fleet_id.startswith(given)]
        if len(found) > 1:
            raise ConfigError(f"fleet run id {given!r} is ambiguous: {', '.join(found)} begin so; give more of it")
        if found:
            return found[0]
    fleet_id = resolve(runs_dir, given)
    if not is_fleet(runs_dir, fleet_id):
        raise ConfigError(f"run {fleet_id} is not a fleet run: only a fleet run's rollout pauses")
    return fleet_id


def paused(runs_dir: Path, fleet_id: str, what: str) -> FleetRecord:
    """The fleet run, loaded (under the claim: as the last resume or abort left it); a ConfigError when it is not
    paused, for `what` (resume, abort) to act on."""
    from deployer.fleet.record import FleetRecord, paused_at_cancel

    record = FleetRecord.load(runs_dir, fleet_id)
    if paused_at_cancel(record.state):  # a signal stopped it inside a batch: goes on (or back) as a paused one
        record.save()
    if record.state.pause is None:
        other = (f"; to roll back what it did: deployer rollback {fleet_id}" if what == "abort"
                 and record.state.status != "aborted" else "")
        raise ConfigError(f"fleet run {fleet_id} is not paused (it is {record.state.status}){other}")
    return record


def resume(options: ResumeOptions, *, listener: Listener | None = None, watch: Watch | None = None) -> FleetOutcome:
    """Go on with a paused fleet run from the batch it paused before, with the playbook and inventory it was
    applied with, this process alone (a second resume or abort meanwhile is refused: LockHeld). A refusal before
    anything runs (not paused, the playbook or a file it ships changed or gone) raises ConfigError."""
    from deployer.fleet.record import claimed

    runs_dir = build_of(options, listener).runs_dir
    fleet_id = fleet_named(runs_dir, options.fleet_id)
    with claimed(runs_dir, fleet_id, "rollout resume"):
        return resumed(options, paused(runs_dir, fleet_id, "resume"), listener, watch)


def resumed(options: ResumeOptions, record: FleetRecord, listener: Listener | None,
            watch: Watch | None) -> FleetOutcome:
    """resume(), under the fleet run's claim."""
    from deployer.config import targets
    from deployer.fleet import followup
    from deployer.fleet.notify import notifying
    from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel

    runs_dir = record.dir.parent
    source = record.state.source
    if not source.get("playbook"):
        raise ConfigError(f"fleet run {record.state.fleet_id} records no playbook to resume with (made by an older "
                          "deployer)")
    playbook = Path(source["playbook"])
    try:
        now = hashlib.sha256(playbook.read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(f"the playbook of fleet run {record.state.fleet_id} cannot be read: {exc}") from None
    if now != source.get("playbook_sha256"):
        raise ConfigError(f"{playbook} changed since fleet run {record.state.fleet_id} started (sha256 "
                          f"{str(source.get('playbook_sha256'))[:12]}, now {now[:12]}): resuming would ship another "
                          "fix to the rest of the fleet; put it back, or abort the run and apply anew")
    chosen = Setting(inventory=options.inventory or source.get("inventory"), runs_dir=runs_dir,
                     accept_new_host_key=options.accept_new_host_key)
    build = build_of(chosen, listener, source.get("health_timeout_s"))
    loaded = inventory_of(chosen)
    hosts = list(record.state.hosts)
    if missing := [host for host in hosts if host not in loaded.hosts]:
        raise ConfigError(f"fleet run {record.state.fleet_id}: {', '.join(missing)} no longer in the inventory")
    if drift := followup.drifted(record.state, build.connection):
        raise ConfigError(f"fleet run {record.state.fleet_id}: a host of an earlier batch no longer holds the fix, so "
                          "going on would leave the fleet on two builds unawares: " +
                          "; ".join(f"{host}: {why}" for host, why in drift.items()) +
                          f". Put it back, or roll back what was done: deployer rollout abort {record.state.fleet_id}")
    units = targets.run_units(loaded, hosts)
    engines = build.engines(playbook, {name: loaded.hosts[name] for name in hosts},
                            allow_dirty=bool(source.get("allow_dirty")), restart=bool(source.get("restart")))
    refuse_other_fix(record.state, next(iter(engines.values())).playbook)
    for engine in engines.values():
        engine.lock_wait_s = options.lock_wait_s
    fleet = build.fleet_apply(engines, units, parallel=options.parallel or record.state.parallel or DEFAULT_PARALLEL,
                              cancel=FleetCancel(), listeners=[], inventory=loaded,
                              allow_downtime=bool(source.get("allow_downtime")))
    from deployer.config.units import unit_of_hosts

    with notifying(loaded.notify, "fleet", fleet.listeners, runs_dir=build.runs_dir, say=build.listeners,
                   units=unit_of_hosts(units)), watching(watch, Watched("fleet", hosts, fleet.cancel, fleet.listeners)):
        return FleetOutcome(fleet.resume(record))


def refuse_other_fix(state: FleetState, playbook: LoadedPlaybook) -> None:
    """A ConfigError when a file the playbook ships is not, byte for byte, what the run shipped before it paused:
    the playbook's own sha256 stays the same when a file it names is edited."""
    from deployer.fleet.apply import shipped

    if "shipped" not in state.source:  # paused by a deployer that did not record them: the playbook's sha256 only
        return
    recorded: dict[str, str] = state.source["shipped"]
    now = shipped(playbook)
    for path in sorted(set(recorded) | set(now)):
        if recorded.get(path) != now.get(path):
            was = "not shipped" if path not in recorded else f"sha256 {recorded[path][:12]}"
            is_ = "not shipped" if path not in now else f"now {now[path][:12]}"
            raise ConfigError(f"{path} changed since fleet run {state.fleet_id} started ({was}, {is_}): resuming "
                              "would ship another fix to the rest of the fleet; put it back, or abort the run and "
                              "apply anew")


def abort(options: AbortOptions, *, listener: Listener | None = None, watch: Watch | None = None) -> Aborted:
    """End a paused fleet run aborted: every host of it that committed rolled back, as `deployer rollback
    FLEET_ID` does (a unit as one, out of its router meanwhile), this process alone (as resume())."""
    from deployer.fleet.record import claimed

    runs_dir = build_of(options, listener).runs_dir
    fleet_id = fleet_named(runs_dir, options.fleet_id)
    with claimed(runs_dir, fleet_id, "rollout abort"):
        return aborted(options, paused(runs_dir, fleet_id, "abort"), listener, watch)


def aborted(options: AbortOptions, record: FleetRecord, listener: Listener | None, watch: Watch | None) -> Aborted:
    """abort(), under the fleet run's claim."""
    from deployer.config.units import every_unit, unit_of_hosts
    from deployer.fleet import followup
    from deployer.fleet.notify import notifying
    from deployer.fleet.runner import DEFAULT_PARALLEL, FleetCancel

    source = record.state.source
    chosen = RevertSetting(inventory=options.inventory or source.get("inventory"), runs_dir=record.dir.parent,
                           accept_new_host_key=options.accept_new_host_key)
    build: Build = build_of(chosen, listener, options.health_timeout_s, options.revert_checks())
    loaded = inventory_of(chosen)
    cancel = FleetCancel()
    listeners: list[Listener] = [listener] if listener is not None else []
    units = every_unit(loaded.units, loaded.hosts)
    with notifying(loaded.notify, "fleet", listeners, runs_dir=build.runs_dir, say=build.listeners,
                   units=unit_of_hosts(units)), \
            watching(watch, Watched("fleet", list(record.state.hosts), cancel, listeners)):
        state, done = followup.abort_fleet(
            build.runs_dir, record.state.fleet_id, build.sub_run, force=options.force,
            parallel=options.parallel or DEFAULT_PARALLEL, listeners=listeners, cancel=cancel,
            units=units, routers=build.routers(loaded),
            allow_downtime=options.allow_downtime)
    return Aborted(state, done)
