"""Plans and runs a playbook on one host: preflight, the fail-fast chain, and undo on failure."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import itertools
import os
import posixpath
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deployer
from deployer import diffs
from deployer.agent.client import Pending
from deployer.agent.protocol import Get, sha256_hex
from deployer.command import Masker
from deployer.config.models import Host
from deployer.errors import (
    ConfigError,
    DeployerError,
    Interrupted,
    LockHeld,
    RecordRefused,
    RequestSkipped,
    RollbackFailed,
    StepFailed,
    TransportError,
    VerificationFailed,
)
from deployer.run import intent
from deployer.run.gitops import GIT_DIR, HEAD
from deployer.run.lock import DeployLock, LockState, force_release, read_state
from deployer.run.preflight import Reads, lazy_projection, preflight, projected_stat, refuse_unready, send_reads
from deployer.run.restore import restore_files
from deployer.run.state import (
    PAST_COMMIT,
    FileRecord,
    Phase,
    RunRecord,
    RunRecordError,
    RunState,
    ensure_headroom,
    git_blob_id,
)
from deployer.runlog import RunLogWriter, new_run_id, utc_now
from deployer.steps import services
from deployer.steps.base import Action, Effect, Step
from deployer.steps.context import CancelToken, Context, EventBus, Listener, LoadedPlaybook, Submitted
from deployer.steps.git import EndNote, end_note_argv, log_anchor, revert_files, trailers
from deployer.transport.base import Transport

Connector = Callable[[EventBus], Transport]


def operator_id() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def release(lock: DeployLock | None, transport: Transport, bus: EventBus, settled: Context | None,
            sent: Released | None = None, note: Note | None = None) -> tuple[str | None, bool]:
    """Clear the intent record (once the run is settled), release the lock, write the end note behind them
    (when given) and close the connection: one round trip.

    `sent`: the check of a release already sent behind the run's last batch (skipped when that failed).
    Never raises; says what it had to leave, and whether the end note was written. An interrupted run keeps
    its intent record on the target: it stops every later apply until `deployer recover` has ended it."""
    left, noted = None, False
    if lock is not None:
        try:
            done = _done(sent)
            noted = send_release(lock, transport, settled.git_dir if settled else None, note=note)() \
                if done is None else done
            bus.emit("lock_released", path=lock.path)
        except DeployerError as exc:
            if settled is not None and isinstance(exc, TransportError):
                # Sent, and its reply lost with the link: the release may well have run. Say that, no more.
                bus.emit("lock_release_unknown", path=lock.path, error=str(exc))
                left = (f"The release of the deploy lock {lock.path} and the intent record was sent, but its reply "
                        f"was lost ({exc}): whether they are still on the target is unknown. Check with: "
                        f"deployer lock status --host {bus.host}")
            else:
                bus.emit("lock_release_failed", path=lock.path, error=str(exc))
                # An unsettled run's lock is recover's to take over, with its intent record; a settled one's is
                # spare.
                left = (f"The deploy lock {lock.path} (and the intent record) stay on the target ({exc}); "
                        f"deployer recover {lock.info['run_id']} takes them over once this run's heartbeat is "
                        "stale" if settled is None else
                        f"The deploy lock {lock.path} was left on the target ({exc}); once the target is checked, "
                        f"remove it with: deployer lock release --host {bus.host} --force")
    with contextlib.suppress(Exception):
        transport.close()
    return left, noted


Note = tuple[tuple[str, ...], str]  # the end note's argv and the repo it runs in
Released = Callable[[], bool]  # raises if the release failed or was skipped; says whether the end note was written


def send_release(lock: DeployLock, transport: Transport, git_dir: str | None,
                 after: Pending[Any] | None = None, note: Note | None = None) -> Released:
    """Send the intent record's removal (with a git dir: the run is settled), the lock's release and the end
    note, to run only if `after` succeeded when given. The note runs only if the lock was removed, so a note
    on the target says the run ended as it claims; the returned check raises if the release failed or was
    skipped, and says whether the note was written."""
    cleared = intent.remove(transport, git_dir, after=after) if git_dir else None
    noting: list[Pending[Any]] = []
    then = None if note is None else (lambda removed: noting.append(
        transport.submit_run(note[0], cwd=note[1], timeout=30, after=removed)))
    released = lock.send_release(after=after, then=then)

    def check() -> bool:
        released()
        if cleared is not None:
            cleared()
        return bool(noting) and noting[0].result().ok
    return check


def _done(sent: Released | None) -> bool | None:
    """Whether a release sent behind the run's last batch wrote its end note (None: none sent, or the agent
    skipped it)."""
    if sent is None:
        return None
    try:
        return sent()
    except RequestSkipped:
        return None


def target_state(ctx: Context) -> str:
    """Where the target stands now, read from it, for a message that must say what was left."""
    try:
        head = ctx.run(HEAD, timeout=30).out.strip() or "unknown"
        notes = {ctx.git_before: "the commit before the run", ctx.git_after: "this run's commit",
                 ctx.facts.rollback_commit: "the revert commit"}
        parts = [f"Target now: HEAD {head[:12]} ({notes.get(head, 'not made by this run')})"]
        for name in ctx.host.services:
            pid = services.manager_for(ctx, name).pid()
            parts.append(f"{name} {'pid ' + str(pid) if pid else 'not running'}")
    except DeployerError as exc:
        return f"The target's state could not be read: {exc}"
    return ", ".join(parts) + "."


def stop_running(ctx: Context) -> None:
    """A step stopped by a second signal may have left its command running on the target: kill it, so the
    undo that follows is not queued behind it. A link that is gone fails the undo itself, with its message."""
    with contextlib.suppress(DeployerError):
        if killed := ctx.transport.cancel():
            ctx.emit("commands_killed", count=killed)


def as_failure(exc: BaseException) -> DeployerError:
    """Every way a run can stop, as a typed failure; a bug in deployer still restores the target."""
    if isinstance(exc, DeployerError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted("interrupted")
    return DeployerError(f"internal error: {type(exc).__name__}: {exc} (please report this)")


def mask_action(masker: Masker, action: Action) -> Action:
    return action.mapped(masker)


@dataclass
class FilePlan:
    dest: str
    diff: str
    stat: diffs.FileStat
    exists: bool


@dataclass
class PlanReport:
    host_name: str
    repo: str
    head: str
    files: list[FilePlan]
    stat: diffs.DiffStat
    judged: dict[str, list[str]]  # what steps judge before the target is touched ("bounds", "compile"): problems
    steps: list[tuple[str, list[Action]]]
    lock: LockState | None
    dirty: list[str] = field(default_factory=list)

    @property
    def bounds(self) -> list[str] | None:
        """None: the playbook bounds nothing; [] within bounds."""
        return self.judged.get("bounds")

    @property
    def failed_here(self) -> list[str]:
        """Every problem the plan found, each under what judged it: what makes `plan` exit 1."""
        return [f"{label}: FAIL — {'; '.join(problems)}" for label, problems in self.judged.items() if problems]


# The phase a step's effect moves the run into before the step runs, and the one it leaves it in after.
ENTER = {Effect.changes_files: Phase.changing, Effect.commits: Phase.committing, Effect.restarts: Phase.restarting,
         Effect.verifies: Phase.verifying, Effect.loads: Phase.verifying}
LEAVE = {Effect.changes_files: Phase.changed, Effect.commits: Phase.committed}


def run_trailer(run_id: str) -> str:
    return trailers(Deployer_Run=run_id)


class LogSink:
    """The run log as a listener: a failed write (a full disk) stops the run at its next safe point.

    Raising from inside a step would skip the restore; so the failure is handed to the cancel token,
    the run stops, restores the target, and says why. Later events are dropped, not half-written."""

    def __init__(self, log: RunLogWriter, cancel: CancelToken) -> None:
        self.log, self.cancel = log, cancel
        self.broken: OSError | None = None

    def resume(self) -> None:
        """Write again (the run's end): a disk that was full may have room by now."""
        self.broken = None

    def __call__(self, event: dict[str, Any]) -> None:
        if self.broken is not None:
            return
        try:
            self.log.write(event)
        except OSError as exc:
            self.broken = exc
            self.cancel.cancel("the run log could not be written", DeployerError(
                f"the run log {self.log.dir} could not be written ({exc.strerror or exc}); the run stopped at "
                "the next safe point"))


@dataclass
class RunResult:
    run_id: str
    run_dir: Path
    status: str  # successful | failed | canceled
    exit_code: int
    error: str | None
    git_before: str | None
    git_after: str | None
    facts: dict[str, Any]
    phase: str = Phase.preparing.value
    warning: str | None = None  # what a run that ended as its record says could not make sure of (the release)


@dataclass
class Engine:
    host_name: str
    host: Host
    connect: Connector
    playbook: LoadedPlaybook
    steps: list[Step]
    runs_dir: Path
    listeners: list[Listener] = field(default_factory=list)
    cancel: CancelToken = field(default_factory=CancelToken)
    allow_dirty: bool = False
    operator: str = field(default_factory=operator_id)
    adopt_lock_of: str | None = None  # recover: the cut run whose lock (and intent record) this run takes over
    run_tags: dict[str, Any] = field(default_factory=dict)  # added to run_start (a fleet run names itself)
    _log: RunLogWriter | None = field(default=None, init=False, repr=False)  # the run's log while it runs
    _reads: Reads | None = field(default=None, init=False, repr=False)  # preflight's, sent with the lock
    _intent: Pending[Any] | None = field(default=None, init=False, repr=False)  # the intent record, sent ahead
    _held: DeployLock | None = field(default=None, init=False, repr=False)  # the run's lock, once taken
    _released: Released | None = field(default=None, init=False, repr=False)  # see _close_behind
    # The settled phase the target holds that the run's record here could not be moved to (a full disk).
    _unrecorded: tuple[Phase, dict[str, Any], RunRecordError] | None = field(default=None, init=False, repr=False)

    def new_bus(self) -> EventBus:
        bus = EventBus(Masker(self.host.secrets()), self.host_name)
        bus.listeners.extend(self.listeners)
        return bus

    def context(self, run_id: str, bus: EventBus, transport: Transport) -> Context:
        ctx = Context(run_id=run_id, host_name=self.host_name, host=self.host, transport=transport,
                      playbook=self.playbook, bus=bus, cancel=self.cancel)
        ctx.facts.operator = self.operator
        return ctx

    # -- dry run ---------------------------------------------------------------------------------------

    def check_host(self) -> None:
        """Everything the steps need from the inventory host, before anything connects."""
        problems = [f"{s.where}: {s.name}: {problem}" for s in self.steps
                    if (problem := s.check_host(self.host_name, self.host))]
        if problems:
            raise ConfigError("\n".join(problems))

    def plan(self) -> PlanReport:
        """Only reads on the target: what apply would change, count and run."""
        self.check_host()
        bus = self.new_bus()
        with self.connect(bus) as transport:
            ctx = self.context("<dry-run>", bus, transport)
            bus.step = "preflight"
            head = preflight(ctx, allow_dirty=True)
            files = [FilePlan(c.dest, bus.masker(diffs.unified(c.dest, head[c.dest], c.new)),
                              diffs.numstat(c.dest, head[c.dest], c.new), c.old is not None) for c in ctx.changes]
            stat = projected_stat(ctx, head, {f.dest: f.stat for f in files})
            judged = {s.judges: s.judge_here(ctx, lambda: stat) for s in self.steps if s.judges}
            assert ctx.git_dir is not None and ctx.git_before is not None
            lock = read_state(transport, ctx.git_dir, self.host.lock_ttl_s, self.host_name)
            steps = [(s.name, [mask_action(bus.masker, a) for a in s.plan(ctx)]) for s in self.steps]
            return PlanReport(self.host_name, ctx.repo, ctx.git_before, files, stat, judged, steps, lock,
                              list(ctx.facts.dirty))

    # -- the run ---------------------------------------------------------------------------------------

    def apply(self) -> RunResult:
        self.check_host()

        def body(ctx: Context, log: RunLogWriter) -> None:
            self.prepare(ctx, log)
            self.run_steps(ctx)
        # A patch is applied here to copies of the target's files, read one by one: no reads to send ahead.
        return self.execute(body, reads=self.playbook.patch is None)

    def prepare(self, ctx: Context, log: RunLogWriter) -> None:
        """Preflight, and the pre-run bytes kept here: what every apply does before its first step."""
        sent, self._reads = self._reads, None
        head = preflight(ctx, allow_dirty=self.allow_dirty, sent=sent)
        refuse_unready(ctx, self.steps)
        self._judge_here(ctx, lazy_projection(ctx, head))
        ensure_headroom(self.runs_dir, sum(len(c.new) + len(c.old or b"") for c in ctx.changes))
        self._keep_before(ctx)
        log.attach("shipped.diff", ctx.bus.masker("".join(
            diffs.unified(c.dest, c.old, c.new) for c in ctx.changes)).encode())
        ctx.bus.step = None
        ctx.emit("status", status="running")

    def _judge_here(self, ctx: Context, projected: Callable[[], diffs.DiffStat]) -> None:
        """What can fail without the target fails before the run touches it (a baseline's storm included),
        in the playbook's own words: the first such step is named as the failed one."""
        for step in self.steps:
            if problems := step.judge_here(ctx, projected):
                ctx.emit("judged_here", judged=step.judges, of_step=step.name, problems=problems)
                failure = StepFailed(step.name, f"{'; '.join(problems)} (judged before the run touched the "
                                     "target: nothing on it was changed)")
                if step.where:
                    failure.args = (f"{step.where}: {failure}",)
                raise failure

    def _keep_before(self, ctx: Context) -> None:
        """The pre-run bytes, owner and mode of every dest, on disk here before anything changes there."""
        record = ctx.record
        assert record is not None
        files = [FileRecord(
            dest=change.dest, path=change.path, existed=change.old is not None, tracked=change.tracked,
            sha256=None if change.old is None else sha256_hex(change.old), new_sha256=sha256_hex(change.new),
            new_blob=git_blob_id(change.new), mode=change.mode, uid=change.uid, gid=change.gid,
            new_dirs=change.new_dirs, before=None if change.old is None else record.keep_before(index, change.old))
            for index, change in enumerate(ctx.changes)]
        record.update(files=files, git_before=ctx.git_before, git_dir=ctx.git_dir)

    def execute(self, body: Callable[[Context, RunLogWriter], None], *, reads: bool = False,
                **start: Any) -> RunResult:
        """One run: its log, one connection, the lock, the body, and a run_end whatever happens.

        reads: the body starts with prepare(), whose preflight reads are sent with the lock (one round trip)."""
        run_id = new_run_id()
        self._held, self._released, self._unrecorded = None, None, None
        ensure_headroom(self.runs_dir, 0)
        log = self._log = RunLogWriter(self.runs_dir, run_id)
        record = RunRecord(log.dir, RunState(run_id=run_id, host=self.host_name, operator=self.operator,
                                             kind="rollback" if start.get("rollback_of") else
                                             "recover" if start.get("recover_of") else "apply",
                                             repo=self.host.repo, trailer=run_trailer(run_id),
                                             rollback_of=start.get("rollback_of")), before_write=log.sync)
        record.advance(Phase.preparing, utc_now())
        bus = self.new_bus()
        sink = LogSink(log, self.cancel)
        bus.listeners.insert(0, sink)
        bus.emit("run_start", status="starting", operator=self.operator, version=deployer.__version__,
                 playbook=str(self.playbook.path), playbook_name=self.playbook.model.name,
                 playbook_sha256=hashlib.sha256(self.playbook.raw).hexdigest(),
                 steps=[s.describe() for s in self.steps], on_failure=self.playbook.model.on_failure,
                 **self.run_tags, **start)
        # The copy is masked like everything else written here; playbook_sha256 names the original.
        log.attach("playbook.yaml", bus.masker(self.playbook.raw.decode("utf-8", "replace")).encode())
        ctx: Context | None = None
        lock: DeployLock | None = None
        left: str | None = None
        status, exit_code, error, warning = "successful", 0, None, None
        ended = ("successful", 0)  # what the body ended with: the end note's claim
        noted = False
        try:
            transport = self.connect(bus)
            try:
                bus.emit("connected", transport=vars(transport.info))
                ctx = self.context(run_id, bus, transport)
                ctx.record = record
                bus.step = "preflight"
                lock = self._lock(ctx, reads)
                self._held = lock
                body(ctx, log)
                self._end(record, Phase.rolled_back if record.state.kind == "rollback" else Phase.succeeded)
            except (Exception, KeyboardInterrupt) as exc:
                failed = as_failure(exc)
                self._settle(record, failed)
                ended = ("canceled" if isinstance(failed, Interrupted) else "failed", failed.exit_code)
                if isinstance(exc, RecordRefused) and lock is not None:
                    bus.emit("lock_kept", path=lock.path)
                    lock = None  # left with the refused record, as its message says
                raise
            finally:
                # A lost connection fails the release too; that must not replace the body's failure.
                # A recover that did not end its cut run leaves that run's intent record for the next try.
                settled = (record.state.terminal or self._unrecorded is not None) and not (
                    self.adopt_lock_of is not None and record.state.phase != Phase.succeeded)
                held = self._unrecorded[0] if self._unrecorded else record.state.phase  # what the target holds
                note = self._end_note(ctx if settled else None, log, EndNote(log.sha256(), *ended, held.value))
                left, noted = release(lock, transport, bus, ctx if settled else None, self._released, note)
            if left and not settled:
                raise DeployerError(left)
            warning = left  # the run ended as its record says; only its release is in doubt
        except (Exception, KeyboardInterrupt) as exc:
            failure = as_failure(exc)
            self._settle(record, failure)  # a failure to connect never reached the inner handler
            status = "canceled" if isinstance(failure, Interrupted) else "failed"
            exit_code, error = failure.exit_code, bus.masker(str(failure))
            if left and left not in error:
                error += "\n" + left
            if sink.broken is not None and "run log" not in error:
                error += f"\nThe run log could not be written: {sink.broken.strerror or sink.broken}"
        finally:
            bus.step = None
            if unrecorded := self._record_end(record, sink):
                if error:
                    error += f"\n{unrecorded}"
                else:
                    warning = f"{warning}\n{unrecorded}" if warning else unrecorded
            commits = {"before": ctx.git_before if ctx else None, "after": ctx.git_after if ctx else None}
            facts = ctx.facts.record() if ctx else {}
            phase = self._unrecorded[0] if self._unrecorded else record.state.phase  # what the target holds
            anchored = {"anchor": "notes"} if noted else {}  # the end note is on the target: verify requires it
            bus.emit("run_end", status=status, exit_code=exit_code, error=error, git=commits, phase=phase,
                     files=facts.get("files") or (ctx.dests if ctx else []), facts=facts, **anchored)
            log.close()
            self._log = None
        return RunResult(run_id, log.dir, status, exit_code, error, commits["before"], commits["after"], facts,
                         phase.value, warning)

    @staticmethod
    def _end_note(ctx: Context | None, log: RunLogWriter, note: EndNote, commit: str | None = None) -> Note | None:
        """The end note for the newest commit this run made (None: it made none, or it is not settled). Its log
        hash is of the log so far, on disk first: the note may name these bytes. Recover's git_after is the cut
        run's commit, not its own: recover writes no note (see the README's run log section)."""
        if ctx is None or ctx.record is None:
            return None
        kind = ctx.record.state.kind
        made = commit or (ctx.facts.rollback_commit if kind == "apply" else None) or \
            (ctx.git_after if kind != "recover" else None)
        if not made:
            return None
        log.sync()
        return end_note_argv(ctx, made, note), ctx.repo

    def _end(self, record: RunRecord, phase: Phase, **fields: Any) -> None:
        """Settle the record in the phase the target now holds. A record that cannot be written here (a full
        disk) leaves the target no less consistent: the run clears its intent record all the same, and tries
        the record again at its end."""
        try:
            record.advance(phase, utc_now(), **fields)
        except RunRecordError as exc:
            self._unrecorded = (phase, fields, exc)

    def _record_end(self, record: RunRecord, sink: LogSink) -> str | None:
        """At the run's end, the record and the log get their end if there is room again; else what to do."""
        sink.resume()  # the run_end is worth a try: a full disk may have room again
        if self._unrecorded is None:
            return None
        phase, fields, exc = self._unrecorded
        with contextlib.suppress(RunRecordError):
            record.advance(phase, utc_now(), **fields)
            self._unrecorded = None
            return None
        return (f"The target is consistent ({phase.value}), but {exc}: the record here still says "
                f"{record.state.phase.value}. Once the runs dir has room, `deployer recover {record.state.run_id}` "
                "ends the record and the log")

    def _settle(self, record: RunRecord, failure: DeployerError) -> None:
        """A run that stops leaves a phase that says what the target holds; never a forward phase."""
        if record.state.terminal or record.state.phase == Phase.interrupted or self._unrecorded is not None:
            return
        if record.state.phase in (Phase.preparing, Phase.locked):  # nothing was changed
            self._end(record, Phase.failed_restored, error=str(failure))
        else:  # the step's own handling did not get to say: the target may be in between
            # Unwritable (a full disk), the record keeps its forward phase: it too says the target may be there.
            with contextlib.suppress(RunRecordError):
                record.advance(Phase.interrupted, utc_now(), error=str(failure))

    def _lock(self, ctx: Context, reads: bool = False) -> DeployLock:
        """Take the lock and read the intent record (and, with `reads`, send preflight's reads right behind
        the take: the agent runs them once the lock is ours). The git dir is almost always <repo>/.git: the
        lock is taken there in the same round trip that asks git, and taken again only when git says otherwise."""
        guess = posixpath.join(ctx.repo, ".git")
        found = ctx.submit(GIT_DIR, timeout=30)
        behind = (lambda: self._send_reads(ctx)) if reads else None
        try:
            try:
                lock, raw = self._take(ctx, guess, behind)
            except DeployerError:
                if self._git_dir(ctx, found) == guess:
                    raise
                lock = None
            git_dir = self._git_dir(ctx, found)
            if lock is not None and git_dir != guess:
                lock.release()
                lock = None
            if lock is None:  # the reads sent behind the wrong lock are sent again behind the right one
                lock, raw = self._take(ctx, git_dir, behind)
        except BaseException:
            self._drop_reads()
            raise
        ctx.git_dir = git_dir
        ctx.emit("lock_acquired", path=lock.path, ttl_s=lock.ttl_s, removed_strays=lock.removed)
        try:
            pending = intent.parse(raw, git_dir, self.host_name)
        except DeployerError as exc:
            if isinstance(exc, RecordRefused) and self.adopt_lock_of is not None:
                raise  # recover keeps the lock with the record it refuses: a person looks at both
            lock.release()
            raise LockHeld(str(exc)) from None
        if pending is not None and pending.run_id not in (ctx.run_id, self.adopt_lock_of):
            lock.release()
            raise LockHeld(f"run {pending.run_id} of {pending.operator} was interrupted on {self.host_name} "
                           f"(started {pending.started}); nothing was changed. End it first with: "
                           f"deployer recover {pending.run_id} --host {self.host_name}")
        return lock

    @staticmethod
    def _git_dir(ctx: Context, found: Submitted) -> str:
        return found.check(f"{ctx.repo} is not a git checkout on the target").out.strip()

    def _send_reads(self, ctx: Context) -> None:
        self._drop_reads()
        self._reads = send_reads(ctx)

    def _drop_reads(self) -> None:
        """Reads sent behind a lock that was not taken ran all the same: log them, use nothing."""
        if self._reads is not None:
            self._reads.drain()
            self._reads = None

    def _take(self, ctx: Context, git_dir: str,
              behind: Callable[[], None] | None = None) -> tuple[DeployLock, bytes | None]:
        lock = DeployLock(ctx.transport, git_dir, {"run_id": ctx.run_id, "operator": self.operator,
                                                   "pid": os.getpid(), "host": self.host_name}, self.host.lock_ttl_s)
        assert ctx.record is not None
        ctx.record.advance(Phase.locked, utc_now(), git_dir=git_dir)
        # The intent record is read right after the take, in the same round trip.
        then = [Get(intent.path_in(git_dir))]
        try:
            raw, = lock.acquire(then, behind)
        except LockHeld as held:
            if not self._adopt(ctx, git_dir):
                raise LockHeld(f"{held}{self._interrupted_hint(ctx, git_dir)}") from None
            raw, = lock.acquire(then, behind)
        return lock, raw

    def _adopt(self, ctx: Context, git_dir: str) -> bool:
        """Recover takes over the lock of the run it recovers, once that run is surely gone: its heartbeat is
        older than its TTL. Nothing else counts: the pid in the lock's info is the target's word, not proof."""
        state = read_state(ctx.transport, git_dir, self.host.lock_ttl_s, self.host_name)
        if state is None or self.adopt_lock_of is None or state.info.get("run_id") != self.adopt_lock_of:
            return False
        if not state.stale:
            raise LockHeld(f"run {self.adopt_lock_of} still holds the lock and its heartbeat is fresh "
                           f"({state.describe()}); recover it once it has stopped (its heartbeat goes stale "
                           f"{state.ttl_s:.0f}s after its last beat)")
        force_release(ctx.transport, git_dir)
        ctx.emit("lock_adopted", of_run=self.adopt_lock_of, holder=state.info)
        return True

    def _interrupted_hint(self, ctx: Context, git_dir: str) -> str:
        """Recover is the way out of a held lock whose run is gone (it refuses to take a live one)."""
        holder = None
        with contextlib.suppress(DeployerError):
            pending = intent.read(ctx.transport, git_dir, self.host_name)
            state = read_state(ctx.transport, git_dir, self.host.lock_ttl_s, self.host_name)
            holder = pending.run_id if pending is not None else state.info.get("run_id") if state else None
        if not holder:
            return ""
        return (f"\nIf run {holder} is gone (killed, disconnected), end it with: "
                f"deployer recover {holder} --host {self.host_name}")

    def _write_intent(self, ctx: Context) -> None:
        """Sent with the first change, ahead of it: the agent lets no change through unless it holds."""
        record = ctx.record
        assert record is not None and ctx.git_dir is not None and ctx.git_before is not None
        self._intent = intent.write_ahead(ctx.transport, ctx.git_dir, intent.Intent(
            run_id=ctx.run_id, operator=self.operator, host=self.host_name, started=record.state.history[0].time,
            head_before=ctx.git_before, trailer=run_trailer(ctx.run_id), files=record.state.files))

    def _intent_failure(self, ctx: Context) -> DeployerError | None:
        """Wait for the intent record sent ahead of the first change (None: it is on the target)."""
        sent, self._intent = self._intent, None
        if sent is None:
            return None
        ctx.transport.lift_gate()
        assert ctx.git_dir is not None
        try:
            sent.result()
        except DeployerError as exc:
            return DeployerError(f"cannot record the run's intent on the target ({exc}); the agent let none of "
                                 "the run's changes through")
        ctx.emit("intent_recorded", path=intent.path_in(ctx.git_dir))
        return None

    def run_step(self, ctx: Context, step: Step, name: str) -> str:
        """One step between step_start and step_end events; a failure comes out typed, naming the step's line."""
        ctx.bus.step = name
        started = time.monotonic()
        self._note_log_sha256(ctx)  # a commit made by this step anchors the log up to its step_start
        try:
            ctx.emit("step_start", kind=step.kind)
            ctx.cancel.check()
            summary = step.run(ctx)
        except (Exception, KeyboardInterrupt) as exc:
            failure = as_failure(exc)
            if step.where and not isinstance(failure, Interrupted):
                # The playbook line to look at; the typed error and its exit code stay as they are.
                failure.args = (f"{step.where}: {failure}",)
            ctx.emit("step_end", status="canceled" if isinstance(failure, Interrupted) else "failed",
                     duration_s=round(time.monotonic() - started, 3), error=ctx.bus.masker(str(failure)))
            raise failure from None
        finally:
            ctx.facts.log_sha256 = None
        ctx.emit("step_end", status="ok", duration_s=round(time.monotonic() - started, 3), summary=summary)
        return summary

    def _note_log_sha256(self, ctx: Context) -> None:
        if self._log is not None:
            self._log.sync()  # a trailer may name these bytes: on disk first
            ctx.facts.log_sha256 = self._log.sha256()

    def run_steps(self, ctx: Context, steps: list[Step] | None = None) -> None:
        """The chain (or a part of it: a unit runs its hosts' chains in phases); each step's declared effect
        moves the run's phase, written before the step acts."""
        record = ctx.record
        assert record is not None
        chain = self.steps if steps is None else steps
        for index, step in enumerate(chain):
            # The read-only steps right after a change may send their commands with it: one round trip.
            ahead = list(itertools.takewhile(lambda s: s.effect == Effect.observes, chain[index + 1:]))
            ctx.on_sent = lambda ahead=ahead: ctx.prefetched.update({s.name: s.prefetch(ctx) for s in ahead})
            if steps is None and index == len(chain) - 1:
                self._close_behind(ctx, step)
            # The phase moves and the step run under one handler: a forced stop (a second signal) between
            # steps must undo the target just as one inside a step does.
            try:
                self.enter(ctx, step.effect)
                self.run_step(ctx, step, step.name)
                if unrecorded := self._intent_failure(ctx):
                    raise unrecorded
                if step.effect in LEAVE:
                    record.advance(LEAVE[step.effect], utc_now(), git_after=ctx.git_after)
            except (DeployerError, KeyboardInterrupt) as exc:
                failure = as_failure(exc)
                ctx.bus.step = None
                if isinstance(failure, Interrupted):  # a forced stop: what still runs is killed, not waited for
                    stop_running(ctx)
                self._drain_prefetched(ctx)
                failure = self._intent_failure(ctx) or failure
                if isinstance(failure, RunRecordError) and self._released_with_note():
                    # The commit was the last step and the release behind it ran with the end note: the target
                    # holds a finished run, as the note says. Only the record here is behind; execute says so.
                    self._end(record, Phase.succeeded, git_after=ctx.git_after)
                    return
                # The run's commit is on the target (the record may have failed to say so: a full disk).
                if record.state.git_after is not None or ctx.git_after is not None:
                    raise self._after_commit_failure(ctx, failure) from None
                self.restore(ctx, failure)
                raise failure from None
            finally:
                ctx.on_sent = None

    def _released_with_note(self) -> bool:
        """Whether the release sent behind the commit's batch ran and wrote the end note claiming success."""
        try:
            return bool(_done(self._released))
        except DeployerError:
            return False

    def _close_behind(self, ctx: Context, step: Step) -> None:
        """A run whose last step is its commit releases in the commit's round trip: the release goes right
        behind the commit's batch and the agent runs it only if the whole batch succeeded (the commit
        touched exactly the shipped files). Not under on_failure: rollback, where a failure after the
        commit (a forced stop) still needs the lock to roll back."""
        lock = self._held
        if step.effect != Effect.commits or lock is None or self.playbook.model.on_failure == "rollback":
            return

        def behind(batch: Pending[Any]) -> None:
            # The batch proved HEAD is the run's commit; a note behind a release that went through says the
            # run succeeded: nothing the run does after the reply can fail it on the target.
            assert self._log is not None
            note = self._end_note(ctx, self._log, EndNote(self._log.sha256(), "successful", 0, Phase.succeeded.value),
                                  "HEAD")
            self._released = send_release(lock, ctx.transport, ctx.git_dir, after=batch, note=note)
        ctx.closing = behind

    @staticmethod
    def _drain_prefetched(ctx: Context) -> None:
        """Commands sent ahead for steps that never ran still ran on the target: log them under their step."""
        for name, sent in list(ctx.prefetched.items()):
            ctx.bus.step = name
            for submitted in sent:
                with contextlib.suppress(DeployerError):
                    submitted.result()
        ctx.prefetched.clear()
        ctx.bus.step = None

    def enter(self, ctx: Context, effect: Effect) -> None:
        record = ctx.record
        assert record is not None
        phase = ENTER.get(effect)
        # A check before the commit (a storm to show the symptom) moves nothing: only a commit's is verifying.
        if phase is None or (phase == Phase.verifying and record.state.phase not in PAST_COMMIT):
            return
        first_change = record.state.phase in (Phase.preparing, Phase.locked)
        record.advance(phase, utc_now())
        if first_change:
            self._write_intent(ctx)

    def restore(self, ctx: Context, failure: DeployerError) -> None:
        """Before the commit, after failure: every dest back to its pre-run bytes, owner and mode (from the run
        dir). A restore that fails too says so after the failure that started it."""
        record = ctx.record
        assert record is not None
        if record.state.phase in (Phase.preparing, Phase.locked):
            self._end(record, Phase.failed_restored)
            return
        ctx.bus.step = "restore"
        stop_running(ctx)
        assert ctx.git_before is not None
        try:
            done = restore_files(ctx, record.state.files, ctx.git_before, run_trailer(ctx.run_id), record)
        except DeployerError as exc:
            record.advance(Phase.interrupted, utc_now(), error=str(exc))
            raise RollbackFailed(f"{failure}\nThe restore after it failed: {exc}") from None
        ctx.emit("restore", restored=done.restored, removed=done.removed, temps=done.temps,
                 undid_commit=done.undid_commit, head=ctx.git_before)
        ctx.facts.restored = done.restored + done.removed
        self._end(record, Phase.failed_restored)

    def _after_commit_failure(self, ctx: Context, failure: DeployerError) -> DeployerError:
        """Past the commit: roll back (on_failure: rollback) or say exactly what stays on the target."""
        kind = Interrupted if isinstance(failure, Interrupted) else VerificationFailed
        record = ctx.record
        assert record is not None
        if self.playbook.model.on_failure != "rollback":
            self._end(record, Phase.failed_committed, error=str(failure))
            return kind(f"{failure}\nThe commit {ctx.git_after} stays on the target (on_failure: restore only "
                        f"undoes failures before the commit). {target_state(ctx)}\n"
                        f"To undo it: deployer rollback {ctx.run_id}")
        # The rollback must finish even when a signal caused it; a second signal still forces a stop.
        ctx.cancel = CancelToken()
        stop_running(ctx)
        record.advance(Phase.rolling_back, utc_now(), error=str(failure))
        try:
            assert ctx.git_before is not None
            revert = self.revert(ctx, before=ctx.git_before, dests=ctx.dests, rollback_of=ctx.run_id)
        except DeployerError as exc:
            record.advance(Phase.interrupted, utc_now())
            return RollbackFailed(f"{failure}\nThe rollback failed too: {exc}\n{target_state(ctx)}\n"
                                  f"Finish it with: deployer recover {ctx.run_id} --rollback")
        self._end(record, Phase.rolled_back, rollback_commit=revert)
        restarted = "; services restarted" if any(s.effect == Effect.restarts for s in self.steps) else ""
        return kind(f"{failure}\nRolled back: commit {revert[:12]} restores "
                    f"{', '.join(ctx.dests)} to {str(ctx.git_before)[:12]}{restarted}")

    def revert(self, ctx: Context, *, before: str, dests: list[str], rollback_of: str,
               verify: tuple[Effect, ...] = (Effect.restarts,)) -> str:
        """A commit giving dests their content at `before`; then the playbook's restart (and checks) again."""
        ctx.bus.step = "rollback"
        self._note_log_sha256(ctx)
        anchors = trailers(Deployer_Run=ctx.run_id, Deployer_Rollback_Of=rollback_of, Deployer_Log=log_anchor(ctx))
        ctx.facts.log_sha256 = None
        message = f"Roll back {self.playbook.model.name} (run {rollback_of})\n\n{anchors}\n"
        revert = revert_files(ctx, before, dests, message)
        ctx.emit("rollback", commit=revert, of_run=rollback_of, restores=before, files=dests)
        ctx.facts.rollback_commit = revert
        forward_pids, ctx.facts.pids = ctx.facts.pids, None
        try:
            for step in (s for s in self.steps if s.effect in verify):
                self.run_step(ctx, step, f"rollback:{step.name}")
        finally:  # both restarts stay in the record: the run's own, and the rollback's
            if ctx.facts.pids is not None:
                ctx.facts.rollback_pids = ctx.facts.pids
            ctx.facts.pids = forward_pids
        ctx.bus.step = None
        return revert
