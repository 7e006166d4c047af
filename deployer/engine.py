"""Plans and runs a playbook on one host: preflight, the fail-fast chain, and undo on failure."""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deployer
from deployer import diffs
from deployer.command import Masker
from deployer.config import Host
from deployer.context import CancelToken, Context, EventBus, Listener, LoadedPlaybook
from deployer.errors import ConfigError, DeployerError, Interrupted, RollbackFailed, VerificationFailed
from deployer.lock import DeployLock, LockState, read_state
from deployer.preflight import preflight
from deployer.runlog import RunLogWriter, new_run_id
from deployer.steps import services
from deployer.steps.base import Action, Step
from deployer.steps.git import LOG_SHA256, DiffBounds, git, log_anchor, revert_files, trailers, unchanged_dests
from deployer.transport.base import Transport

Connector = Callable[[EventBus], Transport]


def operator_id() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def release(lock: DeployLock | None, transport: Transport, bus: EventBus) -> str | None:
    """Release the lock and close the connection; never raises, says what it had to leave."""
    left = None
    if lock is not None:
        try:
            lock.release()
            bus.emit("lock_released", path=lock.path)
        except DeployerError as exc:
            bus.emit("lock_release_failed", path=lock.path, error=str(exc))
            left = (f"The deploy lock {lock.path} was left on the target ({exc}); once the target is checked, "
                    f"remove it with: deployer lock release --host {bus.host} --force")
    with contextlib.suppress(Exception):
        transport.close()
    return left


def target_state(ctx: Context) -> str:
    """Where the target stands now, read from it, for a message that must say what was left."""
    try:
        head = ctx.run(git("rev-parse", "HEAD"), timeout=30).out.strip() or "unknown"
        notes = {ctx.git_before: "the commit before the run", ctx.git_after: "this run's commit",
                 ctx.facts.get("rollback_commit"): "the revert commit"}
        parts = [f"Target now: HEAD {head[:12]} ({notes.get(head, 'not made by this run')})"]
        for name in ctx.host.services:
            pid = services.manager_for(ctx, name).pid()
            parts.append(f"{name} {'pid ' + str(pid) if pid else 'not running'}")
    except DeployerError as exc:
        return f"The target's state could not be read: {exc}"
    return ", ".join(parts) + "."


def as_failure(exc: BaseException) -> DeployerError:
    """Every way a run can stop, as a typed failure; a bug in deployer still restores the target."""
    if isinstance(exc, DeployerError):
        return exc
    if isinstance(exc, KeyboardInterrupt):
        return Interrupted("interrupted")
    return DeployerError(f"internal error: {type(exc).__name__}: {exc} (please report this)")


def mask_action(masker: Masker, action: Action) -> Action:
    argv = None if action.argv is None else tuple(masker(part) for part in action.argv)
    return Action(masker(action.what), argv, action.cwd, tuple((k, masker(v)) for k, v in action.env))


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
    bounds: list[str] | None  # None: the playbook bounds nothing; [] within bounds
    steps: list[tuple[str, list[Action]]]
    lock: LockState | None
    dirty: list[str] = field(default_factory=list)


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
    _log: RunLogWriter | None = field(default=None, init=False, repr=False)  # the run's log while it runs

    def new_bus(self) -> EventBus:
        bus = EventBus(Masker(self.host.secrets()), self.host_name)
        bus.listeners.extend(self.listeners)
        return bus

    def context(self, run_id: str, bus: EventBus, transport: Transport) -> Context:
        ctx = Context(run_id=run_id, host_name=self.host_name, host=self.host, transport=transport,
                      playbook=self.playbook, bus=bus, cancel=self.cancel)
        ctx.facts["operator"] = self.operator
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
            # Counted against HEAD, as diff_bounds and the commit count (under --allow-dirty the work tree differs).
            files = [FilePlan(c.dest, bus.masker(diffs.unified(c.dest, head[c.dest], c.new)),
                              diffs.numstat(c.dest, head[c.dest], c.new), c.old is not None) for c in ctx.changes]
            unchanged = unchanged_dests(ctx)
            # git diff lists no file whose bytes are already there; neither does the projection.
            stat = diffs.DiffStat(tuple(f.stat for f in files if f.dest not in unchanged))
            bounds = next((s.judge(stat, unchanged) for s in self.steps if isinstance(s, DiffBounds)), None)
            assert ctx.git_dir is not None and ctx.git_before is not None
            lock = read_state(transport, ctx.git_dir, self.host.lock_ttl_s)
            steps = [(s.name, [mask_action(bus.masker, a) for a in s.plan(ctx)]) for s in self.steps]
            return PlanReport(self.host_name, ctx.repo, ctx.git_before, files, stat, bounds, steps, lock,
                              list(ctx.facts.get("dirty", [])))

    # -- the run ---------------------------------------------------------------------------------------

    def apply(self) -> RunResult:
        self.check_host()

        def body(ctx: Context, log: RunLogWriter) -> None:
            preflight(ctx, allow_dirty=self.allow_dirty)
            log.attach("shipped.diff", ctx.bus.masker("".join(
                diffs.unified(c.dest, c.old, c.new) for c in ctx.changes)).encode())
            ctx.bus.step = None
            ctx.emit("status", status="running")
            self._run_steps(ctx)
        return self.execute(body)

    def execute(self, body: Callable[[Context, RunLogWriter], None], **start: Any) -> RunResult:
        """One run: its log, one connection, the lock, the body, and a run_end whatever happens."""
        run_id = new_run_id()
        log = self._log = RunLogWriter(self.runs_dir, run_id)
        bus = self.new_bus()
        bus.listeners.insert(0, log.write)
        bus.emit("run_start", status="starting", operator=self.operator, version=deployer.__version__,
                 playbook=str(self.playbook.path), playbook_name=self.playbook.model.name,
                 playbook_sha256=hashlib.sha256(self.playbook.raw).hexdigest(),
                 steps=[s.describe() for s in self.steps], on_failure=self.playbook.model.on_failure, **start)
        # The copy is masked like everything else written here; playbook_sha256 names the original.
        log.attach("playbook.yaml", bus.masker(self.playbook.raw.decode("utf-8", "replace")).encode())
        ctx: Context | None = None
        lock: DeployLock | None = None
        left: str | None = None
        status, exit_code, error = "successful", 0, None
        try:
            transport = self.connect(bus)
            try:
                bus.emit("connected", transport=vars(transport.info))
                ctx = self.context(run_id, bus, transport)
                bus.step = "preflight"
                lock = self._lock(ctx)
                body(ctx, log)
            finally:
                # A lost connection fails the release too; that must not replace the body's failure.
                left = release(lock, transport, bus)
            if left:
                raise DeployerError(left)
        except (Exception, KeyboardInterrupt) as exc:
            failure = as_failure(exc)
            status = "canceled" if isinstance(failure, Interrupted) else "failed"
            exit_code, error = failure.exit_code, bus.masker(str(failure))
            if left and left not in error:
                error += "\n" + left
        finally:
            bus.step = None
            commits = {"before": ctx.git_before if ctx else None, "after": ctx.git_after if ctx else None}
            facts = dict(ctx.facts) if ctx else {}
            bus.emit("run_end", status=status, exit_code=exit_code, error=error, git=commits,
                     files=facts.get("files") or (ctx.dests if ctx else []), facts=facts)
            log.close()
            self._log = None
        return RunResult(run_id, log.dir, status, exit_code, error, commits["before"], commits["after"], facts)

    def _lock(self, ctx: Context) -> DeployLock:
        ctx.git_dir = git_dir = ctx.check(git("rev-parse", "--absolute-git-dir"),
                                          f"{ctx.repo} is not a git checkout on the target", timeout=30).out.strip()
        lock = DeployLock(ctx.transport, git_dir, {"run_id": ctx.run_id, "operator": self.operator,
                                                   "pid": os.getpid(), "host": self.host_name}, self.host.lock_ttl_s)
        lock.acquire()
        ctx.emit("lock_acquired", path=lock.path, ttl_s=lock.ttl_s)
        return lock

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
            ctx.facts.pop(LOG_SHA256, None)
        ctx.emit("step_end", status="ok", duration_s=round(time.monotonic() - started, 3), summary=summary)
        return summary

    def _note_log_sha256(self, ctx: Context) -> None:
        if self._log is not None:
            ctx.facts[LOG_SHA256] = self._log.sha256()

    def _run_steps(self, ctx: Context) -> None:
        touched = staged = committed = False
        for step in self.steps:
            touched = touched or step.changes_files
            staged = staged or step.kind == "commit"
            try:
                self.run_step(ctx, step, step.name)
            except DeployerError as failure:
                ctx.bus.step = None
                if not committed:
                    if touched:
                        self._restore(ctx, staged=staged)
                    raise
                raise self._after_commit_failure(ctx, failure) from None
            committed = committed or step.kind == "commit"

    def _restore(self, ctx: Context, *, staged: bool) -> None:
        """Give every target file its pre-run bytes (remove new ones), undo a half-made commit."""
        ctx.bus.step = "restore"
        try:
            head = ctx.run(git("rev-parse", "HEAD"), timeout=30).out.strip()
            if ctx.git_before and head != ctx.git_before:
                self._undo_own_commit(ctx, head)
            if staged:  # the commit step ran `git add`; before that the index was never touched
                ctx.run(git("reset", "-q", "--", *ctx.dests), timeout=60)
            restored, removed = [], []
            for change in ctx.changes:
                if change.old is None:
                    ctx.run(("rm", "-f", "--", change.path), timeout=30)
                    for directory in change.new_dirs:
                        ctx.run(("rmdir", "--", directory), timeout=30)
                    removed.append(change.dest)
                elif ctx.transport.get(change.path) != change.old:
                    ctx.transport.put(change.old, change.path)
                    restored.append(change.dest)
            wrong = [c.dest for c in ctx.changes if ctx.transport.get(c.path) != c.old]
        except DeployerError as exc:
            raise RollbackFailed(f"restoring the target failed: {exc}. The files "
                                 f"{', '.join(ctx.dests)} may hold the new bytes; HEAD should be "
                                 f"{ctx.git_before}") from None
        if wrong:
            raise RollbackFailed(f"after the restore, {', '.join(wrong)} still differ from their pre-run bytes")
        ctx.emit("restore", restored=restored, removed=removed, head=ctx.git_before)
        ctx.facts["restored"] = restored + removed

    def _undo_own_commit(self, ctx: Context, head: str) -> None:
        """The commit step failed after git commit succeeded: drop that commit, and only that one."""
        parent = ctx.run(git("rev-parse", "HEAD~1"), timeout=30).out.strip()
        message = ctx.run(git("log", "-1", "--format=%B", "HEAD"), timeout=30).out
        if parent != ctx.git_before or f"Deployer-Run: {ctx.run_id}" not in message:
            raise RollbackFailed(f"HEAD moved from {ctx.git_before} to {head} during the run, and not by this "
                                 "run's commit; left as it is")
        ctx.check(git("reset", "-q", "--soft", ctx.git_before), "cannot undo the run's commit", timeout=60)

    def _after_commit_failure(self, ctx: Context, failure: DeployerError) -> DeployerError:
        """Past the commit: roll back (on_failure: rollback) or say exactly what stays on the target."""
        kind = Interrupted if isinstance(failure, Interrupted) else VerificationFailed
        if self.playbook.model.on_failure != "rollback":
            return kind(f"{failure}\nThe commit {ctx.git_after} stays on the target (on_failure: restore only "
                        f"undoes failures before the commit). {target_state(ctx)}\n"
                        f"To undo it: deployer rollback {ctx.run_id}")
        # The rollback must finish even when a signal caused it; a second signal still forces a stop.
        ctx.cancel = CancelToken()
        try:
            assert ctx.git_before is not None
            revert = self.revert(ctx, before=ctx.git_before, dests=ctx.dests, rollback_of=ctx.run_id)
        except DeployerError as exc:
            return RollbackFailed(f"{failure}\nThe rollback failed too: {exc}\n{target_state(ctx)}")
        restarted = "; services restarted" if any(s.kind == "co_restart" for s in self.steps) else ""
        return kind(f"{failure}\nRolled back: commit {revert[:12]} restores "
                    f"{', '.join(ctx.dests)} to {str(ctx.git_before)[:12]}{restarted}")

    def revert(self, ctx: Context, *, before: str, dests: list[str], rollback_of: str,
               verify_kinds: tuple[str, ...] = ("co_restart",)) -> str:
        """A commit giving dests their content at `before`; then the playbook's restart (and checks) again."""
        ctx.bus.step = "rollback"
        self._note_log_sha256(ctx)
        anchors = trailers(Deployer_Run=ctx.run_id, Deployer_Rollback_Of=rollback_of, Deployer_Log=log_anchor(ctx))
        ctx.facts.pop(LOG_SHA256, None)
        message = f"Roll back {self.playbook.model.name} (run {rollback_of})\n\n{anchors}\n"
        revert = revert_files(ctx, before, dests, message)
        ctx.emit("rollback", commit=revert, of_run=rollback_of, restores=before, files=dests)
        ctx.facts["rollback_commit"] = revert
        forward_pids = ctx.facts.pop("pids", None)
        try:
            for step in (s for s in self.steps if s.kind in verify_kinds):
                self.run_step(ctx, step, f"rollback:{step.name}")
        finally:  # both restarts stay in the record: the run's own, and the rollback's
            if "pids" in ctx.facts:
                ctx.facts["rollback_pids"] = ctx.facts.pop("pids")
            if forward_pids is not None:
                ctx.facts["pids"] = forward_pids
        ctx.bus.step = None
        return revert
