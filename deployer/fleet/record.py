"""fleet.json: what a fleet run is and was, in its own directory of the runs dir beside its hosts' sub-runs.

Each host's run dir stays where a single-host run puts it, so `runs verify`, `rollback` and `recover` work per
host; the fleet itself is `<runs>/<fleet id>/fleet.json`, naming its sub-runs and their status.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import ConfigError, LockHeld
from deployer.runlog import list_runs, new_run_id, utc_now
from deployer.runstate import Phase

FLEET = "fleet.json"
INTERRUPTED = "interrupted by a signal"  # why a fleet apply that a signal canceled is paused when resumed or aborted
CLAIM = "claim"  # beside fleet.json: held (flock) by the one apply, `rollout resume` or `abort` acting on the run
UNTOUCHED = "untouched"


@dataclass
class HostRun:
    """One host of a fleet run, as fleet.json records it."""

    host: str
    batch: int
    status: str = UNTOUCHED  # untouched | running | successful | failed | canceled
    state: str = UNTOUCHED  # untouched | running | the README's state of the sub-run, from its record
    changed: bool = False  # the sub-run left the target otherwise than it found it (Ansible's changed)
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
    approved: str | None = None  # held (an inconclusive analysis), then approved: when `rollout resume` went on

    @property
    def committed(self) -> bool:
        """The host's run left its commit on the target (not already undone by its own on_failure)."""
        return bool(self.git_after) and self.phase not in (Phase.rolled_back.value, Phase.failed_restored.value)


INCONCLUSIVE = 7  # AnalysisInconclusive's exit code: a host held for a person, never passed


@dataclass
class Paused:
    """One pause of a fleet run: before which batch, why, and how it ended (resume or abort)."""

    before_batch: int  # the next batch to start (len(batches): none left, only held hosts to approve)
    reason: str
    since: str
    ended: str | None = None
    ended_by: str | None = None  # resume | abort | timer (a timed pause that ran its time)


@dataclass
class FleetState:
    """A fleet run's record: its hosts' runs and states, batches and units, and how it ended."""
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
    pauses: list[Paused] = field(default_factory=list)
    # What `rollout resume` rebuilds the run from, wherever it is run: the playbook's and the inventory's absolute
    # paths, the playbook's sha256, the apply's options (allow_dirty, restart, allow_downtime, ...).
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def pause(self) -> Paused | None:
        """The pause the fleet run is stopped at (None: it is not paused)."""
        return self.pauses[-1] if self.pauses and self.pauses[-1].ended is None else None

    def document(self) -> dict[str, Any]:
        """fleet.json as `--json` prints it, with the hosts never touched and those held for a person's approval,
        and each host's state as the table shows it (`shown`: held, approved, or its run's state)."""
        document = {**asdict(self), "untouched": self.untouched(), "held": self.held()}
        for name, host in document["hosts"].items():
            host["shown"] = self.shown(name)
        return document

    def shown(self, host: str) -> str:
        """A host's state as a person reads it: one an inconclusive analysis holds for approval is `held` (its run
        ended failed_committed: the commit kept for a person), then `approved` once a resume went on with it."""
        run = self.hosts[host]
        if run.approved:
            return "approved"
        return "held" if host in self.held() else run.state

    def untouched(self) -> list[str]:
        return [name for name, run in self.hosts.items() if run.status == UNTOUCHED]

    def failed(self) -> list[str]:
        return [name for name, run in self.hosts.items() if run.status in ("failed", "canceled") and not run.approved]

    def held(self) -> list[str]:
        """The hosts whose analysis was inconclusive and that no one has approved yet."""
        return [name for name, run in self.hosts.items()
                if run.exit_code == INCONCLUSIVE and run.status == "failed" and not run.approved]


def paused_at_cancel(state: FleetState) -> bool:
    """A fleet apply a signal stopped inside a batch (canceled), made a paused one for `rollout resume` or `abort`:
    paused before the first batch with a host not done, each host whose run was canceled before its commit back
    to untouched (resume does it again). False when it is not such a run; a ConfigError naming the hosts whose run
    was cut past its commit (`deployer recover` first), or a unit left part done."""
    if state.status != "canceled" or state.kind != "apply" or state.pause is not None:
        return False
    done = {name for name, run in state.hosts.items() if run.status == "successful" or run.approved}
    redo = [name for name, run in state.hosts.items() if name not in done and run.status != UNTOUCHED]
    if cut := [name for name in redo if state.hosts[name].state == Phase.interrupted.value
               or state.hosts[name].committed]:
        raise ConfigError(f"fleet run {state.fleet_id} was interrupted past the commit on {', '.join(cut)}: end "
                          f"{'that run' if len(cut) == 1 else 'those runs'} first with: deployer recover "
                          f"{state.fleet_id}; a run it puts back is done again by a resume (one it keeps is not "
                          f"yet: roll the fleet run back with: deployer rollback {state.fleet_id})")
    if part := [unit for unit, hosts in state.units.items() if set(hosts) & done and not set(hosts) <= done]:
        raise ConfigError(f"fleet run {state.fleet_id}: unit {', '.join(part)} was left part done; roll back what "
                          f"was done: deployer rollback {state.fleet_id}")
    for name in redo:
        state.hosts[name] = HostRun(name, state.hosts[name].batch)
    first = min((run.batch for name, run in state.hosts.items() if name not in done), default=len(state.batches))
    again = f" ({', '.join(redo)} to do again: stopped before the commit)" if redo else ""
    state.pauses.append(Paused(first, f"{INTERRUPTED}{again}", state.ended or utc_now()))
    state.status = "paused"
    return True


def new_state(kind: str, playbook: str, operator: str, hosts: list[str], batches: list[list[str]], parallel: int,
              **extra: Any) -> FleetState:
    index = {host: number for number, batch in enumerate(batches) for host in batch}
    return FleetState(fleet_id=new_run_id(), kind=kind, playbook=playbook, operator=operator, started=utc_now(),
                      parallel=parallel, hosts={h: HostRun(h, index[h]) for h in hosts}, batches=batches, **extra)


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
        pauses = [Paused(**pause) for pause in data.pop("pauses", [])]
        return cls(runs_dir, FleetState(hosts=hosts, pauses=pauses, **data))

    def save(self) -> None:
        with self._lock:
            tmp = self.dir / f".{FLEET}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump(asdict(self.state), out, indent=1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.dir / FLEET)


@contextlib.contextmanager
def claimed(runs_dir: Path, fleet_id: str, what: str) -> Iterator[None]:
    """This process alone runs, goes on with or aborts the fleet run while in the block (what: the command, as the
    refusal names it): a second one is refused at once
    (LockHeld), before it reads or writes fleet.json, since two would each write their own view of it. An flock,
    which the kernel lets go of however the holder ends: a claim left by a dead process is simply taken."""
    fd = os.open(runs_dir / fleet_id / CLAIM, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another deployer"
            raise LockHeld(f"fleet run {fleet_id}: {holder} is running on it; only one apply, resume or abort acts "
                           f"on a fleet run at a time (see: deployer runs show {fleet_id})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        yield
    finally:
        os.close(fd)  # lets go of the flock


def is_fleet(runs_dir: Path, run_id: str) -> bool:
    return (runs_dir / run_id / FLEET).is_file()


def list_fleets(runs_dir: Path) -> list[FleetState]:
    if not runs_dir.is_dir():
        return []
    return [FleetRecord.load(runs_dir, p.name).state for p in sorted(runs_dir.iterdir()) if (p / FLEET).is_file()]


def sub_runs(runs_dir: Path, fleet_id: str) -> dict[str, str]:
    """Host -> its apply sub-run of the fleet, from the run logs themselves: a fleet killed mid-run never
    wrote the ids of the runs it had started into fleet.json."""
    found = {}
    for run in list_runs(runs_dir):
        start = run.start
        if start.get("fleet") == fleet_id and not start.get("rollback_of") and not start.get("recover_of"):
            found[str(start.get("host"))] = run.run_id
    return found
