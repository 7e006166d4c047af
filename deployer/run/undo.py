"""Undo on failure: before the commit, the target's files get their pre-run bytes back (restore); after it,
on_failure decides between a revert commit (rollback) and saying exactly what stays on the target.

The revert is built as actions in one place, `Revert`: the rollback runs them and `plan --rollback` shows
them, so the preview is exact by construction."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from deployer.agent.protocol import ExecResult
from deployer.errors import (
    AnalysisInconclusive,
    ChecksFailed,
    DeployerError,
    Interrupted,
    RollbackFailed,
    VerificationFailed,
)
from deployer.run.ending import Ending
from deployer.run.lease import run_trailer
from deployer.run.restore import restore_files
from deployer.run.standing import target_state
from deployer.runlog import utc_now
from deployer.runstate import PAST_COMMIT, Phase
from deployer.steps.action import Bound
from deployer.steps.base import Action
from deployer.steps.context import NOTHING, Context
from deployer.steps.git import LOG_SHA256, RUN_ID, commit_actions, commit_staged, owner_and_mode_kept, trailers
from deployer.steps.gitops import HEAD, differ_argv, exists_argv, git, names


def kill_running(ctx: Context) -> int:
    """Kill what still runs on the target; how many (0 when the link is gone: the undo itself then fails, with
    its message). Safe from any thread: it records nothing (a forced stop held back during an undo kills from
    a thread of its own, and the run log is the main thread's; the killed commands' own results say so)."""
    with contextlib.suppress(DeployerError):
        return ctx.transport.cancel()
    return 0


def stop_running(ctx: Context) -> None:
    """A step stopped by a second signal may have left its command running on the target: kill it, so the
    undo that follows is not queued behind it."""
    if killed := kill_running(ctx):
        ctx.emit("commands_killed", count=killed)


def restore(ctx: Context, failure: DeployerError, ending: Ending) -> None:
    """Before the commit, after failure: every dest back to its pre-run bytes, owner and mode (from the run
    dir). A restore that fails too says so after the failure that started it."""
    record = ending.record
    if record.state.phase in (Phase.preparing, Phase.locked):
        ending.end(Phase.failed_restored)
        return
    ctx.bus.step = "restore"
    assert ctx.git_before is not None
    with ctx.cancel.undoing():  # a forced stop (a second signal) lets it finish
        stop_running(ctx)
        try:
            done = restore_files(ctx, record.state.files, ctx.git_before, run_trailer(ctx.run_id), record)
        except DeployerError as exc:
            record.advance(Phase.interrupted, utc_now(), error=str(exc))
            raise RollbackFailed(f"{failure}\nThe restore after it failed: {exc}") from None
    ctx.emit("restore", restored=done.restored, removed=done.removed, temps=done.temps,
             undid_commit=done.undid_commit, head=ctx.git_before)
    ctx.facts.restored = done.restored + done.removed
    ending.end(Phase.failed_restored)


@dataclass(frozen=True)
class Past:
    """A host of a run that failed past its commit: its context, how its record ends, and the revert commit of its
    own run (made by its engine). In a unit, a host that already held the fix made no commit: nothing to revert."""
    ctx: Context
    ending: Ending
    revert: Callable[[Context], str]


@contextlib.contextmanager
def rollback_restarts(ctxs: Sequence[Context]) -> Iterator[None]:
    """Around a rollback's restart and checks: both restarts stay in the record, the run's own (facts.pids) and the
    rollback's (facts.rollback_pids)."""
    forward = [(ctx, ctx.facts.pids) for ctx in ctxs]
    for ctx in ctxs:
        ctx.facts.pids = None
    try:
        yield
    finally:
        for ctx, pids in forward:
            if ctx.facts.pids is not None:
                ctx.facts.rollback_pids = ctx.facts.pids
            ctx.facts.pids = pids


def after_commit_failure(hosts: Sequence[Past], failure: DeployerError, *, rollback: bool,
                         again: Callable[[], None], restarts: bool, unit: str | None = None) -> DeployerError:
    """Past the commit, on one host (its run) or on every host of a unit: roll back (on_failure: rollback), or say
    exactly what stays on the targets. A rollback reverts every host that committed, then `again` restarts and checks
    (every host: a unit restarts as one; a check the reverted build fails raises ChecksFailed, and the reverts
    stand). A unit's host that made no commit has nothing reverted and ends failed_restored (its files as they
    were), whatever the others' end."""
    kind = Interrupted if isinstance(failure, Interrupted) else VerificationFailed
    committed = [host for host in hosts if not host.ctx.facts.already_applied]
    said = _Said(failure, [host.ctx for host in committed], unit)
    try:
        # An inconclusive analysis is held for a person to decide, never rolled back on its own: its commit stays.
        if not rollback or isinstance(failure, AnalysisInconclusive):
            for host in committed:
                host.ending.end(Phase.failed_committed, error=str(failure))
            return AnalysisInconclusive(said.kept()) if isinstance(failure, AnalysisInconclusive) else \
                kind(said.kept())
        return _roll_back(hosts, committed, failure, again, said, kind, restarts)
    finally:  # after the rollback's restart, which these hosts took part in
        for host in hosts:
            if host.ctx.facts.already_applied:
                host.ending.end(Phase.failed_restored, error=str(failure))
            host.ctx.bus.step = None


def _roll_back(hosts: Sequence[Past], committed: list[Past], failure: DeployerError, again: Callable[[], None],
               said: _Said, kind: type[DeployerError], restarts: bool) -> DeployerError:
    with contextlib.ExitStack() as finishing:
        for host in hosts:  # even when a signal caused it; a second signal still forces a stop
            host.ctx.cancel = finishing.enter_context(host.ctx.cancel.finishing_first("the rollback"))
            stop_running(host.ctx)
        try:
            for host in committed:
                host.ending.record.advance(Phase.rolling_back, utc_now(), error=str(failure))
                host.revert(host.ctx)
            with rollback_restarts([host.ctx for host in hosts]):
                again()
        except ChecksFailed as exc:  # the reverts stand; the reverted build failed a check of its own
            for host in committed:
                host.ending.end(Phase.rolled_back, rollback_commit=host.ctx.facts.rollback_commit,
                                checks_failed=exc.checks)
            return kind(said.checks_failed(exc))
        except DeployerError as exc:
            for host in committed:
                if host.ending.record.state.phase in PAST_COMMIT:
                    host.ending.record.advance(Phase.interrupted, utc_now())
            return RollbackFailed(said.rollback_failed(exc))
        for host in committed:
            host.ending.end(Phase.rolled_back, rollback_commit=host.ctx.facts.rollback_commit)
        return kind(said.rolled_back(restarts))


@dataclass(frozen=True)
class _Said:
    """What a failure past the commit says it left: of one host's run (its commit, its run id), or of a unit (its
    hosts' runs, each with a run id of its own)."""
    failure: DeployerError
    ctxs: list[Context]  # the hosts that committed
    unit: str | None

    @property
    def where(self) -> str:
        return f"unit {self.unit}: {self.failure}" if self.unit else str(self.failure)

    def kept(self) -> str:
        # Why the commit stays: on_failure: restore, or an inconclusive analysis held whatever on_failure says.
        held = isinstance(self.failure, AnalysisInconclusive)
        why = ("held for a person to decide: inconclusive is never a pass, nor a verdict to roll back on" if held
               else "on_failure: restore" if self.unit else
               "on_failure: restore only undoes failures before the commit")
        if self.unit:
            return (f"{self.where}\nEvery host of the unit keeps its commit ({why}). To undo them: "
                    "deployer rollback RUN_ID for each host's run")
        ctx = self.ctxs[0]
        return (f"{self.where}\nThe commit {ctx.git_after} stays on the target ({why}). {target_state(ctx)}\n"
                f"To undo it: deployer rollback {ctx.run_id}")

    def rolled_back(self, restarts: bool) -> str:
        if self.unit:
            return (f"{self.where}\nRolled back every host of the unit ({', '.join(c.host_name for c in self.ctxs)})"
                    f"{' and restarted it again' if restarts else ''}")
        return f"{self.where}\nRolled back: {self._reverts()}{'; services restarted' if restarts else ''}"

    def checks_failed(self, exc: ChecksFailed) -> str:
        if self.unit:
            return (f"{self.where}\nRolled back every host of the unit, but the reverted build failed its check: "
                    f"{exc}\nThe reverts stand; a rollback again would not change the old build")
        return f"{self.where}\nRolled back: {self._reverts()}, but {exc}"

    def rollback_failed(self, exc: DeployerError) -> str:
        whose, finish = ("The unit's", "RUN_ID --rollback for each host's run") if self.unit else \
            ("The", f"{self.ctxs[0].run_id} --rollback")
        return (f"{self.where}\n{whose} rollback failed too: {exc}\n{'; '.join(target_state(c) for c in self.ctxs)}\n"
                f"Finish it with: deployer recover {finish}")

    def _reverts(self) -> str:
        ctx = self.ctxs[0]
        return (f"commit {str(ctx.facts.rollback_commit)[:12]} restores {', '.join(ctx.dests)} to "
                f"{str(ctx.git_before)[:12]}")


@dataclass(frozen=True)
class Revert:
    """A new commit that gives dests their content at `before` (removing those absent there), as actions.

    Safe to repeat after any partial attempt: only files whose HEAD content differs from `before` are
    touched, and when there are none (an interrupted rollback got that far) HEAD is returned as it is.
    A rollback must be able to finish, so the target's commit hooks never run here."""

    before: str
    dests: tuple[str, ...]
    message: str  # with the placeholders only the run fills: its id and the sha256 of its log so far

    @classmethod
    def of(cls, name: str, before: str, dests: list[str], rollback_of: str) -> Revert:
        anchors = trailers(Deployer_Run=RUN_ID, Deployer_Rollback_Of=rollback_of, Deployer_Log=f"sha256:{LOG_SHA256}")
        return cls(before, tuple(dests), f"Roll back {name} (run {rollback_of})\n\n{anchors}\n")

    def run(self, ctx: Context, bound: Bound, timeout: float = 60.0) -> str:
        """Make the revert commit (or find it made); returns it."""
        return self._walk(ctx, bound, timeout, None)

    def plan(self, ctx: Context) -> list[Action]:
        """What run() would do, from the same walk: its reads run (they decide the rest), its changes are listed."""
        shown: list[Action] = []
        self._walk(ctx, NOTHING, 60.0, shown)
        return shown

    def _walk(self, ctx: Context, bound: Bound, timeout: float, shown: list[Action] | None) -> str:
        repo = ctx.repo

        def read(action: Action) -> ExecResult:
            if shown is not None:
                shown.append(action)
            result: ExecResult = ctx.act(action, timeout=timeout)
            return result
        todo = names(read(Action.run("compare", "the run's files whose HEAD content differs from the start",
                                     differ_argv(self.before, "HEAD", self.dests), repo,
                                     failure="cannot compare HEAD with the run's starting commit")).out)
        if not todo:
            return read(Action.run("head", "nothing to revert: read HEAD", HEAD, repo,
                                   failure="cannot read HEAD")).out.strip()
        existed = [d for d in todo if read(Action.run(f"existed {d}", f"whether {d} existed at the start",
                                                      exists_argv(f"{self.before}:{d}"), repo)).ok]
        absent = [d for d in todo if d not in existed]
        checkout = Action.run("checkout", "give the files their content at the start (owner and mode kept)",
                              git("checkout", self.before, "--", *existed), repo,
                              failure="cannot restore the files from git") if existed else None
        # --ignore-unmatch: an earlier attempt may have removed them already
        remove = Action.run("remove", "remove the files the run added",
                            git("rm", "-q", "-f", "--ignore-unmatch", "--", *absent), repo,
                            failure="cannot remove the run's new files") if absent else None
        if shown is not None:
            shown += [a for a in (checkout, remove) if a is not None]
            shown += commit_actions(ctx, todo, self.message)
            return ""
        if checkout is not None:
            with owner_and_mode_kept(ctx, existed, timeout):
                ctx.act(checkout, timeout=timeout)
        if remove is not None:
            ctx.act(remove, timeout=timeout)
        return commit_staged(ctx, todo, self.message, timeout, bound=bound)
